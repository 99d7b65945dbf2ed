/*
 * Topology from sysfs and sysconf, for hosts without libhwloc: cores as
 * distinct (package, core) pairs of the online CPUs, NUMA nodes with their
 * CPUs and memory, and NVIDIA GPUs by PCI vendor and class. What a cost
 * model needs, read the way hwloc reads it; caches come from sysconf.
 */
#include "topo/topo_sysfs.h"

#include <dirent.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#define SYSFS_CPU "/sys/devices/system/cpu"
#define SYSFS_NODE "/sys/devices/system/node"
#define SYSFS_PCI "/sys/bus/pci/devices"

int topo_sysfs_read_line(const char* path, char* out, size_t cap) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  int ok = fgets(out, (int)cap, f) != NULL;
  fclose(f);
  if (!ok) return -1;
  out[strcspn(out, "\n")] = '\0';
  return 0;
}

static int cpus_online(const char* root, cpu_set_t* set) {
  char list[TOPO_CPUSET_LEN], path[PATH_MAX];
  snprintf(path, sizeof(path), "%s" SYSFS_CPU "/online", root);
  return topo_sysfs_read_line(path, list, sizeof(list)) == 0 ? topo_cpuset_parse(list, set) : -1;
}

/* Distinct (package, core) pairs among the CPUs of `set`; a CPU without
 * topology files counts as a core of its own. */
static int cores_in(const char* root, const cpu_set_t* set) {
  static const int max = CPU_SETSIZE;
  long(*seen)[2] = NULL;
  int n = 0;
  if (braid_calloc(&seen, (size_t)max, sizeof(*seen)) != ncclSuccess) return CPU_COUNT(set);
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (!CPU_ISSET(c, set)) continue;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s" SYSFS_CPU "/cpu%d/topology/physical_package_id", root, c);
    long pkg = topo_sysfs_read_long(path, -1 - c);
    snprintf(path, sizeof(path), "%s" SYSFS_CPU "/cpu%d/topology/core_id", root, c);
    long core = topo_sysfs_read_long(path, -1 - c);
    int dup = 0;
    for (int i = 0; i < n && !dup; i++) dup = seen[i][0] == pkg && seen[i][1] == core;
    if (!dup) seen[n][0] = pkg, seen[n][1] = core, n++;
  }
  free(seen);
  return n;
}

/* "Node 0 MemTotal:  12345 kB" of nodeN/meminfo, in bytes; 0 if unknown. */
static uint64_t node_mem_bytes(const char* root, int node) {
  char path[PATH_MAX], line[256];
  snprintf(path, sizeof(path), "%s" SYSFS_NODE "/node%d/meminfo", root, node);
  FILE* f = fopen(path, "r");
  uint64_t kb = 0;
  while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
    unsigned long long v;
    int id;
    if (sscanf(line, "Node %d MemTotal: %llu kB", &id, &v) == 2) kb = v;
  }
  if (f != NULL) fclose(f);
  return kb * 1024;
}

static int node_cmp(const void* a, const void* b) {
  return *(const int*)a - *(const int*)b;
}

/* NUMA nodes from nodeN/cpulist, in node order; 0 when sysfs has none. */
static int numa_fill(struct topo_system* sys, const char* root, const cpu_set_t* online) {
  int ids[TOPO_MAX_NUMA], n = 0;
  char dir[PATH_MAX];
  snprintf(dir, sizeof(dir), "%s" SYSFS_NODE, root);
  DIR* d = opendir(dir);
  for (struct dirent* e; d != NULL && (e = readdir(d)) != NULL;) {
    int id;
    char end;
    if (sscanf(e->d_name, "node%d%c", &id, &end) == 1 && n < TOPO_MAX_NUMA) ids[n++] = id;
  }
  if (d != NULL) closedir(d);
  qsort(ids, (size_t)n, sizeof(int), node_cmp);
  for (int i = 0; i < n; i++) {
    struct topo_numa* nm = &sys->numa[sys->nnuma];
    char path[PATH_MAX];
    cpu_set_t cpus;
    snprintf(path, sizeof(path), "%s" SYSFS_NODE "/node%d/cpulist", root, ids[i]);
    if (topo_sysfs_read_line(path, nm->cpuset, sizeof(nm->cpuset)) != 0 ||
        topo_cpuset_parse(nm->cpuset, &cpus) != 0)
      continue;
    CPU_AND(&cpus, &cpus, online);
    if (CPU_COUNT(&cpus) == 0) continue; /* a memory-only node: hwloc lists it under a package */
    nm->os_index = ids[i];
    nm->npus = CPU_COUNT(&cpus);
    nm->ncores = cores_in(root, &cpus);
    nm->mem_bytes = node_mem_bytes(root, ids[i]);
    sys->nnuma++;
  }
  return sys->nnuma;
}

static int name_cmp(const void* a, const void* b) {
  return strcmp((const char*)a, (const char*)b);
}

/* NVIDIA display (0x0300) or 3D (0x0302) controllers, in PCI bus order. */
static void gpus_fill(struct topo_system* sys, const char* root) {
  char(*names)[TOPO_NAME_LEN] = NULL, dir[PATH_MAX];
  int n = 0, max = 1024;
  snprintf(dir, sizeof(dir), "%s" SYSFS_PCI, root);
  DIR* d = opendir(dir);
  if (d == NULL || braid_calloc(&names, (size_t)max, TOPO_NAME_LEN) != ncclSuccess) goto done;
  for (struct dirent* e; (e = readdir(d)) != NULL && n < max;)
    if (e->d_name[0] != '.' && strlen(e->d_name) < TOPO_NAME_LEN)
      snprintf(names[n++], TOPO_NAME_LEN, "%s", e->d_name);
  qsort(names, (size_t)n, TOPO_NAME_LEN, name_cmp);
  for (int i = 0; i < n && sys->ngpus < TOPO_MAX_GPUS; i++) {
    char path[PATH_MAX + TOPO_NAME_LEN + 16];
    snprintf(path, sizeof(path), "%s/%s/vendor", dir, names[i]);
    long vendor = topo_sysfs_read_long(path, 0);
    snprintf(path, sizeof(path), "%s/%s/class", dir, names[i]);
    long cls = topo_sysfs_read_long(path, 0) >> 8;
    if (vendor != 0x10de || (cls != 0x0300 && cls != 0x0302)) continue;
    struct topo_gpu* gpu = &sys->gpus[sys->ngpus++];
    snprintf(gpu->pci, sizeof(gpu->pci), "%s", names[i]);
    snprintf(path, sizeof(path), "%s/%s/numa_node", dir, names[i]);
    long node = topo_sysfs_read_long(path, -1);
    gpu->numa =
        node >= 0 && node <= INT_MAX ? (int)node : (sys->nnuma == 1 ? sys->numa[0].os_index : -1);
  }
done:
  if (d != NULL) closedir(d);
  free(names);
}

static uint64_t sysconf_u64(int name) {
  long v = sysconf(name);
  return v > 0 ? (uint64_t)v : 0;
}

void topo_sysfs_fill_at(struct topo_system* sys, const char* root) {
  cpu_set_t online;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  sys->npus = n > 0 && n <= INT_MAX ? (int)n : 1;
  sys->ncores = sys->npus;
  if (cpus_online(root, &online) == 0) {
    sys->npus = CPU_COUNT(&online);
    sys->ncores = cores_in(root, &online);
    numa_fill(sys, root, &online);
  }
  sys->l1d_bytes = sysconf_u64(_SC_LEVEL1_DCACHE_SIZE);
  sys->l2_bytes = sysconf_u64(_SC_LEVEL2_CACHE_SIZE);
  sys->l3_bytes = sysconf_u64(_SC_LEVEL3_CACHE_SIZE);
  gpus_fill(sys, root);
  INFO(TOPO_LOG_SUB, "Topology from sysfs: %d cores, %d PUs, %d NUMA nodes, %d GPUs", sys->ncores,
       sys->npus, sys->nnuma, sys->ngpus);
}

void topo_sysfs_fill(struct topo_system* sys) {
  topo_sysfs_fill_at(sys, "");
}

/* An integer from a sysfs file, `dflt` when unreadable: virtual NICs answer
 * EINVAL for `speed`, so this is the common case, not an error. */
long topo_sysfs_read_long(const char* path, long dflt) {
  FILE* f = fopen(path, "r");
  long v;
  if (f == NULL) return dflt;
  int n = fscanf(f, "%li", &v);
  fclose(f);
  return n == 1 ? v : dflt;
}

/* "0-3,8-11" into a cpu_set_t: the kernel's list format, as hwloc writes it.
 * Returns 0, or -1 when malformed or naming a CPU past CPU_SETSIZE. */
int topo_cpuset_parse(const char* list, cpu_set_t* set) {
  const char* s = list;
  CPU_ZERO(set);
  while (*s) {
    char* end;
    long lo = strtol(s, &end, 10), hi = lo;
    if (end == s) return -1;
    if (*end == '-') {
      s = end + 1;
      hi = strtol(s, &end, 10);
      if (end == s) return -1;
    }
    if (lo < 0 || hi < lo || hi >= CPU_SETSIZE) return -1;
    for (long c = lo; c <= hi; c++) CPU_SET((int)c, set);
    s = end;
    if (*s == ',')
      s++;
    else if (*s != '\0')
      return -1;
  }
  return 0;
}
