/*
 * Reduction operators: the built-in ops map onto kernel ops (avg is a sum
 * divided at the end); PreMulSum ops are per-comm table entries numbered
 * from ncclNumOps, with their scalar read at creation or at each call.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "kernels.h"
#include "engine/mem.h"
#include "engine/redop.h"

/* Find a free table slot, growing the table when full (creation time only). */
static ncclResult_t redop_slot(struct ncclComm* comm, int* idx) {
  for (int i = 0; i < comm->nredops; i++)
    if (!comm->redops[i].in_use) return (*idx = i), ncclSuccess;
  int n = comm->nredops ? 2 * comm->nredops : 8;
  if (n > ncclMaxRedOp - ncclNumOps) {
    WARN("ncclRedOpCreatePreMulSum : too many operators");
    return ncclInvalidUsage;
  }
  ncclResult_t res = braid_realloc(&comm->redops, (size_t)n, sizeof(*comm->redops));
  if (res != ncclSuccess) return res;
  memset(comm->redops + comm->nredops, 0, (size_t)(n - comm->nredops) * sizeof(*comm->redops));
  *idx = comm->nredops;
  comm->nredops = n;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclRedOpCreatePreMulSum, ncclRedOp_t* op, void* scalar,
         ncclDataType_t datatype, ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  int idx;
  CHECK(comm_check(comm, "ncclRedOpCreatePreMulSum"));
  CHECK(comm_check_type(datatype, "ncclRedOpCreatePreMulSum"));
  if (op == NULL) FAIL(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : op is NULL");
  if (scalar == NULL) FAIL(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : scalar is NULL");
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    FAIL(ncclInvalidArgument, "ncclRedOpCreatePreMulSum : invalid residence %d", (int)residence);
  CHECK(redop_slot(comm, &idx));
  struct comm_redop* r = &comm->redops[idx];
  r->in_use = 1;
  r->type = datatype;
  r->residence = residence;
  r->scalar = 0;
  r->scalar_ptr = scalar;
  if (residence == ncclScalarHostImmediate)
    CHECK(mem_copy(&r->scalar, scalar, kern_type_size(datatype)));
  *op = (ncclRedOp_t)(ncclNumOps + idx);
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclRedOpDestroy, ncclRedOp_t op, ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check(comm, "ncclRedOpDestroy"));
  int idx = (int)op - ncclNumOps;
  if ((int)op < ncclNumOps)
    FAIL(ncclInvalidArgument, "ncclRedOpDestroy : op %d is built in, not destroyable", (int)op);
  if (idx >= comm->nredops || !comm->redops[idx].in_use)
    FAIL(ncclInvalidArgument, "ncclRedOpDestroy : op %d was not created on this comm", (int)op);
  comm->redops[idx].in_use = 0;
fail:
  return res;
}

void redop_builtin(ncclRedOp_t op, ncclDataType_t type, int nranks, struct exec_args* a) {
  static const enum kern_op builtin[] = {KERN_SUM, KERN_PROD, KERN_MAX, KERN_MIN, KERN_SUM};
  memset(&a->redop, 0, sizeof(a->redop));
  a->redop.type = type;
  a->redop.op = builtin[op];
  a->pre = a->post = 0;
  if (op == ncclAvg && nranks > 1) {
    a->redop.postdiv = (uint32_t)nranks;
    a->post = KERN_POST;
  }
}

ncclResult_t redop_resolve(struct ncclComm* comm, ncclRedOp_t op, ncclDataType_t type,
                           const char* fn, struct exec_args* a) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check_type(type, fn));
  if ((int)op >= 0 && op < ncclNumOps) {
    redop_builtin(op, type, comm->nranks, a);
    return ncclSuccess;
  }
  memset(&a->redop, 0, sizeof(a->redop));
  a->redop.type = type;
  a->pre = a->post = 0;
  int idx = (int)op - ncclNumOps;
  if ((int)op < 0 || idx >= comm->nredops || !comm->redops[idx].in_use)
    FAIL(ncclInvalidArgument,
         "%s : invalid reduction op %d (not built in, not created on this comm)", fn, (int)op);
  const struct comm_redop* r = &comm->redops[idx];
  if (r->type != type)
    FAIL(ncclInvalidArgument, "PreMulSum op %d was created for type %d, used with type %d", (int)op,
         (int)r->type, (int)type);
  a->redop.op = KERN_SUM;
  a->redop.scalar = r->scalar;
  /* read when the call starts, in its stream's order: the user may change it */
  a->scalar_src = r->residence == ncclScalarDevice ? r->scalar_ptr : NULL;
  a->pre = KERN_PRE;
fail:
  return res;
}

ncclResult_t redop_scalar_read(struct exec_args* a) {
  if (!a->scalar_src) return ncclSuccess;
  return mem_copy(&a->redop.scalar, a->scalar_src, kern_type_size(a->type));
}

void redop_free_all(struct ncclComm* comm) {
  free(comm->redops);
  comm->redops = NULL;
  comm->nredops = 0;
}
