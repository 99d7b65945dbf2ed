/*
 * One simulated call (sim_run.c): the schedules Braid's builders make for
 * it on every rank (through the executor's own keys and pieces), played
 * by the engine, symmetric where the schedules allow. Where full play
 * would take more than a budget of steps, the time is extrapolated from
 * two smaller calls with the same chunk, both past the pipeline's fill
 * (time grows linearly with bytes there); the result says so.
 */
#ifndef BRAID_SIM_RUN_H_
#define BRAID_SIM_RUN_H_

#include <stddef.h>
#include <stdint.h>

#include "engine/executor.h"
#include "schedule.h"
#include "sim_cluster.h"
#include "tune/tuner_types.h"

#define SIM_FULL 1u  /* play every rank, even where node 0's could stand for all */
#define SIM_EXACT 2u /* never extrapolate */

/* nccl-tests' sizes: `bytes` is the whole buffer (an all-gather's output,
 * a reduce-scatter's input); floats, summed. With `repeat` > 1 the call
 * runs that many times back to back, as a benchmark's loop does, and the
 * time is that of one call in the loop (the last ones' mean): a port's
 * token bucket, full before the first call, is what the loop leaves. */
struct sim_call {
  int coll, algo, root;
  size_t bytes;
  int repeat; /* 0 or 1: once, from idle */
};

struct sim_result {
  double us; /* -1: not played (too_big) */
  size_t chunk;
  int symmetric, extrapolated;
  int too_big;              /* more steps than the budget, and no smaller call of the
                             * same shape to extrapolate from (fewer elements than ranks) */
  uint64_t messages, steps; /* played */
};

/* What every call on one cluster shares. */
struct sim_context {
  const struct sim_cluster* c;
  struct sched_topo topo;
  struct tuner_model model;
  struct exec_ctx ex;    /* keys and pieces, as a comm's executor makes them */
  struct schedule sched; /* built and reused */
  size_t step_budget;    /* most steps played in full (SIM_STEP_BUDGET) */
};

#define SIM_STEP_BUDGET ((size_t)8 << 20)

ncclResult_t sim_context_init(struct sim_context* s, const struct sim_cluster* c);
void sim_context_free(struct sim_context* s);

/* The call's time on the cluster; ncclInvalidArgument where the
 * algorithm does not implement the collective there. */
ncclResult_t sim_collective(struct sim_context* s, const struct sim_call* call, unsigned flags,
                            struct sim_result* out);

/* What the library's tuner picks for the call. */
int sim_tuner_pick(struct sim_context* s, int coll, size_t bytes);
/* nccl-tests' bus bandwidth factor. */
double sim_busbw_factor(int coll, int nranks);

#endif /* BRAID_SIM_RUN_H_ */
