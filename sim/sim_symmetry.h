/*
 * Whether node 0's ranks may stand for every node's (sim_symmetry.c):
 * each node's schedules are node 0's with every peer moved by the same
 * map of nodes, step for step, the same primitives on the same bytes
 * (within an element: blocks that do not divide evenly differ by one).
 * Two maps serve Braid's algorithms: a shift by whole nodes (rings,
 * chains, Hier) and, over a power of two of nodes, an exclusive or of
 * node numbers (recursive doubling, Pairwise). Either permutes nodes
 * without changing the fabric; with every node alike and all starting at
 * once, each node's timing is then node 0's and symmetric play is exact
 * (a test plays both ways).
 */
#ifndef BRAID_SIM_SYMMETRY_H_
#define BRAID_SIM_SYMMETRY_H_

#include <stddef.h>

#include "sim_cluster.h"

struct sim_step;

enum sim_map_kind { SIM_MAP_NONE = 0, SIM_MAP_SHIFT, SIM_MAP_XOR };

/* Rank r with its node moved by `node` (shift: added modulo the nodes;
 * xor: exclusive or); negative r (no peer) as it is. */
int sim_map_rank(const struct sim_cluster* c, enum sim_map_kind kind, int r, int node);
/* The map that takes node `node` to node 0 (a shift's inverse). */
int sim_map_home(const struct sim_cluster* c, enum sim_map_kind kind, int node);

/* Whether `other`, the schedule of node 0's rank moved to `node`, is
 * `base` moved so; `elem` bytes of slack per step. */
int sim_is_map(const struct sim_cluster* c, enum sim_map_kind kind, const struct sim_step* base,
               size_t nbase, const struct sim_step* other, size_t nother, int node, size_t elem);

#endif /* BRAID_SIM_SYMMETRY_H_ */
