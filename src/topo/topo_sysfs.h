/*
 * sysfs and sysconf's view of this host (topo_sysfs.c), when hwloc is
 * not there, and the readers other detectors share.
 */
#ifndef BRAID_TOPO_SYSFS_H_
#define BRAID_TOPO_SYSFS_H_

#include <sched.h>

#include "topo/topo_system.h"

/* An integer (decimal, or hex with 0x) from a sysfs file, `dflt` when
 * unreadable: virtual NICs answer EINVAL for `speed`, so that is common. */
long topo_sysfs_read_long(const char* path, long dflt);

/* The first line of a small sysfs file, without its newline; 0 on
 * success. */
int topo_sysfs_read_line(const char* path, char* out, size_t cap);

/* Cores, PUs, caches, NUMA nodes (none when sysfs lists none) and GPUs. */
void topo_sysfs_fill(struct topo_system* sys);
/* The same under `root` instead of / (tests give it a made-up tree). */
void topo_sysfs_fill_at(struct topo_system* sys, const char* root);

/* "0-3,8-11" (the kernel's list format) into a set; 0, or -1 when
 * malformed or naming a CPU past CPU_SETSIZE. */
int topo_cpuset_parse(const char* list, cpu_set_t* set);

#endif /* BRAID_TOPO_SYSFS_H_ */
