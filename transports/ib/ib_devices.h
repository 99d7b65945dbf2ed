/*
 * RDMA ports this host can use: every active port of every HCA the verbs
 * library lists, that NCCL_IB_HCA selects, with what the tuner and the
 * log need (link layer, speed, NUMA node).
 */
#ifndef BRAID_IB_DEVICES_H_
#define BRAID_IB_DEVICES_H_

#include <stddef.h>
#include <stdint.h>

#include "ib_verbs.h"

#define IB_DEV_NAME_MAX 64

struct ib_port {
  char dev[IB_DEV_NAME_MAX];
  int port;
  int link_layer; /* IBV_LINK_LAYER_INFINIBAND or _ETHERNET (RoCE) */
  uint32_t mbps;  /* lanes x lane rate; 0: unknown */
  int numa;       /* -1: unknown */
  uint16_t lid;
};

/* Up to max selected active ports into out, *n of them; *nhca gets how
 * many HCAs the library listed (for the log when none is usable). An HCA
 * that cannot be opened or queried is skipped. */
void ib_ports_find(const struct ib_verbs* v, const char* hca_spec, struct ib_port* out, int max,
                   int* n, int* nhca);

/* Which of n ports a rank on NUMA node `numa` (-1: unknown) uses, as
 * NCCL prefers the nearest NIC: one on its node first, then the fastest,
 * then the first listed. */
int ib_port_pick(const struct ib_port* ports, int n, int numa);

/* Whether a port is on another NUMA node than the rank (both known): its
 * traffic then crosses the link between sockets. */
int ib_port_far(const struct ib_port* p, int numa);

/* "mlx5_0:1 IB 100000 Mb/s NUMA 0" */
void ib_port_describe(const struct ib_port* p, char* buf, size_t len);

#endif /* BRAID_IB_DEVICES_H_ */
