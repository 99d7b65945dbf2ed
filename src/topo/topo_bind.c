/*
 * The caches a process is bound inside, from its affinity and sysfs's
 * cache lists (topo_bind.h). Only a cache that holds every CPU the
 * process may run on counts: a process the kernel may move anywhere shares
 * nothing for sure with anyone.
 */
#include "topo/topo_bind.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "topo/topo_sysfs.h"

/* The CPUs sharing CPU c's unified or data cache of `level`; 0 on
 * success. Index directories are numbered per CPU, so each is read. */
static int cache_cpus(const char* root, int c, int level, cpu_set_t* out) {
  for (int i = 0; i < 8; i++) {
    char dir[PATH_MAX], path[PATH_MAX + 32], line[1024];
    snprintf(dir, sizeof(dir), "%s/sys/devices/system/cpu/cpu%d/cache/index%d", root, c, i);
    snprintf(path, sizeof(path), "%s/level", dir);
    if (topo_sysfs_read_long(path, -1) != level) continue;
    snprintf(path, sizeof(path), "%s/type", dir);
    if (topo_sysfs_read_line(path, line, sizeof(line)) != 0 || strcmp(line, "Instruction") == 0)
      continue;
    snprintf(path, sizeof(path), "%s/shared_cpu_list", dir);
    if (topo_sysfs_read_line(path, line, sizeof(line)) != 0) return -1;
    return topo_cpuset_parse(line, out);
  }
  return -1;
}

static int first_cpu(const cpu_set_t* set) {
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, set)) return c;
  return -1;
}

int topo_bound_cache_at(const char* root, const cpu_set_t* set, int level) {
  cpu_set_t cache, both;
  int c = first_cpu(set);
  if (c < 0 || cache_cpus(root, c, level, &cache) != 0) return -1;
  CPU_AND(&both, &cache, set);
  return CPU_EQUAL(&both, set) ? first_cpu(&cache) : -1;
}

int topo_bound_cache(int level) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return -1;
  return topo_bound_cache_at("", &set, level);
}
