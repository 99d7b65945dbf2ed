/*
 * The tuner's cost model of one communicator: its links (inside a node and
 * between nodes, each the cost of the transport the table picks there),
 * the layout, and the choices a tune file forces.
 * Built once at init from the peer table, so every rank holds the same.
 */
#ifndef BRAID_TUNER_H_
#define BRAID_TUNER_H_

#include <stddef.h>
#include <stdio.h>

#include "nccl.h"
#include "schedule.h"
#include "transport.h"

/* time = hops * alpha + KB moved * beta, per algorithm over this link. */
struct tuner_link {
  double alpha_us[ALGO_COUNT];
  double beta_us_per_kb[ALGO_COUNT];
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
  size_t slot_bytes;
  int hier_pipelined; /* Hier all-reduce overlaps node and network stages */
  struct tuner_link intra, net;
  int nforced;
  struct tuner_forced forced[TUNER_MAX_FORCED];
};

struct ncclComm;

/* The model for a comm whose peer table and layout are known; reads
 * BRAID_TUNE_FILE (ncclInvalidArgument, with a WARN naming the line, if
 * it is malformed). */
ncclResult_t tuner_model_init(struct ncclComm* comm);

/* Modelled time (us) of `algo` for `coll` on a buffer of `bytes`. */
double tuner_cost(const struct tuner_model* m, int coll, int algo, double bytes);
/* The algorithm tuner_choose would take for a host call, silently, and
 * its modelled time (us). */
double tuner_host_best(const struct ncclComm* comm, int coll, size_t bytes, int* algo);
/* Pipeline chunk for a call. */
size_t tuner_chunk(const struct tuner_model* m, int coll, int algo, size_t bytes);

/* Tune file (tuner_file.c): parse into the model; and the forced choice
 * for a call, if a line covers it and NCCL_ALGO allows it. */
ncclResult_t tuner_file_read(const char* path, struct tuner_model* m);
/* The same on an open stream; `name` names it in WARNs. */
ncclResult_t tuner_file_parse(FILE* f, const char* name, struct tuner_model* m);
int tuner_file_choice(const struct tuner_model* m, int coll, size_t bytes, unsigned allowed,
                      int* algo, size_t* chunk);

#endif /* BRAID_TUNER_H_ */
