/*
 * A call's schedule (sched_build.c): which algorithm builds which
 * collective, the schedule for a key (from the comm's cache of recent
 * ones, else built), and the peers it talks to.
 */
#ifndef BRAID_SCHED_BUILD_H_
#define BRAID_SCHED_BUILD_H_

#include <stdint.h>

#include "nccl.h"
#include "schedule.h"

/* 1 when `algo` implements `coll` (on this topology: hierarchical
 * reduce-scatter and all-gather need equal ranks per node). */
int sched_supports(int coll, int algo);
int sched_supports_on(const struct sched_topo* t, int coll, int algo);

/* Build (or reuse) the schedule for `key`. */
ncclResult_t sched_build(struct schedule* s, const struct sched_key* key);

/* Ranks a schedule for `key` exchanges data with, in both directions
 * (the relation is symmetric: if p is my peer, I am p's). Returns how many
 * were written to `peers` (at most `max`). */
int sched_peers(const struct sched_key* key, int* peers, int max);

/* The schedules a comm ran last: calls that alternate sizes or
 * collectives, and the full and last pieces of a long call, find
 * theirs built. An evicted entry's steps are reused by the next build, so
 * once warm the cache allocates nothing. */
#define SCHED_CACHE_SIZE 8
struct sched_cache {
  struct schedule entries[SCHED_CACHE_SIZE];
  uint64_t used[SCHED_CACHE_SIZE]; /* `clock` at the entry's last use */
  uint64_t clock;
  int last;        /* the entry used last */
  uint64_t builds; /* schedules built since init: tests watch it stop growing */
};

/* The schedule for `key`, built into the least recently used entry when
 * none matches. It stays valid until the next call. */
ncclResult_t sched_cache_get(struct sched_cache* c, const struct sched_key* key,
                             const struct schedule** out);
void sched_cache_free(struct sched_cache* c);

#endif /* BRAID_SCHED_BUILD_H_ */
