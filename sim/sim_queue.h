/*
 * braid-sim's containers (sim_queue.c): connections by peer, each with
 * its queue of arrival times, and the heap of events in time order.
 */
#ifndef BRAID_SIM_QUEUE_H_
#define BRAID_SIM_QUEUE_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* One direction of a rank's link with `peer`. */
struct sim_conn {
  int peer;    /* -1: an empty slot of the map */
  double last; /* outgoing: when its last send was offered */
  double* t;   /* incoming: arrival times not yet taken, oldest at head */
  uint32_t head, n, cap;
};

/* Connections by peer, open addressing: ring and chain ranks have 2,
 * trees 6, recursive doubling 2 log n. */
struct sim_map {
  struct sim_conn* slots;
  uint32_t cap, n;
};

void sim_map_free(struct sim_map* m);
/* The connection with `peer`, made empty if new. */
ncclResult_t sim_map_get(struct sim_map* m, int peer, struct sim_conn** out);
ncclResult_t sim_conn_push(struct sim_conn* c, double t);
/* The oldest arrival, taken (the caller checked c->n). */
double sim_conn_pop(struct sim_conn* c);

enum sim_event_kind {
  SIM_EV_COMPUTE = 0, /* a step's reduction or copy on the rank's CPU */
  SIM_EV_SEND = 1,    /* a send's CPU work, then its offer to the network */
  SIM_EV_NET = 2      /* a send offered to the network */
};

/* Ordered by time, then the sender's index on its node, step and kind,
 * then rank: events at one instant are served in the same order whether
 * every rank is played or node 0's stand for all. */
struct sim_event {
  double t;
  int32_t local, rank;
  uint32_t step;
  uint8_t kind;
};

struct sim_heap {
  struct sim_event* e;
  size_t n, cap;
};

ncclResult_t sim_heap_push(struct sim_heap* h, struct sim_event ev);
struct sim_event sim_heap_pop(struct sim_heap* h);
void sim_heap_free(struct sim_heap* h);

#endif /* BRAID_SIM_QUEUE_H_ */
