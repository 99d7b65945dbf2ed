/*
 * The NIC list of a topology (topo_nic.c), shared by hwloc and sysfs
 * discovery.
 */
#ifndef BRAID_TOPO_NIC_H_
#define BRAID_TOPO_NIC_H_

#include "topo/topo_system.h"

/* Append a NIC named `ifname` (its speed read from sysfs, or the rate a
 * tbf qdisc shapes it to); NULL when the table is full. */
struct topo_nic* topo_nic_add(struct topo_system* sys, const char* ifname);

/* The NIC named `ifname`, or NULL. */
const struct topo_nic* topo_nic_find(const struct topo_system* sys, const char* ifname);

#endif /* BRAID_TOPO_NIC_H_ */
