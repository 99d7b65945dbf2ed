/*
 * The schedule cases test_schedule checks on the fake transport, as data:
 * every collective x algorithm x rank count x layout it runs, and running
 * one case with its expected output checked. test_executor runs the same
 * cases again on a backend that completes tasks late and out of order.
 */
#ifndef BRAID_TESTS_SCHED_CASES_H_
#define BRAID_TESTS_SCHED_CASES_H_

#include <stddef.h>
#include <stdint.h>

#include "fake_transport.h"

struct sched_case {
  const uint64_t* hosts; /* NULL: one node */
  const int* cache;      /* the L2 each rank is bound inside (sched_topo_place); NULL: none */
  int coll, algo, n;
  size_t count;
  ncclDataType_t type; /* ncclFloat, ncclInt32 or ncclDouble */
  ncclRedOp_t op;      /* ncclSum, ncclMax or ncclAvg */
  int root, inplace;
  size_t chunk;
  int window;
};

typedef void (*sched_case_fn)(const struct sched_case* c, void* arg);

/* The matrices, one per test of test_schedule. */
void sched_cases_allreduce(sched_case_fn fn, void* arg);
void sched_cases_collectives(sched_case_fn fn, void* arg);
void sched_cases_windows(sched_case_fn fn, void* arg);
void sched_cases_layouts(sched_case_fn fn, void* arg);

/* Node layouts the issue names, plus ranks placed round-robin over nodes
 * (so ring order differs from rank order), and ranks bound round-robin
 * over caches inside their nodes (so each node's order is not rank
 * order either). */
struct sched_layout {
  int n;
  uint64_t hosts[FAKE_MAXR];
  int bound;            /* cache holds the ranks' caches */
  int cache[FAKE_MAXR]; /* per rank, the L2 it is bound inside */
};
/* The layout's caches for sched_topo_place, NULL where it has none. */
const int* sched_layout_cache(const struct sched_layout* L);
extern const struct sched_layout sched_layouts[];
extern const size_t sched_nlayouts;

/* The buffers of one run: what each rank's output holds afterwards. */
struct sched_run {
  int n;
  void* mem[FAKE_MAXR];
  void* send[FAKE_MAXR];
  void* recv[FAKE_MAXR];
  size_t recv_bytes;
  uint64_t lent, in_place; /* lending runs: messages lent, sends taken in place */
};

/* Run `c` on a fresh world whose tasks run on `backend` (per-rank states,
 * may be NULL) and check every output element against its expected value;
 * the outputs stay in `run` until sched_run_free. */
void sched_case_run(const struct sched_case* c, const struct exec_backend* backend,
                    void* const* states, struct sched_run* run);
/* The same over a transport that lends receives and takes sends in place
 * (fake_world_lend). */
void sched_case_run_lending(const struct sched_case* c, const struct exec_backend* backend,
                            void* const* states, struct sched_run* run);
/* The same with the buffers labelled device memory: the call runs staged
 * (executor.h) with `backend` as the device backend, and the fake
 * transport refuses any buffer but a slot. */
void sched_case_run_staged(const struct sched_case* c, const struct exec_backend* backend,
                           void* const* states, struct sched_run* run);
/* `c` on the host CPU backend, unchecked: a reference to compare another
 * run's bytes with (test_schedule checks these same runs). */
void sched_case_run_reference(const struct sched_case* c, struct sched_run* run);
void sched_run_free(struct sched_run* run);
/* A line naming the case, for failure messages. */
void sched_case_describe(const struct sched_case* c, char* buf, size_t len);

#endif /* BRAID_TESTS_SCHED_CASES_H_ */
