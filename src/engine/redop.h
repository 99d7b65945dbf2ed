/*
 * Reduction operators (redop.c): NCCL's built-in ones and the comm's
 * PreMulSum ops, in the executor's form (struct kern_redop in exec_args).
 */
#ifndef BRAID_REDOP_H_
#define BRAID_REDOP_H_

#include "engine/executor.h"
#include "nccl.h"

struct ncclComm;

/* A built-in op (op < ncclNumOps) in the executor's form on `nranks` ranks. */
void redop_builtin(ncclRedOp_t op, ncclDataType_t type, int nranks, struct exec_args* args);
/* Turn a user op into the executor's form; ncclInvalidArgument if unknown. */
ncclResult_t redop_resolve(struct ncclComm* comm, ncclRedOp_t op, ncclDataType_t type,
                           const char* fn, struct exec_args* args);
void redop_free_all(struct ncclComm* comm);
/* A PreMulSum scalar in device memory (args->scalar_src), read into
 * args->redop.scalar when the call starts, in its stream's order: a device
 * call staged it, so it is host memory here. Nothing to do without one. */
ncclResult_t redop_scalar_read(struct exec_args* args);

#endif /* BRAID_REDOP_H_ */
