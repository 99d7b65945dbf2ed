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

/* Where ranks are bound inside caches (`l2`, `l3`: per rank, equal = one
 * cache, -1: bound inside none; NULL: none known): each node's ranks in
 * `order` (and their local_of, pos_of) grouped by cache, L3 then L2, rank
 * order within; Pairwise's partners, sched_topo.pair_xor and pair_shared
 * (by rank: the canonical tree does not move). */
void sched_topo_place(struct sched_topo* t, const int* l2, const int* l3);

/* Ranks on `node`. */
int sched_topo_node_size(const struct sched_topo* t, int node);

#endif /* BRAID_LAYOUT_H_ */
