/*
 * The symmetry test (sim_symmetry.h).
 */
#include "sim_symmetry.h"

#include "sim_engine.h"

int sim_map_rank(const struct sim_cluster* c, enum sim_map_kind kind, int r, int node) {
  if (r < 0) return r;
  int from = r / c->per_node;
  int to = kind == SIM_MAP_XOR ? from ^ node : (from + node) % c->nnodes;
  return to * c->per_node + r % c->per_node;
}

int sim_map_home(const struct sim_cluster* c, enum sim_map_kind kind, int node) {
  return kind == SIM_MAP_XOR ? node : (c->nnodes - node) % c->nnodes;
}

static int step_is_map(const struct sim_cluster* c, enum sim_map_kind kind,
                       const struct sim_step* a, const struct sim_step* b, int node, size_t elem) {
  size_t diff = a->bytes > b->bytes ? a->bytes - b->bytes : b->bytes - a->bytes;
  return a->prim == b->prim && a->piece_first == b->piece_first && a->y_wait == b->y_wait &&
         diff <= elem && sim_map_rank(c, kind, a->recv, node) == b->recv &&
         sim_map_rank(c, kind, a->send, node) == b->send;
}

int sim_is_map(const struct sim_cluster* c, enum sim_map_kind kind, const struct sim_step* base,
               size_t nbase, const struct sim_step* other, size_t nother, int node, size_t elem) {
  if (nbase != nother) return 0;
  for (size_t i = 0; i < nbase; i++)
    if (!step_is_map(c, kind, &base[i], &other[i], node, elem)) return 0;
  return 1;
}
