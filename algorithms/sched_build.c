/*
 * A call's schedule (sched_build.h): from the comm's cache of the last few
 * (building one costs a pass over every step, so a workload that
 * alternates sizes - gradient buckets, a loss all-reduce between them -
 * must not rebuild on every call), else built by the algorithm that
 * serves the collective (the builders' table); and the peers it talks to.
 * Trees and recursive doubling work over ring positions and are renamed to
 * ranks here; a group's schedule is renamed to the comm's ranks.
 */
#include "sched_build.h"

#include "core.h"
#include "hier.h"
#include "pairwise.h"
#include "recursive_doubling.h"
#include "ring.h"
#include "tree.h"

typedef ncclResult_t (*sched_builder)(struct schedule*, const struct sched_key*);

/* Which algorithm implements which collective; NULL where none does. */
static const sched_builder builders[COLL_COUNT][ALGO_COUNT] = {
    [COLL_ALLREDUCE] = {ring_schedule_allreduce, tree_schedule_allreduce, rd_schedule_allreduce,
                        hier_schedule_allreduce, pairwise_schedule_allreduce},
    [COLL_ALLGATHER] = {ring_schedule_allgather, NULL, NULL, hier_schedule_allgather, NULL},
    [COLL_REDUCESCATTER] = {ring_schedule_reducescatter, NULL, NULL, hier_schedule_reducescatter,
                            pairwise_schedule_reducescatter},
    [COLL_BROADCAST] = {chain_schedule_broadcast, tree_schedule_broadcast, NULL, NULL, NULL},
    [COLL_REDUCE] = {chain_schedule_reduce, tree_schedule_reduce, NULL, NULL,
                     pairwise_schedule_reduce},
};

/* Trees and recursive doubling are built over ring positions (ranks node
 * by node, so their first links stay inside a node) and their peers then
 * renamed to ranks; ring, chain, hierarchical and pairwise schedules name
 * ranks (pairwise must: its order of reduction is by rank). */
static int sched_in_positions(int algo) {
  return algo == ALGO_TREE || algo == ALGO_RD;
}

static struct sched_key sched_position_key(const struct sched_key* k) {
  struct sched_key p = *k;
  p.rank = sched_topo_pos(k->topo, k->rank);
  p.root = sched_topo_pos(k->topo, k->root);
  p.topo = NULL;
  return p;
}

static void sched_rename_peers(struct schedule* s, const struct sched_topo* t) {
  if (t == NULL) return;
  for (size_t i = 0; i < s->nsteps; i++) {
    struct sched_step* st = &s->steps[i];
    if (st->recv_peer >= 0) st->recv_peer = t->order[st->recv_peer];
    if (st->send_peer >= 0) st->send_peer = t->order[st->send_peer];
  }
}

static int sched_position_peers(const struct sched_key* k, int* peers, int max) {
  int n = k->nranks, r = k->rank, m = 0, parent, child[2], rd[64];
  switch (k->algo) {
    case ALGO_RD:
      for (int i = 0, nrd = rd_peers(r, n, rd, 64); i < nrd; i++)
        m = sched_add_peer(peers, m, max, rd[i]);
      return m;
    case ALGO_TREE:
      for (int t = 0; t < (k->coll == COLL_ALLREDUCE ? 2 : 1); t++) {
        if (k->coll == COLL_ALLREDUCE)
          tree_links(r, n, t, &parent, child);
        else
          tree_rooted_links(r, n, k->root, &parent, child);
        m = sched_add_peer(peers, m, max, parent);
        m = sched_add_peer(peers, m, max, child[0]);
        m = sched_add_peer(peers, m, max, child[1]);
      }
      return m;
    default: /* ring and chain */
      m = sched_add_peer(peers, m, max, (r + n - 1) % n);
      return sched_add_peer(peers, m, max, (r + 1) % n);
  }
}

/* A group's schedule names comm ranks (sched_key.ranks). */
static void sched_rename_group(struct schedule* s, const int* ranks) {
  if (ranks == NULL) return;
  for (size_t i = 0; i < s->nsteps; i++) {
    struct sched_step* st = &s->steps[i];
    if (st->recv_peer >= 0) st->recv_peer = ranks[st->recv_peer];
    if (st->send_peer >= 0) st->send_peer = ranks[st->send_peer];
  }
}

int sched_peers(const struct sched_key* k, int* peers, int max) {
  int m;
  if (k->nranks == 1) return 0;
  if (k->algo == ALGO_HIER) {
    m = hier_peers(k, peers, max);
  } else if (k->algo == ALGO_PAIRWISE) {
    m = pairwise_peers(k, peers, max);
  } else {
    struct sched_key p = sched_position_key(k);
    m = sched_position_peers(&p, peers, max);
    for (int i = 0; i < m; i++) peers[i] = sched_topo_rank(k->topo, peers[i]);
  }
  for (int i = 0; k->ranks && i < m; i++) peers[i] = k->ranks[peers[i]];
  return m;
}

int sched_supports(int coll, int algo) {
  return coll >= 0 && coll < COLL_COUNT && algo >= 0 && algo < ALGO_COUNT &&
         builders[coll][algo] != NULL;
}

int sched_supports_on(const struct sched_topo* t, int coll, int algo) {
  if (!sched_supports(coll, algo)) return 0;
  if (algo == ALGO_HIER && coll != COLL_ALLREDUCE) /* blocks follow ranks: even layouts only */
    return t == NULL || t->min_ppn == t->max_ppn;
  return 1;
}

ncclResult_t sched_build(struct schedule* s, const struct sched_key* key) {
  ncclResult_t res = ncclSuccess;
  if (s->valid && sched_key_equal(&s->key, key)) return ncclSuccess;
  s->valid = 0;
  s->nsteps = 0;
  s->plain_sends = 0;
  s->max_count = 0;
  if (!sched_supports_on(key->topo, key->coll, key->algo))
    FAIL(ncclInternalError, "No %s algorithm for %s", sched_algo_name(key->algo),
         sched_coll_name(key->coll));
  if (sched_in_positions(key->algo)) {
    struct sched_key p = sched_position_key(key);
    CHECK(builders[key->coll][key->algo](s, &p));
    sched_rename_peers(s, key->topo);
  } else {
    CHECK(builders[key->coll][key->algo](s, key));
  }
  sched_rename_group(s, key->ranks);
  s->key = *key;
  s->valid = 1;
fail:
  return res;
}

/* ---- the cache ---- */

/* The entry holding `key`, or -1; the last one used first: a loop of one
 * call finds it there. */
static int cache_find(const struct sched_cache* c, const struct sched_key* key) {
  const struct schedule* last = &c->entries[c->last];
  if (last->valid && sched_key_equal(&last->key, key)) return c->last;
  for (int i = 0; i < SCHED_CACHE_SIZE; i++)
    if (c->entries[i].valid && sched_key_equal(&c->entries[i].key, key)) return i;
  return -1;
}

/* An empty entry, else the least recently used one. */
static int cache_victim(const struct sched_cache* c) {
  int v = 0;
  for (int i = 0; i < SCHED_CACHE_SIZE; i++) {
    if (!c->entries[i].valid) return i;
    if (c->used[i] < c->used[v]) v = i;
  }
  return v;
}

ncclResult_t sched_cache_get(struct sched_cache* c, const struct sched_key* key,
                             const struct schedule** out) {
  ncclResult_t res = ncclSuccess;
  int i = cache_find(c, key);
  if (i < 0) {
    i = cache_victim(c);
    res = sched_build(&c->entries[i], key);
    if (res != ncclSuccess) return res;
    c->builds++;
  }
  c->used[i] = ++c->clock;
  c->last = i;
  *out = &c->entries[i];
  return res;
}

void sched_cache_free(struct sched_cache* c) {
  for (int i = 0; i < SCHED_CACHE_SIZE; i++) sched_free(&c->entries[i]);
  c->clock = c->builds = 0;
  c->last = 0;
}
