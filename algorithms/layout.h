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

/* Pairwise's partners where ranks are bound inside caches (`l2`, `l3`:
 * per rank, equal = one cache, -1: bound inside none; NULL: none known):
 * sched_topo.pair_xor and pair_shared. */
void sched_topo_place(struct sched_topo* t, const int* l2, const int* l3);

/* Ranks on `node`. */
int sched_topo_node_size(const struct sched_topo* t, int node);

#endif /* BRAID_LAYOUT_H_ */
