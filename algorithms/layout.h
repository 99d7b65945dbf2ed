/*
 * The comm's layout (layout.c): which ranks share a node, in what order.
 */
#ifndef BRAID_LAYOUT_H_
#define BRAID_LAYOUT_H_

#include <stdint.h>

#include "nccl.h"
#include "schedule.h"

/* Group ranks into nodes by `host` (nranks keys; equal key = same node). */
ncclResult_t sched_topo_init(struct sched_topo* t, int nranks, const uint64_t* host);
void sched_topo_free(struct sched_topo* t);

/* Pairwise's partners where ranks are bound inside caches (`cache`: per
 * rank, equal = one cache, -1: bound inside none): sched_topo.pair_xor. */
void sched_topo_place(struct sched_topo* t, const int* cache);

/* Ranks on `node`. */
int sched_topo_node_size(const struct sched_topo* t, int node);

#endif /* BRAID_LAYOUT_H_ */
