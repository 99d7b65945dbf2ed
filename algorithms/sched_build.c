/*
 * A call's schedule (sched_build.h): from the comm's cache of the last few
 * (building one costs a pass over every step, so a workload that
 * alternates sizes - gradient buckets, a loss all-reduce between them -
 * must not rebuild on every call), else built by the algorithm that
 * serves the collective (its row of sched_algos.c); and the peers it
 * talks to.
 * Trees and recursive doubling work over ring positions and are renamed to
 * ranks here; a group's schedule is renamed to the comm's ranks.
 */
#include "sched_build.h"

#include "core.h"
#include "sched_algos.h"

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
  const struct sched_algorithm* a = sched_algorithm(k->algo);
  int m;
  if (k->nranks == 1 || a == NULL) return 0;
  if (a->peers_in_positions) {
    struct sched_key p = sched_position_key(k);
    m = a->peers(&p, peers, max);
    for (int i = 0; i < m; i++) peers[i] = sched_topo_rank(k->topo, peers[i]);
  } else {
    m = a->peers(k, peers, max);
  }
  for (int i = 0; k->ranks && i < m; i++) peers[i] = k->ranks[peers[i]];
  return m;
}

int sched_supports(int coll, int algo) {
  const struct sched_algorithm* a = sched_algorithm(algo);
  return coll >= 0 && coll < COLL_COUNT && a != NULL && a->builders[coll] != NULL;
}

int sched_supports_on(const struct sched_topo* t, int coll, int algo) {
  if (!sched_supports(coll, algo)) return 0;
  const struct sched_algorithm* a = sched_algorithm(algo);
  return a->fits == NULL || a->fits(t, coll);
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
  const struct sched_algorithm* a = sched_algorithm(key->algo);
  if (a->built_in_positions) {
    struct sched_key p = sched_position_key(key);
    CHECK(a->builders[key->coll](s, &p));
    sched_rename_peers(s, key->topo);
  } else {
    CHECK(a->builders[key->coll](s, key));
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
