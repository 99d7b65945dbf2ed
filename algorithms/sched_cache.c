/*
 * A few schedules per comm, least recently used out: building one costs
 * a pass over every step, so a workload that alternates sizes (gradient
 * buckets, a loss all-reduce between them) must not rebuild on every call.
 */
#include "sched_cache.h"

#include "core.h"
#include "sched_build.h"
#include "schedule.h"

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
