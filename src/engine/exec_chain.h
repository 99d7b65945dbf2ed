/*
 * Chains folded in one task (exec_chain.c). A reduce-carry step combines
 * what it received with its local operand into a carry that the next step
 * of its register reads; on host memory the executor may leave that
 * combine undone, holding what it would read, and let the step that reads
 * the carry compute the whole chain in one task (kern_task's fold, with
 * swap bits where the received data comes first). The partial is then
 * never written to memory and read back: the deterministic mode's trees
 * combine each block along chains of up to log2(n) steps. The messages
 * are the same either way, so a rank decides alone.
 */
#ifndef BRAID_EXEC_CHAIN_H_
#define BRAID_EXEC_CHAIN_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "schedule.h"

struct exec_ctx;
struct exec_rec;

/* What a chain, or the step that took it over, keeps from being reused:
 * staging slots, and receives left where they arrived (transport.h,
 * lend_max), by receiving peer and message number. */
struct exec_held {
  int nslots, nlent;
  int slots[KERN_TASK_MAX_SRCS];
  int lent_peer[KERN_TASK_MAX_SRCS];
  uint64_t lent_seq[KERN_TASK_MAX_SRCS];
};

/* A carry register's combines left undone: the fold of srcs[0 .. nsrcs-1]
 * (as kern_task: pre and swap bits). nsrcs 0: none. */
struct exec_chain {
  int nsrcs;
  unsigned pre, swap;
  const void* srcs[KERN_TASK_MAX_SRCS];
  struct exec_held held;
};

/* Whether step st (the next to compute) leaves its combine undone: a
 * reduce-carry on host memory whose register's chain has room and whose
 * reader is posted already (so that what the chain holds goes back once
 * steps already posted are computed). */
int chain_defers(const struct exec_ctx* ex, const struct sched_step* st);
/* Leave it undone: its local operand (pre-multiplied per `pre`) starts
 * the chain if it is empty, and what it received joins it; the chain
 * takes over the step's receive and the carry slot it read. */
void chain_defer(struct exec_ctx* ex, const struct sched_step* st, struct exec_rec* rec,
                 const void* local, unsigned pre, const void* received);
/* Whether st reads a chain: a reduction of the carry whose register holds
 * one. Then chain_fold makes its pair task `t` (received op carry, or
 * carry op received) the fold of the chain and what it received. */
int chain_read_by(const struct exec_ctx* ex, const struct sched_step* st);
void chain_fold(const struct exec_ctx* ex, const struct sched_step* st, struct kern_task* t);
/* The step whose task folds st's register's chain takes what it holds. */
void chain_take(struct exec_ctx* ex, const struct sched_step* st, struct exec_held* into);
/* Give back what `h` holds (after the task that read it is done). */
ncclResult_t held_release(struct exec_ctx* ex, struct exec_held* h);
/* Whether receiving on `peer` now would pass the lending span behind a
 * receive some chain or step holds. */
int held_span_full(const struct exec_ctx* ex, int peer);
/* Drop every chain and carry (the start of a piece: after a failed one
 * they may hold slots), giving their slots back. */
void chains_reset(struct exec_ctx* ex);

#endif /* BRAID_EXEC_CHAIN_H_ */
