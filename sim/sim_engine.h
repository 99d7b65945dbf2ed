/*
 * braid-sim's engine (sim_engine.c): plays ranks' schedules as the
 * executor runs them, in simulated time over sim_net's ports.
 *
 * A rank posts steps up to the window ahead of the oldest unretired one
 * (a new piece of a call only once the last is all retired), computes
 * them in order on its one CPU (a receive waits for its message; a
 * reduction or copy costs its bytes at the rank's rate; each message sent
 * or taken costs msg_us, inside a node intra_msg_us), sends a step's
 * result when it is computed (a plain send of data in place as soon as it
 * is posted and every earlier send on that connection has gone, an
 * exchange once the steps before it are done), and retires a step once
 * its send has left. Every use of a CPU or a port happens in time order
 * (a heap of events), first come, first served.
 *
 * Symmetric play: where every node's schedules are node 0's moved by a
 * map of nodes (sim_symmetry.h), the ranks of node 0 stand for all: a
 * message node 0 sends to node n is what the node the map takes to 0
 * with it sends to node 0, and arrives there.
 */
#ifndef BRAID_SIM_ENGINE_H_
#define BRAID_SIM_ENGINE_H_

#include <stddef.h>
#include <stdint.h>

#include "sim_cluster.h"
#include "sim_symmetry.h"

/* A step as the engine needs it (schedule.h's, less the offsets). */
struct sim_step {
  int32_t recv, send; /* ranks, -1: none */
  uint32_t bytes;
  uint8_t prim;        /* enum sched_prim */
  uint8_t piece_first; /* the first step of a piece after the first */
  /* A plain send of output bytes that step i - y_wait writes (the latest
   * such within the window; 0: none): it waits for that step's compute,
   * as the executor's send_may_go does. The call is played out of place:
   * sends of the input never wait. */
  uint16_t y_wait;
};

struct sim_plan {
  const struct sim_cluster* c;
  int symmetric;           /* node 0's ranks stand for every node's */
  int nsim;                /* ranks played: per_node when symmetric, else nranks */
  struct sim_step** steps; /* [nsim] */
  size_t* nsteps;
};

struct sim_stats {
  double end_us;     /* when the last rank retired its last step */
  uint64_t messages; /* played (each standing for nnodes in symmetric play) */
  uint64_t steps;
};

/* Plays the plan from time 0; ncclInternalError, naming the rank and its
 * step, if some rank waits for a message nobody sends. */
ncclResult_t sim_play(const struct sim_plan* p, struct sim_stats* out);

#endif /* BRAID_SIM_ENGINE_H_ */
