/*
 * The node layout of a communicator as schedules see it: ranks grouped by
 * node (nodes numbered in the order of their lowest rank), each rank's
 * index on its node, and the node-major order the flat ring follows.
 */
#include "layout.h"

#include <stdlib.h>

#include "core.h"
#include "schedule.h"

/* One allocation holds every array: [node_of | local_of | order | pos_of |
 * node_start]. */
ncclResult_t sched_topo_init(struct sched_topo* t, int n, const uint64_t* host) {
  ncclResult_t res = ncclSuccess;
  int *mem = NULL, *node_of, *local_of, *order, *pos_of, *start, nnodes = 0;
  CHECK(braid_calloc(&mem, (size_t)5 * (size_t)n + 1, sizeof(int)));
  node_of = mem, local_of = mem + n, order = mem + 2 * n, pos_of = mem + 3 * n;
  start = mem + 4 * n;
  for (int r = 0; r < n; r++) {
    int q = 0;
    while (q < r && host[q] != host[r]) q++;
    node_of[r] = q == r ? nnodes++ : node_of[q];
  }
  /* Counting sort by node keeps rank order within each node. */
  for (int r = 0; r < n; r++) start[node_of[r] + 1]++;
  for (int i = 0; i < nnodes; i++) start[i + 1] += start[i];
  t->min_ppn = n, t->max_ppn = 0;
  for (int i = 0; i < nnodes; i++) {
    t->min_ppn = MIN(t->min_ppn, start[i + 1] - start[i]);
    t->max_ppn = MAX(t->max_ppn, start[i + 1] - start[i]);
  }
  /* pos_of counts each node's ranks first, then gets its real meaning. */
  for (int r = 0; r < n; r++) {
    local_of[r] = pos_of[node_of[r]]++;
    order[start[node_of[r]] + local_of[r]] = r;
  }
  for (int p = 0; p < n; p++) pos_of[order[p]] = p;
  t->nranks = n;
  t->nnodes = nnodes;
  t->node_of = node_of, t->local_of = local_of, t->order = order, t->pos_of = pos_of;
  t->node_start = start;
  return ncclSuccess;
fail:
  free(mem);
  return res;
}

int sched_topo_node_size(const struct sched_topo* t, int node) {
  return t->node_start[node + 1] - t->node_start[node];
}

void sched_topo_free(struct sched_topo* t) {
  free((void*)t->node_of);
  t->node_of = NULL;
}
