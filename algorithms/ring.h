/*
 * Ring phases shared by the flat ring and the hierarchical algorithms: a
 * ring over any list of members, each owning one block of the buffers.
 */
#ifndef BRAID_RING_H_
#define BRAID_RING_H_

#include "schedule.h"

/* Where block j lives in the input and the output, and how long it is. */
struct ring_block {
  size_t xoff, yoff, len;
};

typedef struct ring_block (*ring_block_fn)(const void* ctx, int j);

/* One ring: n members, this rank at position pos, its neighbours (ranks),
 * the blocks, and how slices are cut (elements per slice; per block per
 * call of a phase). With `from_out` the data to reduce is already in Y
 * (an earlier phase left it there): reductions read Y, sends send Y, and
 * the op's pre-multiplier is not applied again. `post` says whether this
 * ring produces final values (then the op's post-divide applies). */
struct ring {
  int n, pos, prev, next;
  ring_block_fn block;
  const void* ctx;
  size_t chunk, span;
  int from_out;
  int post;
};

/* Reduce-scatter: block `last` (a position, taken modulo n) ends fully
 * reduced here, produced by `final` (recvReduceCopy or ...CopySend).
 * Covers elements [from, from + span) of every block. */
ncclResult_t ring_reduce_phase(struct schedule* s, const struct ring* g, int last,
                               enum sched_prim final, size_t from);
/* The reduce phase without its final step (for callers that fold the
 * final partial into something else). */
ncclResult_t ring_reduce_partial(struct schedule* s, const struct ring* g, int last, size_t from);
/* All-gather: block `first` is final here and already sent on (by the
 * reduce phase's recvReduceCopySend, or by ring_send_own); the others
 * arrive in turn. */
ncclResult_t ring_gather_phase(struct schedule* s, const struct ring* g, int first, size_t from);
/* One hop of a ring all-reduce whose block `last` ends reduced here: hop 0
 * sends, hops 1..n-1 reduce (the last one makes the block final), hops
 * n..2n-2 gather. Hops 0..2n-2 in order are ring_reduce_phase with
 * recvReduceCopySend and then ring_gather_phase; a caller emits them one at
 * a time to interleave other work between a ring's hops. */
ncclResult_t ring_allreduce_hop(struct schedule* s, const struct ring* g, int last, int hop,
                                size_t from);
/* Send this rank's own (final) block to start an all-gather. */
ncclResult_t ring_send_own(struct schedule* s, const struct ring* g, size_t from);

/* Ring algorithms around rank order (ring.c): all-reduce as reduce-scatter
 * then all-gather, each segment cut into slices of at most chunk_bytes;
 * broadcast and reduce as a pipelined chain from/to the root. */
ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* key);
ncclResult_t ring_schedule_allgather(struct schedule* s, const struct sched_key* key);
ncclResult_t ring_schedule_reducescatter(struct schedule* s, const struct sched_key* key);
ncclResult_t chain_schedule_broadcast(struct schedule* s, const struct sched_key* key);
ncclResult_t chain_schedule_reduce(struct schedule* s, const struct sched_key* key);

#endif /* BRAID_RING_H_ */
