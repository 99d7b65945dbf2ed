/*
 * hwloc's view of this host (topo_hwloc.c).
 */
#ifndef BRAID_TOPO_HWLOC_H_
#define BRAID_TOPO_HWLOC_H_

#include "nccl.h"
#include "topo/topo_system.h"

/* Cores, PUs, caches, NUMA nodes, PCI NICs and GPUs. ncclSystemError,
 * with sys untouched, when libhwloc cannot be opened (BRAID_HWLOC_LIB) or
 * fails. */
ncclResult_t topo_hwloc_fill(struct topo_system* sys);

#endif /* BRAID_TOPO_HWLOC_H_ */
