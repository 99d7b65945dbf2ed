/*
 * Groups: ncclGroupStart/End nest per thread; collectives issued inside
 * are queued and run together at the outermost ncclGroupEnd, and so are
 * deferred jobs such as communicator inits.
 */
#ifndef BRAID_GROUP_H_
#define BRAID_GROUP_H_

#include "nccl.h"

struct exec_args;
struct ncclComm;
struct work_op;

int group_depth(void);
/* Run `fn(arg)` on its own thread at the outermost ncclGroupEnd, all jobs
 * concurrently; `fn` returns its ncclResult_t and owns `arg`. */
ncclResult_t group_add_job(ncclResult_t (*fn)(void*), void* arg);
/* Queue one operation (run it now outside a group). */
ncclResult_t group_enqueue_op(const struct work_op* op, cudaStream_t stream);
/* Queue a collective of `comm` with these arguments: group_enqueue_op of
 * a WORK_COLL op. */
ncclResult_t group_enqueue(struct ncclComm* comm, const struct exec_args* args,
                           cudaStream_t stream);
/* Remember the first error of a call made inside the group. */
void group_record_error(ncclResult_t err);

#endif /* BRAID_GROUP_H_ */
