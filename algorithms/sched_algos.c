/*
 * The algorithms' table (sched_algos.h): which algorithm builds which
 * collective, over ranks or ring positions, and the peers it talks to.
 */
#include "sched_algos.h"

#include "hier.h"
#include "pairwise.h"
#include "recursive_doubling.h"
#include "ring.h"
#include "tree.h"

/* ---- peers over ring positions (the key's rank and root are positions) ---- */

static int ring_peers(const struct sched_key* k, int* peers, int max) {
  int n = k->nranks, r = k->rank;
  int m = sched_add_peer(peers, 0, max, (r + n - 1) % n);
  return sched_add_peer(peers, m, max, (r + 1) % n);
}

static int rd_position_peers(const struct sched_key* k, int* peers, int max) {
  int rd[64], m = 0;
  for (int i = 0, nrd = rd_peers(k->rank, k->nranks, rd, 64); i < nrd; i++)
    m = sched_add_peer(peers, m, max, rd[i]);
  return m;
}

static int tree_peers(const struct sched_key* k, int* peers, int max) {
  int m = 0, parent, child[2];
  for (int t = 0; t < (k->coll == COLL_ALLREDUCE ? 2 : 1); t++) {
    if (k->coll == COLL_ALLREDUCE)
      tree_links(k->rank, k->nranks, t, &parent, child);
    else
      tree_rooted_links(k->rank, k->nranks, k->root, &parent, child);
    m = sched_add_peer(peers, m, max, parent);
    m = sched_add_peer(peers, m, max, child[0]);
    m = sched_add_peer(peers, m, max, child[1]);
  }
  return m;
}

/* Hierarchical reduce-scatter and all-gather give blocks to ranks in
 * order: they need the same number of ranks on every node. */
static int hier_fits(const struct sched_topo* t, int coll) {
  return coll == COLL_ALLREDUCE || t == NULL || t->min_ppn == t->max_ppn;
}

static const struct sched_algorithm k_ring = {
    .name = "Ring",
    .builders = {[COLL_ALLREDUCE] = ring_schedule_allreduce,
                 [COLL_ALLGATHER] = ring_schedule_allgather,
                 [COLL_REDUCESCATTER] = ring_schedule_reducescatter,
                 [COLL_BROADCAST] = chain_schedule_broadcast,
                 [COLL_REDUCE] = chain_schedule_reduce},
    .built_in_positions = 0, /* its builders order ranks node by node */
    .peers = ring_peers,
    .peers_in_positions = 1,
};

static const struct sched_algorithm k_tree = {
    .name = "Tree",
    .builders = {[COLL_ALLREDUCE] = tree_schedule_allreduce,
                 [COLL_BROADCAST] = tree_schedule_broadcast,
                 [COLL_REDUCE] = tree_schedule_reduce},
    .built_in_positions = 1,
    .peers = tree_peers,
    .peers_in_positions = 1,
};

static const struct sched_algorithm k_rd = {
    .name = "RecDoubling",
    .builders = {[COLL_ALLREDUCE] = rd_schedule_allreduce},
    .built_in_positions = 1,
    .peers = rd_position_peers,
    .peers_in_positions = 1,
};

static const struct sched_algorithm k_hier = {
    .name = "Hier",
    .builders = {[COLL_ALLREDUCE] = hier_schedule_allreduce,
                 [COLL_ALLGATHER] = hier_schedule_allgather,
                 [COLL_REDUCESCATTER] = hier_schedule_reducescatter},
    .peers = hier_peers,
    .fits = hier_fits,
};

static const struct sched_algorithm k_pairwise = {
    .name = "Pairwise",
    .builders = {[COLL_ALLREDUCE] = pairwise_schedule_allreduce,
                 [COLL_REDUCESCATTER] = pairwise_schedule_reducescatter,
                 [COLL_REDUCE] = pairwise_schedule_reduce},
    .peers = pairwise_peers, /* by rank: its order of reduction is */
};

/* A test build may add a row past the library's own (mp_test_rows
 * compiles this file again with BRAID_TEST_ALGORITHM naming its
 * tests/rows algorithm): the library itself never has one. */
#ifdef BRAID_TEST_ALGORITHM
extern const struct sched_algorithm BRAID_TEST_ALGORITHM;
#endif

/* A row's index is its id (enum sched_algo names those the library's code
 * refers to; a row nobody names needs no name there). */
static const struct sched_algorithm* const k_algos[] = {
    [ALGO_RING] = &k_ring,
    [ALGO_TREE] = &k_tree,
    [ALGO_RD] = &k_rd,
    [ALGO_HIER] = &k_hier,
    [ALGO_PAIRWISE] = &k_pairwise,
#ifdef BRAID_TEST_ALGORITHM
    [ALGO_COUNT] = &BRAID_TEST_ALGORITHM,
#endif
};
#define NALGOS ((int)(sizeof(k_algos) / sizeof(k_algos[0])))
_Static_assert(NALGOS <= ALGO_MAX, "more algorithms than ALGO_MAX: raise it");

int sched_algo_count(void) {
  return NALGOS;
}

const struct sched_algorithm* sched_algorithm(int algo) {
  return algo >= 0 && algo < NALGOS ? k_algos[algo] : NULL;
}

const char* sched_algo_name(int algo) {
  const struct sched_algorithm* a = sched_algorithm(algo);
  return a ? a->name : "?";
}
