/*
 * The node layout of a communicator as schedules see it: ranks grouped by
 * node (nodes numbered in the order of their lowest rank), each rank's
 * index on its node, and the node-major order the flat ring follows (rank
 * order within a node, or grouped by the caches its ranks are bound
 * inside: sched_topo_place).
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

/* Whether rank a goes before rank b on their node: by the L3 each is
 * bound inside, then the L2, then the rank (-1, bound inside none, first). */
static int cache_before(const int* l2, const int* l3, int a, int b) {
  int a3 = l3 ? l3[a] : -1, b3 = l3 ? l3[b] : -1, a2 = l2 ? l2[a] : -1, b2 = l2 ? l2[b] : -1;
  if (a3 != b3) return a3 < b3;
  if (a2 != b2) return a2 < b2;
  return a < b;
}

/* Each node's ranks in `order` grouped by the caches they are bound
 * inside, so that the flat ring (and every schedule over positions, and
 * Hier's index on the node) crosses from one cache to the next as seldom
 * as it can: a launcher that deals ranks round-robin over sockets or
 * cores (Open MPI's default mapping beyond 2 ranks) otherwise gives a
 * ring that crosses at every hop. Unbound ranks keep rank order; every
 * rank sorts the same published caches, so all agree. */
static void order_by_cache(struct sched_topo* t, const int* l2, const int* l3) {
  int *order = (int*)t->order, *local_of = (int*)t->local_of, *pos_of = (int*)t->pos_of;
  for (int node = 0; node < t->nnodes; node++) {
    int* mine = order + t->node_start[node];
    int k = sched_topo_node_size(t, node);
    for (int i = 1; i < k; i++) /* insertion: a node holds few ranks, most in order */
      for (int j = i; j > 0 && cache_before(l2, l3, mine[j], mine[j - 1]); j--) {
        int r = mine[j];
        mine[j] = mine[j - 1], mine[j - 1] = r;
      }
    for (int i = 0; i < k; i++) {
      local_of[mine[i]] = i;
      pos_of[mine[i]] = t->node_start[node] + i;
    }
  }
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
  order_by_cache(t, l2, l3);
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
