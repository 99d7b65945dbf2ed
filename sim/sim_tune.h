/*
 * The tuner's view of a simulated cluster (sim_tune.c): the cost model a
 * comm spanning it would build (tuner_types.h), so braid-sim asks the
 * library's own tuner what it would pick and with which chunk.
 */
#ifndef BRAID_SIM_TUNE_H_
#define BRAID_SIM_TUNE_H_

#include "sim_cluster.h"
#include "tune/tuner_types.h"

/* Shared memory inside a node, sockets across, the NIC's and the copy's
 * speeds from the cluster, one rank per core. */
void sim_tune_model(const struct sim_cluster* c, const struct sched_topo* t, struct tuner_model* m);

#endif /* BRAID_SIM_TUNE_H_ */
