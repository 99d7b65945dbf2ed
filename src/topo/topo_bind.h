/*
 * Which cache this process is bound inside (topo_bind.c): ranks bound
 * inside the same cache pass messages through it, so the deterministic
 * mode pairs them where its canonical tree lets it (algorithms/pairwise.c).
 */
#ifndef BRAID_TOPO_BIND_H_
#define BRAID_TOPO_BIND_H_

#include <sched.h>

/* The smallest shared cache (level 2, else 3) whose CPUs hold every CPU
 * of `set`, named level * 65536 + its lowest CPU; -1 when none does (a
 * process free to run anywhere) or sysfs does not say. `root` replaces /
 * (tests give a made-up tree). */
int topo_bound_cache_at(const char* root, const cpu_set_t* set);
/* The same for this process's affinity. */
int topo_bound_cache(void);

#endif /* BRAID_TOPO_BIND_H_ */
