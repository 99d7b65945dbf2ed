/*
 * The wire in braid-sim (sim_net.c): what a message crosses and when it
 * arrives. Every port (a NIC's send and receive side, a node's uplink and
 * downlink when the fat tree is oversubscribed, a rank's shared-memory
 * side) serves messages one after another in the order they are offered,
 * which the engine keeps in time order; a message cuts through: a port
 * starts on it once the one before has begun it and one latency passed.
 * A NIC with a token bucket (burst_bytes) sends at wire_gbps while its
 * tokens last and at nic_gbps beyond: small messages after a pause pass
 * at the wire's speed, as through tc's tbf.
 */
#ifndef BRAID_SIM_NET_H_
#define BRAID_SIM_NET_H_

#include "sim_cluster.h"

/* A port: when it is next free (us) and, for a NIC shaped by a token
 * bucket (tc's tbf, as the emulated cluster's links are: burst_bytes),
 * the tokens it held at `at`. */
struct sim_port {
  double free, tokens, at;
};

/* Nodes and ranks are the simulated ones (the symmetric mode keeps node
 * 0's alone). */
struct sim_net {
  const struct sim_cluster* c;
  int nodes, ranks;
  struct sim_port* nic_tx; /* [nodes * nics] */
  struct sim_port* nic_rx;
  struct sim_port* up_tx; /* [nodes]: the node's share of an oversubscribed core */
  struct sim_port* up_rx;
  struct sim_port* shm_tx; /* [ranks] */
  struct sim_port* shm_rx;
};

ncclResult_t sim_net_init(struct sim_net* n, const struct sim_cluster* c, int nodes, int ranks);
void sim_net_free(struct sim_net* n);
void sim_net_reset(struct sim_net* n);

/* A message of `bytes` offered at `ready` (us) from rank `from` (at
 * simulated node `snode`, simulated rank `srank`) to rank `to` (at
 * simulated node `dnode`, rank `drank`): when the sender's port is done
 * with it (*sent) and when it has all arrived (*arrived). */
void sim_net_send(struct sim_net* n, int from, int to, int snode, int srank, int dnode, int drank,
                  double bytes, double ready, double* sent, double* arrived);

#endif /* BRAID_SIM_NET_H_ */
