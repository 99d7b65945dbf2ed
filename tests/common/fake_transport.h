/*
 * An in-memory rendezvous transport for unit tests, and a world of ranks
 * wired by it: every rank's executor context in one thread, no comm, no
 * network. Message k of a sender lands in message k of its receiver once
 * both are posted, and only then do both complete (a send waits for its
 * receive, the hardest order for an executor).
 */
#ifndef BRAID_TESTS_FAKE_TRANSPORT_H_
#define BRAID_TESTS_FAKE_TRANSPORT_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/executor.h"
#include "schedule.h"
#include "transport.h"

#define FAKE_MAXR 8

/* One direction between two ranks. */
struct fake_conn {
  struct transport_conn base;
  struct fake_conn* other;
  void* bufs[TRANSPORT_MAX_INFLIGHT];
  size_t lens[TRANSPORT_MAX_INFLIGHT];
  void* regs[TRANSPORT_MAX_INFLIGHT]; /* each message's registration handle */
  int mismatches;                     /* messages whose sizes differed at both ends */
  /* lending (fake_world_lend): receive, each message's own buffer and
   * whether it is lent; send, the room for a send in place */
  unsigned char* lend_mem;
  size_t lend_bytes;
  int lent[TRANSPORT_MAX_INFLIGHT];
  int in_place[TRANSPORT_MAX_INFLIGHT];
  uint64_t nlent, nin_place; /* messages lent, sends taken in place */
};

extern const struct transport fake_transport;
extern const struct transport fake_lending_transport;

struct fake_world {
  int n;
  struct sched_topo topo; /* nranks 0: one node */
  struct exec_ctx ex[FAKE_MAXR];
  struct transport_conn* send[FAKE_MAXR][FAKE_MAXR];
  struct transport_conn* recv[FAKE_MAXR][FAKE_MAXR];
  struct fake_conn conns[FAKE_MAXR][FAKE_MAXR][2]; /* [from][to][send=0/recv=1] */
  _Atomic int aborted;
};

/* n ranks with executor contexts of `window` steps and `slot_bytes` slots
 * running their tasks on `backend` (states[r] for rank r; NULL states: all
 * NULL); `hosts` (NULL: one node) places the ranks on nodes. */
void fake_world_init(struct fake_world* w, int n, size_t slot_bytes, int window,
                     const uint64_t* hosts, const struct exec_backend* backend,
                     void* const* states);
void fake_world_free(struct fake_world* w);
/* Bind the world's ranks inside L2 caches (cache[r]: rank r's, equal =
 * one cache, -1: none), as a comm learns it from its peers: on one node,
 * the layout re-pairs Pairwise's partners (sched_topo_place). */
void fake_world_place(struct fake_world* w, const int* cache);
/* Make the world's transport lend receives and take sends in place
 * (transport.h) for messages up to `bytes`: what a lent message or a send
 * space held is poisoned once given back or sent, so a reader that looks
 * again sees garbage. */
void fake_world_lend(struct fake_world* w, size_t bytes);
/* How many messages the world's transport lent and took in place. */
void fake_world_lend_counts(const struct fake_world* w, uint64_t* lent, uint64_t* in_place);

/* Run one call on every rank (args[r]), interleaving their progress until
 * all are done; fails the test on an error, a hang or a size mismatch. */
void fake_world_run(struct fake_world* w, const struct exec_args* args);

/* The call of rank r: a built-in op resolved as a comm of n ranks would. */
void fake_args(struct exec_args* a, int n, int coll, int algo, int root, const void* send,
               void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, size_t chunk);

#endif /* BRAID_TESTS_FAKE_TRANSPORT_H_ */
