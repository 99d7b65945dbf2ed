/*
 * Topology of this host (topo_system.h), found with hwloc or read from
 * NCCL_TOPO_FILE, plus the memcpy bandwidth the tuner needs. Detected once
 * per process (detection costs tens of milliseconds); read-only after.
 */
#ifndef BRAID_TOPO_H_
#define BRAID_TOPO_H_

#include "nccl.h"
#include "topo/topo_system.h"

/* This host's topology: detected on first call (or loaded from
 * NCCL_TOPO_FILE), written to NCCL_TOPO_DUMP_FILE if set, then cached. */
ncclResult_t topo_system_get(const struct topo_system** out);

/* Detection, exposed for tests. */
ncclResult_t topo_detect(struct topo_system* sys);

/* One INFO line (or a few) describing the system. */
void topo_log_summary(const struct topo_system* sys);

/* Bind the calling thread to the cores of the NUMA node nearest the NIC
 * `ifname` (or, when ifname is NULL, nearest GPU `gpu_pci`); no-op with a
 * log line when the node is unknown or the host has one NUMA node. */
ncclResult_t topo_bind_thread_near(const struct topo_system* sys, const char* ifname,
                                   const char* gpu_pci);

#endif /* BRAID_TOPO_H_ */
