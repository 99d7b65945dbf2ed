/*
 * The cluster braid-sim plays Braid's schedules on (sim_cluster.c): nodes
 * of `per_node` ranks, the link inside a node, NICs per node, the fabric
 * between them (a fat tree, full or oversubscribed, or rails), and the
 * costs a rank pays itself: per message and per byte reduced or copied.
 * Ranks are placed in blocks (rank = node * per_node + local), as
 * launchers place them.
 */
#ifndef BRAID_SIM_CLUSTER_H_
#define BRAID_SIM_CLUSTER_H_

#include <stddef.h>

#include "nccl.h"
#include "schedule.h"

enum sim_fabric { SIM_FAT_TREE = 0, SIM_RAILS = 1 };

struct sim_cluster {
  int nranks, per_node, nnodes;
  int nics;            /* per node; rank l uses NIC l % nics */
  double nic_gbps;     /* per NIC and direction, Gbit/s */
  double net_lat_us;   /* NIC to NIC through the fabric, one way */
  size_t burst_bytes;  /* a token bucket on each NIC (tc tbf), 0: none */
  double wire_gbps;    /* the rate while its tokens last */
  double intra_gbps;   /* one rank to another inside a node (shared memory) */
  double intra_lat_us; /* a hop inside a node */
  double msg_us;       /* a rank's CPU time per message it sends, and the receiver's */
  double intra_msg_us; /* the same for a message inside a node (shared memory) */
  double reduce_gbps;  /* a rank reducing: bytes of each input per second, Gbit/s */
  double copy_gbps;    /* a rank copying */
  double oversub;      /* fat tree: bisection = nodes * nics * nic / oversub (1: full) */
  enum sim_fabric fabric;
  double rail_cross_us; /* rails: a message between two rails crosses the spine */
  int window;           /* the executor's steps in flight (BRAID_NSTEPS) */
  size_t slot_bytes;    /* its slot, the largest chunk (BRAID_CHUNK_SIZE) */
  int tune_links;       /* 1: the tuner prices links from these figures, as a BRAID_TUNE_FILE
                         * written for the cluster would; 0: the library's own lines */
  int host_cores;       /* > 0: every rank's CPU work shares this many cores (emulated
                         * clusters: all their hosts are one machine); 0: a core per rank */
  double sock_gbps;     /* > 0: a rank's CPU moves a network message's bytes through the
                         * kernel at this rate, sending and receiving; 0: free */
};

/* The defaults: 8 ranks a node, one 100 Gbit/s NIC, a full fat tree, the
 * library's window and slot. */
void sim_cluster_defaults(struct sim_cluster* c);
/* Apply "name=value" (a field above by its name, fabric=fat|rails);
 * ncclInvalidArgument with a message naming it otherwise. */
ncclResult_t sim_cluster_set(struct sim_cluster* c, const char* assignment);
/* nnodes from nranks and per_node; ncclInvalidArgument unless per_node
 * divides nranks and every figure is positive. */
ncclResult_t sim_cluster_check(struct sim_cluster* c);
/* One line describing it, for the tables' headers. */
void sim_cluster_describe(const struct sim_cluster* c, char* out, size_t size);

/* The layout a comm over this cluster would have (layout.h), block placement. */
ncclResult_t sim_cluster_layout(const struct sim_cluster* c, struct sched_topo* t);

#endif /* BRAID_SIM_CLUSTER_H_ */
