/*
 * Recursive doubling (recursive_doubling.c): the small-message all-reduce.
 */
#ifndef BRAID_RECURSIVE_DOUBLING_H_
#define BRAID_RECURSIVE_DOUBLING_H_

#include <stddef.h>

#include "schedule.h"

/* Recursive doubling all-reduce: log2 rounds of whole-buffer exchanges
 * between partners, non-power-of-two ranks folded in first and served last.
 * Few hops: the small-message algorithm. */
ncclResult_t rd_schedule_allreduce(struct schedule* s, const struct sched_key* key);

/* Peers rank `rank` sends to and receives from under recursive doubling
 * (at most 2 + log2(nranks)); returns how many were written to `peers`. */
int rd_peers(int rank, int nranks, int* peers, int max);
/* Recursive doubling all-reduce halves (Rabenseifner) from this many bytes
 * on, when at least 4 ranks are in its power-of-two core. */
#define RD_HALVING_MIN_BYTES ((size_t)32 << 10)
int rd_uses_halving(size_t count, size_t elem_size, int nranks);

#endif /* BRAID_RECURSIVE_DOUBLING_H_ */
