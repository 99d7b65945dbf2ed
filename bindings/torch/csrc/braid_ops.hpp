/*
 * What the op files of backend "braid" share (not part of its interface):
 * the checks of a torch op's tensors, staging a tensor that is not one
 * dense block, and a reduction's plan: torch's dtype and ReduceOp as
 * Braid's type and op (braid_tables.cpp).
 */
#pragma once

#include "braid_backend.hpp"

namespace braid_torch {

using Ms = std::chrono::milliseconds;

/* ---- checks (braid_backend.cpp) ---- */

[[noreturn]] void refuse(const std::string& op, ncclResult_t res);
void check_tensor(const char* op, const at::Tensor& t);
at::Tensor& single(const char* op, std::vector<at::Tensor>& ts);
size_t nbytes(const at::Tensor& t);

/* ---- staging (braid_collectives.cpp) ---- */

/* A tensor's bytes as one block: itself when dense, else a staging copy
 * that `pre` fills (inputs) and/or `post` copies back (outputs). */
struct Block {
  at::Tensor t;
  bool staged = false;
};

Block block_of(const at::Tensor& t, Call& c, bool in, bool out);
void add_pre(Call& c, std::function<void()> f);
void add_post(Call& c, std::function<void()> f);
/* split sizes of an all-to-all: the rows each rank sends or gets */
std::vector<int64_t> splits_of(const char* op, const std::vector<int64_t>& given,
                               const at::Tensor& t, int n);

/* ---- reductions (braid_tables.cpp) ---- */

struct Red {
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  at::ScalarType wide = at::ScalarType::Undefined; /* reduce in this type (int16, uint16) */
  bool premul = false;
  double factor = 1.0;
  int bitwise = -1; /* ReduceOp BAND/BOR/BXOR: all-gathered, folded here */
};

std::string op_name(const c10d::ReduceOp& r);
/* How `rop` on `st` tensors runs, or a TORCH_CHECK naming why it cannot. */
Red red_plan(const char* op, at::ScalarType st, const c10d::ReduceOp& rop);
/* the dtype Braid reduces in */
at::ScalarType reduced_type(at::ScalarType st, const Red& r);
/* the number of `r.type` elements in t's bytes */
size_t red_count(const at::Tensor& t, const Red& r);
/* Run `call` with the op `r` names (a PreMulSum made for the call). */
ncclResult_t with_op(const Red& r, at::ScalarType st, ncclComm_t comm,
                     const std::function<ncclResult_t(ncclRedOp_t)>& call);
/* A reduction's input/output block: widened (int16) or staged (strided). */
Block red_block(const at::Tensor& t, const Red& r, Call& c, bool in, bool out);
/* Bitwise and/or/xor over ranks: all-gather every rank's tensor, fold. */
Call bitwise_call(const at::Tensor& t, const Red& r, int nranks, std::vector<at::Tensor>& keep);

}  // namespace braid_torch
