/*
 * The wire in braid-sim (sim_net.c): what a message crosses and when it
 * arrives. Every port (a NIC's send and receive side, a node's uplink and
 * downlink when the fat tree is oversubscribed, a rank's shared-memory
 * side) serves messages one after another in the order they are offered,
 * which the engine keeps in time order; a message cuts through: a port
 * starts on it once the one before has begun it and one latency passed.
 */
#ifndef BRAID_SIM_NET_H_
#define BRAID_SIM_NET_H_

#include "sim_cluster.h"

/* When each port is next free (us). Nodes and ranks are the simulated ones
 * (the symmetric mode keeps node 0's alone). */
struct sim_net {
  const struct sim_cluster* c;
  int nodes, ranks;
  double* nic_tx; /* [nodes * nics] */
  double* nic_rx;
  double* up_tx; /* [nodes]: the node's share of an oversubscribed core */
  double* up_rx;
  double* shm_tx; /* [ranks] */
  double* shm_rx;
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
