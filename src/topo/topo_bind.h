/*
 * The caches this process is bound inside (topo_bind.c): ranks bound
 * inside the same cache pass messages through it, so each node's ring
 * order groups them and the deterministic mode pairs them where its
 * canonical tree lets it (algorithms/layout.c).
 */
#ifndef BRAID_TOPO_BIND_H_
#define BRAID_TOPO_BIND_H_

#include <sched.h>

/* The shared cache of `level` (2 or 3) whose CPUs hold every CPU of
 * `set`, named by its lowest CPU; -1 when none does (a process free to
 * run on several L2s has none of level 2) or sysfs does not say. `root`
 * replaces / (tests give a made-up tree). */
int topo_bound_cache_at(const char* root, const cpu_set_t* set, int level);
/* The same for this process's affinity. */
int topo_bound_cache(int level);

#endif /* BRAID_TOPO_BIND_H_ */
