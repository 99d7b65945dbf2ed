/*
 * A reduction's plan: torch's dtype and ReduceOp as Braid's type and op,
 * from two tables (a dtype's Braid type and kind; an op's Braid op and the
 * kinds it refuses), and how the plan is carried out: widened int16,
 * complex as pairs of reals, PreMulSum's factor, bitwise ops folded here.
 */
#include "braid_ops.hpp"

#include <c10/util/Exception.h>

#include <algorithm>

namespace braid_torch {
namespace {

/* what a dtype is, for the ops' rules */
enum Kind : unsigned { kInt = 1, kBool = 2, kReal = 4, kComplex = 8 };

struct DtypeRow {
  at::ScalarType st;
  ncclDataType_t type;
  unsigned kind;
  at::ScalarType wide; /* reduced in this dtype instead, or Undefined */
};

constexpr at::ScalarType kSame = at::ScalarType::Undefined;

/* No 16-bit integers in NCCL: int16 and uint16 are reduced as int32, whose
 * wrap-around agrees with theirs modulo 2^16 for every op. Complex numbers
 * are pairs of reals. */
const DtypeRow kDtypes[] = {
    {at::kChar, ncclInt8, kInt, kSame},
    {at::kByte, ncclUint8, kInt, kSame},
    {at::kBool, ncclUint8, kBool, kSame},
    {at::kShort, ncclInt32, kInt, at::kInt},
    {at::kUInt16, ncclInt32, kInt, at::kInt},
    {at::kInt, ncclInt32, kInt, kSame},
    {at::kUInt32, ncclUint32, kInt, kSame},
    {at::kLong, ncclInt64, kInt, kSame},
    {at::kUInt64, ncclUint64, kInt, kSame},
    {at::kHalf, ncclFloat16, kReal, kSame},
    {at::kBFloat16, ncclBfloat16, kReal, kSame},
    {at::kFloat, ncclFloat32, kReal, kSame},
    {at::kDouble, ncclFloat64, kReal, kSame},
    {at::kFloat8_e4m3fn, ncclFloat8e4m3, kReal, kSame},
    {at::kFloat8_e5m2, ncclFloat8e5m2, kReal, kSame},
    {at::kComplexFloat, ncclFloat32, kComplex, kSame},
    {at::kComplexDouble, ncclFloat64, kComplex, kSame},
};

constexpr int kFold = -1; /* all-gathered and folded here: NCCL has no bitwise ops */

struct OpRow {
  int op;           /* c10d::ReduceOp::RedOpType */
  int on_numbers;   /* an ncclRedOp_t, or kFold */
  int on_bool;      /* the same on booleans (a sum of booleans is a logical or) */
  unsigned refused; /* the kinds it does not take */
  const char* why;  /* and why */
};

using R = c10d::ReduceOp;
const char* const kNotBits = "bitwise operations need integer or bool tensors";
const char* const kUnordered = "complex numbers are not ordered";

const OpRow kOps[] = {
    {R::SUM, ncclSum, ncclMax, 0, nullptr},
    {R::AVG, ncclAvg, ncclAvg, kBool, "an average of booleans is not a boolean"},
    {R::PRODUCT, ncclProd, ncclMin, kComplex, "complex products do not reduce element-wise"},
    {R::MIN, ncclMin, ncclMin, kComplex, kUnordered},
    {R::MAX, ncclMax, ncclMax, kComplex, kUnordered},
    {R::BAND, kFold, ncclMin, kReal | kComplex, kNotBits},
    {R::BOR, kFold, ncclMax, kReal | kComplex, kNotBits},
    {R::BXOR, kFold, kFold, kReal | kComplex, kNotBits},
    {R::PREMUL_SUM, ncclSum, ncclSum, kBool, "a scaled sum of booleans is not a boolean"},
};

const DtypeRow& dtype_row(const char* op, at::ScalarType st) {
  const DtypeRow* row = nullptr;
  for (const DtypeRow& d : kDtypes)
    if (d.st == st) row = &d;
  TORCH_CHECK(row != nullptr, "braid: ", op, " cannot reduce ", st,
              " tensors: Braid reduces int8, uint8, int16, uint16, int32, uint32, int64, "
              "uint64, bool, float16, bfloat16, float32, float64, float8_e4m3fn and "
              "float8_e5m2 (it moves any dtype where nothing is reduced)");
  return *row;
}

const OpRow& op_row(const char* op, at::ScalarType st, const c10d::ReduceOp& rop) {
  const OpRow* row = nullptr;
  for (const OpRow& o : kOps)
    if (o.op == rop.op_) row = &o;
  TORCH_CHECK(row != nullptr, "braid: ", op, " does not support ", op_name(rop), " on ", st,
              " tensors: unknown reduction");
  return *row;
}

/* PreMulSum's factor, from its supplement */
double premul_factor(const char* op, const c10d::ReduceOp& rop) {
  auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
  TORCH_CHECK(s != nullptr, "braid: ", op, ": PREMUL_SUM without its factor");
  return s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
}

}  // namespace

std::string op_name(const c10d::ReduceOp& r) {
  static const char* names[] = {"SUM",  "AVG", "PRODUCT", "MIN",        "MAX",
                                "BAND", "BOR", "BXOR",    "PREMUL_SUM", "UNUSED"};
  return std::string("ReduceOp.") + names[std::min<int>(r.op_, 9)];
}

Red red_plan(const char* op, at::ScalarType st, const c10d::ReduceOp& rop) {
  const DtypeRow& d = dtype_row(op, st);
  const OpRow& o = op_row(op, st, rop);
  TORCH_CHECK(!(o.refused & d.kind), "braid: ", op, " does not support ", op_name(rop), " on ", st,
              " tensors: ", o.why);
  Red r;
  r.type = d.type;
  r.wide = d.wide;
  int how = d.kind == kBool ? o.on_bool : o.on_numbers;
  if (how == kFold)
    r.bitwise = o.op;
  else
    r.op = (ncclRedOp_t)how;
  if (o.op == R::PREMUL_SUM) {
    r.factor = premul_factor(op, rop);
    r.premul = true;
  }
  return r;
}

at::ScalarType reduced_type(at::ScalarType st, const Red& r) {
  if (r.wide != at::ScalarType::Undefined) return r.wide;
  if (st == at::kComplexFloat) return at::kFloat;
  if (st == at::kComplexDouble) return at::kDouble;
  return st;
}

/* the number of `r.type` elements in t's bytes */
size_t red_count(const at::Tensor& t, const Red& r) {
  return (t.is_complex() ? 2 : 1) * (size_t)t.numel();
}

/* Run `call` with the op `r` names: a PreMulSum is made for the call and
 * dropped once it is enqueued (NCCL's rule: the enqueued call keeps it). */
ncclResult_t with_op(const Red& r, at::ScalarType st, ncclComm_t comm,
                     const std::function<ncclResult_t(ncclRedOp_t)>& call) {
  if (!r.premul) return call(r.op);
  at::Tensor scalar = at::scalar_tensor(r.factor, at::TensorOptions().dtype(st));
  ncclRedOp_t op;
  ncclResult_t res =
      ncclRedOpCreatePreMulSum(&op, scalar.data_ptr(), r.type, ncclScalarHostImmediate, comm);
  if (res != ncclSuccess) return res;
  res = call(op);
  ncclRedOpDestroy(op, comm);
  return res;
}

/* A reduction's input/output block: widened (int16) or staged (strided). */
Block red_block(const at::Tensor& t, const Red& r, Call& c, bool in, bool out) {
  if (r.wide == at::ScalarType::Undefined) {
    Block b = block_of(t, c, in, out);
    if (b.t.is_complex()) b.t = at::view_as_real(b.t);
    return b;
  }
  at::Tensor w = at::empty(t.sizes(), t.options().dtype(r.wide));
  at::Tensor user = t;
  if (in) add_pre(c, [w, user]() mutable { w.copy_(user); });
  if (out) add_post(c, [w, user]() mutable { user.copy_(w); });
  return {w, true};
}

/* Bitwise and/or/xor over ranks: all-gather every rank's tensor, fold. */
Call bitwise_call(const at::Tensor& t, const Red& r, int nranks, std::vector<at::Tensor>& keep) {
  Call c;
  Block in = block_of(t, c, true, false);
  at::Tensor all = at::empty({(int64_t)nranks, t.numel()}, t.options());
  at::Tensor user = t;
  void* src = in.t.data_ptr();
  void* dst = all.data_ptr();
  size_t n = nbytes(t);
  int which = r.bitwise;
  c.issue = [src, dst, n](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(src, dst, n, ncclUint8, comm, s);
  };
  add_post(c, [all, user, which]() mutable {
    /* the bits, as the signed type of their width: torch before 2.5 has no
     * bitwise kernels for uint16/32/64, and the bits come out the same */
    at::ScalarType st = all.scalar_type();
    at::ScalarType as = st == at::kUInt16   ? at::kShort
                        : st == at::kUInt32 ? at::kInt
                        : st == at::kUInt64 ? at::kLong
                                            : st;
    at::Tensor bits = all.view(as);
    at::Tensor acc = bits[0].clone();
    for (int64_t i = 1; i < bits.size(0); i++) {
      if (which == c10d::ReduceOp::BAND)
        acc.bitwise_and_(bits[i]);
      else if (which == c10d::ReduceOp::BOR)
        acc.bitwise_or_(bits[i]);
      else
        acc.bitwise_xor_(bits[i]);
    }
    user.copy_(acc.view(st).view(user.sizes()));
  });
  keep.push_back(in.t);
  keep.push_back(all);
  return c;
}

}  // namespace braid_torch
