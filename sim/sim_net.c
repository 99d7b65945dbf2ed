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
  CHECK(braid_calloc(&n->nic_tx, nics, sizeof(struct sim_port)));
  CHECK(braid_calloc(&n->nic_rx, nics, sizeof(struct sim_port)));
  CHECK(braid_calloc(&n->up_tx, (size_t)nodes, sizeof(struct sim_port)));
  CHECK(braid_calloc(&n->up_rx, (size_t)nodes, sizeof(struct sim_port)));
  CHECK(braid_calloc(&n->shm_tx, (size_t)ranks, sizeof(struct sim_port)));
  CHECK(braid_calloc(&n->shm_rx, (size_t)ranks, sizeof(struct sim_port)));
  sim_net_reset(n);
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

static void ports_reset(struct sim_port* p, size_t n, double tokens) {
  for (size_t i = 0; i < n; i++) p[i] = (struct sim_port){0, tokens, 0};
}

/* Every port free at 0, every bucket full. */
void sim_net_reset(struct sim_net* n) {
  size_t nics = (size_t)n->nodes * (size_t)n->c->nics;
  ports_reset(n->nic_tx, nics, (double)n->c->burst_bytes);
  ports_reset(n->nic_rx, nics, (double)n->c->burst_bytes);
  ports_reset(n->up_tx, (size_t)n->nodes, 0);
  ports_reset(n->up_rx, (size_t)n->nodes, 0);
  ports_reset(n->shm_tx, (size_t)n->ranks, 0);
  ports_reset(n->shm_rx, (size_t)n->ranks, 0);
}

/* A message's progress along its path: when the last port began it and
 * when it finished it. */
struct sim_hop {
  double start, end;
};

/* Gbit/s to bytes per microsecond. */
static double bytes_per_us(double gbps) {
  return gbps * 1000.0 / 8.0;
}

/* How long a port takes over `bytes` from `start`: at `rate` (bytes/us),
 * or with a bucket of `burst` bytes at `peak` while its tokens last
 * (they come back at `rate`). */
static double port_time(struct sim_port* p, double bytes, double start, double rate, double burst,
                        double peak) {
  if (burst <= 0) return bytes / rate;
  double tokens = MIN(burst, p->tokens + rate * (start - p->at));
  double dur = MAX(bytes / peak, (bytes - tokens) / rate);
  p->tokens = MIN(burst, tokens + rate * dur - bytes);
  p->at = start + dur;
  return dur;
}

/* The next port on the path, `lat` after the last: it begins the message
 * when free and once the bytes reach it, ends it at its own pace but
 * never before the last port ended it plus the latency. */
static void hop_through(struct sim_hop* h, struct sim_port* port, double bytes, double lat,
                        double rate, double burst, double peak) {
  double start = MAX(h->start + lat, port->free);
  double dur = port_time(port, bytes, start, rate, burst, peak); /* once: it takes tokens */
  double end = MAX(start + dur, h->end + lat);
  port->free = end;
  h->start = start, h->end = end;
}

void sim_net_send(struct sim_net* n, int from, int to, int snode, int srank, int dnode, int drank,
                  double bytes, double ready, double* sent, double* arrived) {
  const struct sim_cluster* c = n->c;
  struct sim_hop h = {ready, ready};
  if (from / c->per_node == to / c->per_node) { /* shared memory inside the node */
    double r = bytes_per_us(c->intra_gbps);
    hop_through(&h, &n->shm_tx[srank], bytes, 0, r, 0, 0);
    *sent = h.end;
    hop_through(&h, &n->shm_rx[drank], bytes, c->intra_lat_us, r, 0, 0);
    *arrived = h.end;
    return;
  }
  int snic = (from % c->per_node) % c->nics, dnic = (to % c->per_node) % c->nics;
  double r = bytes_per_us(c->nic_gbps), lat = c->net_lat_us, burst = (double)c->burst_bytes;
  double peak = bytes_per_us(MAX(c->wire_gbps, c->nic_gbps));
  if (c->fabric == SIM_RAILS && snic != dnic) lat += c->rail_cross_us;
  hop_through(&h, &n->nic_tx[snode * c->nics + snic], bytes, 0, r, burst, peak);
  *sent = h.end;
  if (c->fabric == SIM_FAT_TREE && c->oversub > 1) { /* the node's share of the core */
    double core = r * c->nics / c->oversub;
    hop_through(&h, &n->up_tx[snode], bytes, 0, core, 0, 0);
    hop_through(&h, &n->up_rx[dnode], bytes, 0, core, 0, 0);
  }
  hop_through(&h, &n->nic_rx[dnode * c->nics + dnic], bytes, lat, r, burst, peak);
  *arrived = h.end;
}
