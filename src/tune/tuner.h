/*
 * The tuner (tuner.c): per call, the algorithm and chunk from the comm's
 * cost model (tuner_model.h), or what NCCL_ALGO or a tune file forces.
 */
#ifndef BRAID_TUNER_H_
#define BRAID_TUNER_H_

#include <stddef.h>

#include "nccl.h"
#include "tune/tuner_model.h"

struct ncclComm;

/* Modelled time (us) of `algo` for `coll` on a buffer of `bytes`. */
double tuner_cost(const struct tuner_model* m, int coll, int algo, double bytes);
/* Pipeline chunk for a call. */
size_t tuner_chunk(const struct tuner_model* m, int coll, int algo, size_t bytes);
/* The algorithm tuner_choose would take for a host call, silently, and
 * its modelled time (us). */
double tuner_host_best(const struct ncclComm* comm, int coll, size_t bytes, int* algo);

/* The choice on a model and layout alone (braid-sim asks it of clusters
 * no comm spans); returns 1 when a tune file forced it. */
int tuner_pick(const struct tuner_model* m, const struct sched_topo* layout, int coll, size_t bytes,
               int canonical, int* algo, size_t* chunk_bytes);
/* Algorithm and chunk size for `coll` on a buffer of `bytes`; with
 * `canonical` (the deterministic mode) a reduction gets Pairwise. */
void tuner_choose(const struct ncclComm* comm, int coll, size_t bytes, int canonical, int* algo,
                  size_t* chunk_bytes);
/* The model's table for this comm, at INFO/TUNING. */
void tuner_log_table(const struct ncclComm* comm);
/* The algorithms the tuner chooses among (NCCL_ALGO; all but Pairwise
 * when unset), a bit mask of enum sched_algo. */
unsigned tuner_allowed(void);
/* NCCL_ALGO syntax to a bit mask of enum sched_algo (exposed for tests). */
unsigned tuner_parse_algos(const char* s);
/* Whether NCCL_ALGO allows the direct algorithm on device buffers (it is
 * not a schedule: src/cuda/cuda_direct.h), and whether it names it (then a
 * call it fits runs direct even where it could have run gated). */
int tuner_allows_direct(void);
int tuner_forces_direct(void);

#endif /* BRAID_TUNER_H_ */
