/*
 * The tuner's cost model of one communicator (tuner_types.h), built once
 * at init from the peer table (tuner_model.c), so every rank holds the
 * same.
 */
#ifndef BRAID_TUNER_MODEL_H_
#define BRAID_TUNER_MODEL_H_

#include <stddef.h>

#include "nccl.h"
#include "schedule.h"
#include "tune/tuner_types.h"

struct ncclComm;

/* The model for a comm whose peer table and layout are known; reads
 * BRAID_TUNE_FILE (ncclInvalidArgument, with a WARN naming the line, if
 * it is malformed). */
ncclResult_t tuner_model_init(struct ncclComm* comm);

/* The link costs (intra, net) of a model whose transports, layout, NIC
 * and memory speeds and ranks per core are filled in: what init does
 * last, and what braid-sim does for a cluster it describes. */
void tuner_model_price(struct tuner_model* m);

/* What a node's NIC carries in the double tree over this layout, in
 * units of twice the buffer one rank moves (the most on any node; at
 * least 1). */
double tuner_tree_sharers(const struct sched_topo* t);

#endif /* BRAID_TUNER_MODEL_H_ */
