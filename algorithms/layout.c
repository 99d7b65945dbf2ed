/*
 * The node layout of a communicator as schedules see it: ranks grouped by
 * node (nodes numbered in the order of their lowest rank), each rank's
 * index on its node, and the node-major order the flat ring follows.
 */
#include "layout.h"

#include <stdlib.h>

#include "core.h"
#include "schedule.h"

/* Number the nodes in the order of their lowest rank: node_of[r] for
 * every rank, through a table of the first rank seen on each host (open
 * addressing; a search through the ranks before took 16k ranks 134M
 * compares). Returns the node count, -1 without memory. */
static int number_nodes(int n, const uint64_t* host, int* node_of) {
  size_t cap = 16, nnodes = 0;
  while (cap < 2 * (size_t)n) cap *= 2;
  int* first = malloc(cap * sizeof(int)); /* a rank on the host, -1: empty */
  if (first == NULL) return -1;
  for (size_t i = 0; i < cap; i++) first[i] = -1;
  for (int r = 0; r < n; r++) {
    size_t j = (size_t)(host[r] * 0x9E3779B97F4A7C15ull >> 17) & (cap - 1);
    while (first[j] >= 0 && host[first[j]] != host[r]) j = (j + 1) & (cap - 1);
    if (first[j] < 0)
      first[j] = r, node_of[r] = (int)nnodes++;
    else
      node_of[r] = node_of[first[j]];
  }
  free(first);
  return (int)nnodes;
}

/* One allocation holds every array: [node_of | local_of | order | pos_of |
 * node_start]. */
ncclResult_t sched_topo_init(struct sched_topo* t, int n, const uint64_t* host) {
  ncclResult_t res = ncclSuccess;
  int *mem = NULL, *node_of, *local_of, *order, *pos_of, *start, nnodes = 0;
  CHECK(braid_calloc(&mem, (size_t)5 * (size_t)n + 1, sizeof(int)));
  node_of = mem, local_of = mem + n, order = mem + 2 * n, pos_of = mem + 3 * n;
  start = mem + 4 * n;
  nnodes = number_nodes(n, host, node_of);
  if (nnodes < 0) FAIL(ncclSystemError, "Out of memory grouping %d ranks into nodes", n);
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
