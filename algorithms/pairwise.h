/*
 * Pairwise (pairwise.c): reductions in the canonical order, the one order
 * the deterministic mode promises (docs/determinism.md). Over ranks
 * 0..n-1, the value of an aligned block of 2^(l+1) ranks is (its lower
 * half) op (its upper half), a half that holds no rank leaving the other
 * as it is; an element's result is the value of the block of all n ranks.
 * The order depends on n only, never on the element's place in the
 * buffer, the buffer's size, the chunk or where the ranks run. Where the
 * ranks run decides only which rank computes a block's value: on one node
 * of 2^k ranks bound inside caches, the layout's pair_xor re-pairs the
 * levels above 0 (sched_topo_place), the tree staying the same.
 */
#ifndef BRAID_PAIRWISE_H_
#define BRAID_PAIRWISE_H_

#include <stddef.h>

#include "schedule.h"

/* All-reduce: whole-buffer exchanges at distances 1, 2, 4... for small
 * buffers over a power-of-two count of ranks (pairwise_uses_doubling),
 * else recursive halving at distances 1, 2, 4... then an all-gather. */
ncclResult_t pairwise_schedule_allreduce(struct schedule* s, const struct sched_key* key);
/* Each rank's block reduced in the canonical order, each tree node
 * computed by a rank of that node, partials passed on in slots. */
ncclResult_t pairwise_schedule_reducescatter(struct schedule* s, const struct sched_key* key);
/* The reduce-scatter's tree, every slice's result sent to the root. */
ncclResult_t pairwise_schedule_reduce(struct schedule* s, const struct sched_key* key);

/* Ranks `key->rank` exchanges data with (a symmetric relation); returns
 * how many were written to `peers` (at most `max`). */
int pairwise_peers(const struct sched_key* key, int* peers, int max);

/* 1 when an all-reduce of count x elem_size bytes over nranks runs as
 * whole-buffer exchanges (log2 n rounds) rather than reduce-scatter and
 * all-gather (2 log2 n rounds, each rank moving 2(n-1)/n of the buffer). */
int pairwise_uses_doubling(size_t count, size_t elem_size, int nranks);

/* Bytes per segment of an all-reduce across nodes (its segments run as a
 * pipeline): a quarter of slices_per_step chunks, at least one byte. */
size_t pairwise_segment_bytes(size_t chunk_bytes, int slices_per_step);

/* Rounds of messages one pairwise call makes: ceil(log2 n) levels. */
int pairwise_levels(int nranks);

#endif /* BRAID_PAIRWISE_H_ */
