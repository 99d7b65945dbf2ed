/*
 * The comm's side of the executor (exec_plan.c): the schedule key of a
 * call on this comm, the tuner's choice of algorithm and chunk, the tag
 * every message of a call carries (what all ranks must have called), and
 * running a call on the comm's executor context with the comm's error
 * state around it.
 */
#ifndef BRAID_EXEC_PLAN_H_
#define BRAID_EXEC_PLAN_H_

#include <stddef.h>

#include "engine/executor.h"
#include "nccl.h"

struct ncclComm;

/* exec_ctx_key on the comm's context. */
void exec_key(const struct ncclComm* comm, const struct exec_args* args, struct sched_key* key);
/* Bytes of the send and the receive buffer a call touches on each rank of
 * a comm of nranks. */
void exec_extents(const struct exec_args* args, int nranks, size_t* send, size_t* recv);
/* Let the tuner choose the algorithm and chunk of a call; fills `key` with
 * the schedule it will run. */
void exec_plan(struct ncclComm* comm, struct exec_args* args, struct sched_key* key);

/* The tag every message of a planned call carries (exec_tag.c), and the
 * WARN naming both calls when a peer's message carried another: the first
 * such peer's connection (report), or `peer`'s tag `theirs` (warn). */
void exec_tag_make(const struct ncclComm* comm, const struct exec_args* args,
                   struct transport_tag* out);
void exec_tag_report(const struct ncclComm* comm, const struct transport_tag* mine);
void exec_tag_warn(const struct ncclComm* comm, const struct transport_tag* mine, int peer,
                   const struct transport_tag* theirs);

/* Run a planned call on the comm's context: the comm's error state is
 * checked first, and an error puts the comm in its error state. */
ncclResult_t exec_comm_start(struct ncclComm* comm, const struct exec_args* args);
ncclResult_t exec_comm_progress(struct ncclComm* comm, int* done, int* progressed);

#endif /* BRAID_EXEC_PLAN_H_ */
