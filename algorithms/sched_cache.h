/*
 * The schedules a comm ran last (sched_cache.c).
 */
#ifndef BRAID_SCHED_CACHE_H_
#define BRAID_SCHED_CACHE_H_

#include <stdint.h>

#include "nccl.h"
#include "schedule.h"

/* Calls that alternate
 * sizes or collectives, and the full and last pieces of a long call, find
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

#endif /* BRAID_SCHED_CACHE_H_ */
