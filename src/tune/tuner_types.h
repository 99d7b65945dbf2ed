/*
 * The tuner's cost model of one communicator: its links (inside a node and
 * between nodes, each the cost of the transport the table picks there),
 * the layout, and the choices a tune file forces. Types only: the comm
 * holds one (comm.h), tuner_model.c builds it, tuner.c reads it.
 */
#ifndef BRAID_TUNER_TYPES_H_
#define BRAID_TUNER_TYPES_H_

#include <stddef.h>
#include <stdint.h>

#include "schedule.h"
#include "transport.h"

/* time = hops * alpha + KB moved * beta, per algorithm over this link. */
struct tuner_link {
  double alpha_us[ALGO_MAX];
  double beta_us_per_kb[ALGO_MAX];
};

#define TUNER_MAX_FORCED 64

/* A tune file's "force" line: calls of `coll` from lo to hi bytes. */
struct tuner_forced {
  int coll, algo;
  size_t lo, hi, chunk; /* chunk 0: the tuner's */
};

struct tuner_model {
  int nranks, nnodes, min_ppn, max_ppn, tree_depth;
  /* the transports that join ranks inside a node and across nodes (the
   * table's choice, transports/transport.h); their link costs below */
  const struct transport* intra_transport;
  const struct transport* net_transport;
  double oversub;              /* most ranks per core on any node */
  uint32_t nic_mbps, mem_mbps; /* slowest rank's; 0: unknown */
  double wire_us_per_kb;       /* the NIC's line rate across nodes; 0: unknown or one node */
  double wire_latency_us;      /* the network's own latency, where it says (a net plugin) */
  double tree_sharers;         /* a node's NIC load in the double tree (tuner_tree_sharers) */
  /* a rank's cost per KB it reduces, beside what its links cost; 0 where
   * the link lines were fitted on calls that reduce (the library's own:
   * tuner_model.c) */
  double reduce_us_per_kb;
  size_t slot_bytes;
  int slices_per_step; /* the executor's window / 2, as schedules see it */
  int hier_pipelined;  /* Hier all-reduce overlaps node and network stages */
  struct tuner_link intra, net;
  /* the network for a rank that crosses it alone while its node's other
   * ranks wait (Hier's leaders): its CPU is not shared with theirs */
  struct tuner_link net_alone;
  int nforced;
  struct tuner_forced forced[TUNER_MAX_FORCED];
};

#endif /* BRAID_TUNER_TYPES_H_ */
