/*
 * The node layout of a communicator as schedules see it: ranks grouped by
 * node (nodes numbered in the order of their lowest rank), each rank's
 * index on its node, and the node-major order the flat ring follows.
 */
#include "layout.h"

#include <stdlib.h>
#include <string.h>

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
  memset(t->pair_xor, 0, sizeof(t->pair_xor));
  memset(t->pair_shared, 0, sizeof(t->pair_shared));
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

/* How much ranks share with their partner r ^ d: 2 for each that shares
 * its L2, 1 for each that shares only its L3. */
static int pairs_sharing(int n, const int* l2, const int* l3, int d) {
  int shared = 0;
  for (int r = 0; r < n; r++) {
    if (l2 && l2[r] >= 0 && l2[r] == l2[r ^ d])
      shared += 2;
    else if (l3 && l3[r] >= 0 && l3[r] == l3[r ^ d])
      shared += 1;
  }
  return shared;
}

/* Level by level, the distance d in [2^l, 2^(l+1)) whose partners share
 * the most caches, the canonical 2^l on a tie. Any such d pairs the two
 * halves of every aligned block of 2^(l+1) ranks (its top bit is l), so
 * the tree stays: the same blocks combine, in the same order; only which
 * rank of a block computes its partial moves (a message between ranks
 * that share a cache stays in it: docs/determinism.md). Level 0 has one
 * choice. One node of 2^k ranks only: elsewhere the levels follow the
 * nodes. */
void sched_topo_place(struct sched_topo* t, const int* l2, const int* l3) {
  int n = t->nranks;
  memset(t->pair_xor, 0, sizeof(t->pair_xor));
  memset(t->pair_shared, 0, sizeof(t->pair_shared));
  if (t->nnodes != 1 || n < 4 || (n & (n - 1)) != 0 || n > 1 << SCHED_PAIR_LEVELS) return;
  t->pair_shared[0] = pairs_sharing(n, l2, l3, 1);
  for (int l = 1; (1 << l) < n; l++) {
    int best = 1 << l, most = pairs_sharing(n, l2, l3, best);
    for (int d = best + 1; d < 2 << l; d++) {
      int shared = pairs_sharing(n, l2, l3, d);
      if (shared > most) best = d, most = shared;
    }
    t->pair_xor[l] = best == 1 << l ? 0 : best;
    t->pair_shared[l] = most;
  }
}
