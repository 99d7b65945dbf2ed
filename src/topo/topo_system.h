/*
 * What topology detection finds on this host (topo.h): NUMA nodes, cores,
 * caches, NICs (with link speed) and GPUs with their PCI/NUMA affinity.
 * Types only: every detector (hwloc, sysfs, a file) fills one.
 */
#ifndef BRAID_TOPO_SYSTEM_H_
#define BRAID_TOPO_SYSTEM_H_

#include <stdint.h>

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
  uint32_t mem_mbps; /* one thread's memcpy bandwidth, 32 MiB copied within 64 MiB, MB/s */
  int from_file;     /* 1 when loaded from NCCL_TOPO_FILE */
};

/* Where topology detection logs. */
#define TOPO_LOG_SUB (SUB_INIT | SUB_GRAPH)

#endif /* BRAID_TOPO_SYSTEM_H_ */
