/*
 * Topology of this host: NUMA nodes, cores, caches, NICs (with link speed)
 * and GPUs with their PCI/NUMA affinity, found with hwloc or read from
 * NCCL_TOPO_FILE, plus the memcpy bandwidth the tuner needs. Detected once
 * per process (detection costs tens of milliseconds); read-only after.
 */
#ifndef BRAID_TOPO_H_
#define BRAID_TOPO_H_

#include <sched.h>
#include <stdint.h>

#include "nccl.h"

#define TOPO_MAX_NUMA 64
#define TOPO_MAX_NICS 32
#define TOPO_MAX_GPUS 32
#define TOPO_NAME_LEN 64
#define TOPO_CPUSET_LEN 256

struct topo_numa {
  int os_index;
  int ncores;
  int npus;                     /* hardware threads */
  uint64_t mem_bytes;           /* local memory, 0 if unknown */
  char cpuset[TOPO_CPUSET_LEN]; /* Linux list format, "0-3,8-11" */
};

struct topo_nic {
  char name[TOPO_NAME_LEN]; /* interface name, "eth0" */
  char pci[TOPO_NAME_LEN];  /* PCI bus id, "" for virtual devices */
  int numa;                 /* os_index of the nearest NUMA node, -1 if none */
  int speed_mbps;           /* sysfs link speed or a lower tbf rate, 0 if unknown */
};

struct topo_gpu {
  char pci[TOPO_NAME_LEN]; /* PCI bus id */
  int numa;                /* -1 if unknown */
};

struct topo_system {
  char hostname[TOPO_NAME_LEN];
  int ncores, npus;
  uint64_t l1d_bytes, l2_bytes, l3_bytes; /* per cache instance, largest seen */
  int nnuma;
  struct topo_numa numa[TOPO_MAX_NUMA];
  int nnics;
  struct topo_nic nics[TOPO_MAX_NICS];
  int ngpus;
  struct topo_gpu gpus[TOPO_MAX_GPUS];
  uint32_t mem_mbps; /* one thread's memcpy bandwidth on a 64 MiB buffer, MB/s */
  int from_file;     /* 1 when loaded from NCCL_TOPO_FILE */
};

/* This host's topology: detected on first call (or loaded from
 * NCCL_TOPO_FILE), written to NCCL_TOPO_DUMP_FILE if set, then cached. */
ncclResult_t topo_system_get(const struct topo_system** out);

/* Detection and the file format, exposed for tests. */
ncclResult_t topo_detect(struct topo_system* sys);
ncclResult_t topo_write_file(const struct topo_system* sys, const char* path);
ncclResult_t topo_read_file(const char* path, struct topo_system* sys);
/* The parser of topo_read_file on len bytes of text (no NUL needed); `name`
 * names the text in WARNs. All or nothing: sys is zeroed on failure. */
ncclResult_t topo_parse_text(const char* name, const char* text, size_t len,
                             struct topo_system* sys);

/* Where topology detection logs. */
#define TOPO_LOG_SUB (SUB_INIT | SUB_GRAPH)

/* hwloc's view of this host (topo_hwloc.c): cores, PUs, caches, NUMA
 * nodes, PCI NICs and GPUs. ncclSystemError, with sys untouched, when
 * libhwloc cannot be opened (BRAID_HWLOC_LIB) or fails. */
ncclResult_t topo_hwloc_fill(struct topo_system* sys);

/* An integer (decimal, or hex with 0x) from a sysfs file, `dflt` when
 * unreadable: virtual NICs answer EINVAL for `speed`, so that is common. */
long topo_sysfs_read_long(const char* path, long dflt);

/* The same from sysfs and sysconf (topo_sysfs.c), when hwloc is not there:
 * cores, PUs, caches, NUMA nodes (none when sysfs lists none) and GPUs. */
void topo_sysfs_fill(struct topo_system* sys);
/* The same under `root` instead of / (tests give it a made-up tree). */
void topo_sysfs_fill_at(struct topo_system* sys, const char* root);

/* "0-3,8-11" (the kernel's list format) into a set; 0, or -1 when
 * malformed or naming a CPU past CPU_SETSIZE. */
int topo_cpuset_parse(const char* list, cpu_set_t* set);

/* Append a NIC named `ifname` (its speed read from sysfs); NULL when the
 * table is full. */
struct topo_nic* topo_nic_add(struct topo_system* sys, const char* ifname);

/* The NIC named `ifname`, or NULL. */
const struct topo_nic* topo_nic_find(const struct topo_system* sys, const char* ifname);

/* Mb/s of the tbf qdisc at the root of `ifname` (topo_shaping.c), 0 when
 * it has none or the kernel cannot be asked. */
int topo_nic_shaped_mbps(const char* ifname);

/* One INFO line (or a few) describing the system. */
void topo_log_summary(const struct topo_system* sys);

/* Bind the calling thread to the cores of the NUMA node nearest the NIC
 * `ifname` (or, when ifname is NULL, nearest GPU `gpu_pci`); no-op with a
 * log line when the node is unknown or the host has one NUMA node. */
ncclResult_t topo_bind_thread_near(const struct topo_system* sys, const char* ifname,
                                   const char* gpu_pci);

#endif /* BRAID_TOPO_H_ */
