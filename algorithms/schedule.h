/*
 * A schedule: one rank's ordered list of primitive steps on slices of the
 * user buffers. Algorithms compile collectives into schedules; the executor
 * runs them. Schedules are plain data: printable and testable offline.
 */
#ifndef BRAID_SCHEDULE_H_
#define BRAID_SCHEDULE_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* X is the input slice, Y the output slice (same offset), R what arrives.
 * A step's flags say where the op's pre-multiplier applies (to X) and where
 * the post-divide applies (to the result). */
enum sched_prim {
  PRIM_SEND,                  /* send X */
  PRIM_RECV,                  /* Y = R */
  PRIM_RECV_REDUCE_SEND,      /* send R op X   (partial, not stored) */
  PRIM_RECV_REDUCE_COPY_SEND, /* Y = R op X; send Y */
  PRIM_RECV_COPY_SEND,        /* Y = R; send Y */
  PRIM_RECV_REDUCE_COPY,      /* Y = R op X */
  PRIM_COPY,                  /* Y = X */
  PRIM_SEND_OUT,              /* send Y */
  PRIM_EXCHANGE,              /* send Y to peer, receive R from it; Y = Y op R */
  PRIM_COUNT
};

#define SCHED_PRE 1u  /* X is read pre-multiplied */
#define SCHED_POST 2u /* the result is post-divided: it is final */
#define SCHED_SWAP 4u /* exchange computes R op Y: the lower rank's data first */

struct sched_step {
  uint8_t prim;
  uint8_t flags;
  int32_t recv_peer; /* rank received from, -1 if none */
  int32_t send_peer; /* rank sent to, -1 if none */
  size_t offset;     /* first element of the slice */
  size_t count;      /* elements in the slice (> 0) */
};

enum sched_algo { ALGO_RING = 0, ALGO_RD = 1, ALGO_COUNT };

const char* sched_algo_name(int algo);

/* What a schedule was built for; a comm reuses it when the key matches. */
struct sched_key {
  int algo;
  int rank;
  int nranks;
  size_t count;
  size_t elem_size;
  size_t chunk_bytes;
  int slices_per_step; /* per iteration; at most half the executor window */
};

struct schedule {
  struct sched_key key;
  int valid;
  struct sched_step* steps;
  size_t nsteps;
  size_t capacity;
};

/* Make room for `n` steps (grows only; the comm keeps the memory). */
ncclResult_t sched_reserve(struct schedule* s, size_t n);
ncclResult_t sched_append(struct schedule* s, enum sched_prim prim, unsigned flags, int recv_peer,
                          int send_peer, size_t offset, size_t count);
void sched_free(struct schedule* s);

/* 1 when the primitive receives / sends. */
int sched_prim_recvs(enum sched_prim p);
int sched_prim_sends(enum sched_prim p);
const char* sched_prim_name(enum sched_prim p);

/* Ring all-reduce: reduce-scatter then all-gather around rank order, each
 * of the nranks segments cut into slices of at most chunk_bytes. */
ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* key);

/* Recursive doubling all-reduce: log2 rounds of whole-buffer exchanges
 * between partners, non-power-of-two ranks folded in first and served last.
 * Few hops: the small-message algorithm. */
ncclResult_t rd_schedule_allreduce(struct schedule* s, const struct sched_key* key);

/* Peers rank `rank` sends to and receives from under recursive doubling
 * (at most 2 + log2(nranks)); returns how many were written to `peers`. */
int rd_peers(int rank, int nranks, int* peers, int max);

/* Build (or reuse) the schedule for `key`. */
ncclResult_t sched_build(struct schedule* s, const struct sched_key* key);

#endif /* BRAID_SCHEDULE_H_ */
