/*
 * Direct: the one-pass intra-node algorithm (DESIGN.md 4). Where every
 * rank of a node reaches every peer's buffers (CUDA IPC, threads of one
 * process), one fused task per rank does the whole collective: rank r
 * takes its slice, reduces it from every rank's input in rank order (so
 * every rank's bits agree), and writes the result to every rank's output.
 * Each input byte is read once and each output byte written once (2kS for
 * an all-reduce of S bytes on k ranks), with no scratch; the slices are
 * disjoint, so the ranks' tasks may run in any order or at once, and in
 * place is safe. The plan is data: for each source and destination, which
 * rank's buffer and which element.
 */
#ifndef BRAID_DIRECT_H_
#define BRAID_DIRECT_H_

#include <stddef.h>

#include "nccl.h"

#define DIRECT_MAX_RANKS 8 /* a task's sources and destinations */

/* DIRECT_SCRATCH: the rank's own staging buffer, which holds its slice
 * only (offsets from the slice's start). */
enum direct_buf { DIRECT_SEND = 0, DIRECT_RECV = 1, DIRECT_SCRATCH = 2, DIRECT_NBUFS = 3 };

/* An element of a rank's send or receive buffer. */
struct direct_ref {
  int rank;
  int buf; /* enum direct_buf */
  size_t off;
};

/* Sources combined in order (one: a copy), the result to every
 * destination; n elements from each ref on. n == 0: nothing to do. */
struct direct_task {
  size_t n;
  int nsrcs, ndsts;
  struct direct_ref srcs[DIRECT_MAX_RANKS];
  struct direct_ref dsts[DIRECT_MAX_RANKS];
};

/* Rank `rank`'s task for collective `coll` (enum sched_coll) on `nranks`
 * ranks. `count` as in exec_args: the per-rank block for all-gather and
 * reduce-scatter (placed every `stride` elements, 0: count), else the
 * whole buffer; slices start on multiples of `align` elements (whole
 * 16-byte vectors). ncclInvalidArgument for more than DIRECT_MAX_RANKS. */
ncclResult_t direct_plan(int coll, int rank, int nranks, int root, size_t count, size_t stride,
                         size_t align, struct direct_task* t);

/* An all-reduce's task cut in two around a stage between nodes (Hier on
 * devices): `reduce` reduces this rank's slice from every rank's input into
 * its scratch, `spread` writes the scratch (all-reduced between the nodes
 * meanwhile) to every rank's output. *lo: the slice's first element. */
ncclResult_t direct_plan_staged(int rank, int nranks, size_t count, size_t align,
                                struct direct_task* reduce, struct direct_task* spread, size_t* lo);

#endif /* BRAID_DIRECT_H_ */
