/*
 * Message timing over the simulated ports (sim_net.h).
 */
#include "sim_net.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

ncclResult_t sim_net_init(struct sim_net* n, const struct sim_cluster* c, int nodes, int ranks) {
  ncclResult_t res = ncclSuccess;
  memset(n, 0, sizeof(*n));
  n->c = c, n->nodes = nodes, n->ranks = ranks;
  size_t nics = (size_t)nodes * (size_t)c->nics;
  CHECK(braid_calloc(&n->nic_tx, nics, sizeof(double)));
  CHECK(braid_calloc(&n->nic_rx, nics, sizeof(double)));
  CHECK(braid_calloc(&n->up_tx, (size_t)nodes, sizeof(double)));
  CHECK(braid_calloc(&n->up_rx, (size_t)nodes, sizeof(double)));
  CHECK(braid_calloc(&n->shm_tx, (size_t)ranks, sizeof(double)));
  CHECK(braid_calloc(&n->shm_rx, (size_t)ranks, sizeof(double)));
  return ncclSuccess;
fail:
  sim_net_free(n);
  return res;
}

void sim_net_free(struct sim_net* n) {
  free(n->nic_tx), free(n->nic_rx), free(n->up_tx), free(n->up_rx);
  free(n->shm_tx), free(n->shm_rx);
  memset(n, 0, sizeof(*n));
}

void sim_net_reset(struct sim_net* n) {
  size_t nics = (size_t)n->nodes * (size_t)n->c->nics;
  memset(n->nic_tx, 0, nics * sizeof(double));
  memset(n->nic_rx, 0, nics * sizeof(double));
  memset(n->up_tx, 0, (size_t)n->nodes * sizeof(double));
  memset(n->up_rx, 0, (size_t)n->nodes * sizeof(double));
  memset(n->shm_tx, 0, (size_t)n->ranks * sizeof(double));
  memset(n->shm_rx, 0, (size_t)n->ranks * sizeof(double));
}

/* A message's progress along its path: when the last port began it and
 * when it finished it. */
struct sim_hop {
  double start, end;
};

/* The next port on the path, `lat` after the last: it begins the message
 * when free and once the bytes reach it, ends it at its own rate but
 * never before the last port ended it plus the latency. */
static void hop_through(struct sim_hop* h, double* port, double us_per_byte, double bytes,
                        double lat) {
  double start = MAX(h->start + lat, *port);
  double end = MAX(start + bytes * us_per_byte, h->end + lat);
  *port = end;
  h->start = start, h->end = end;
}

/* Gbit/s to microseconds per byte. */
static double us_per_byte(double gbps) {
  return 8.0 / (gbps * 1000.0);
}

void sim_net_send(struct sim_net* n, int from, int to, int snode, int srank, int dnode, int drank,
                  double bytes, double ready, double* sent, double* arrived) {
  const struct sim_cluster* c = n->c;
  struct sim_hop h = {ready, ready};
  if (from / c->per_node == to / c->per_node) { /* shared memory inside the node */
    double x = us_per_byte(c->intra_gbps);
    hop_through(&h, &n->shm_tx[srank], x, bytes, 0);
    *sent = h.end;
    hop_through(&h, &n->shm_rx[drank], x, bytes, c->intra_lat_us);
    *arrived = h.end;
    return;
  }
  int snic = (from % c->per_node) % c->nics, dnic = (to % c->per_node) % c->nics;
  double x = us_per_byte(c->nic_gbps), lat = c->net_lat_us;
  if (c->fabric == SIM_RAILS && snic != dnic) lat += c->rail_cross_us;
  hop_through(&h, &n->nic_tx[snode * c->nics + snic], x, bytes, 0);
  *sent = h.end;
  if (c->fabric == SIM_FAT_TREE && c->oversub > 1) { /* the node's share of the core */
    double core = x * c->oversub / c->nics;
    hop_through(&h, &n->up_tx[snode], core, bytes, 0);
    hop_through(&h, &n->up_rx[dnode], core, bytes, 0);
  }
  hop_through(&h, &n->nic_rx[dnode * c->nics + dnic], x, bytes, lat);
  *arrived = h.end;
}
