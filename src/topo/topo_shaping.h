/*
 * Traffic shaping on a NIC (topo_shaping.c).
 */
#ifndef BRAID_TOPO_SHAPING_H_
#define BRAID_TOPO_SHAPING_H_

/* Mb/s of the tbf qdisc at the root of `ifname`, 0 when it has none or
 * the kernel cannot be asked. */
int topo_nic_shaped_mbps(const char* ifname);

#endif /* BRAID_TOPO_SHAPING_H_ */
