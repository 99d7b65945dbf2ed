/*
 * Which algorithm builds which collective (sched_build.c): the schedule
 * for a key, and the peers it talks to.
 */
#ifndef BRAID_SCHED_BUILD_H_
#define BRAID_SCHED_BUILD_H_

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

#endif /* BRAID_SCHED_BUILD_H_ */
