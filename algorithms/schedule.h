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
 * Wherever X is read the op's pre-multiplier applies; wherever a final
 * result is produced (steps marked final below) the post-divide applies. */
enum sched_prim {
  PRIM_SEND,                  /* send X */
  PRIM_RECV,                  /* Y = R                         (final data) */
  PRIM_RECV_REDUCE_SEND,      /* send R op X   (partial, not stored) */
  PRIM_RECV_REDUCE_COPY_SEND, /* Y = R op X; send Y            (final) */
  PRIM_RECV_COPY_SEND,        /* Y = R; send Y */
  PRIM_RECV_REDUCE_COPY,      /* Y = R op X                    (final) */
  PRIM_COPY,                  /* Y = X                         (final) */
  PRIM_COUNT
};

struct sched_step {
  uint8_t prim;
  int32_t recv_peer; /* rank received from, -1 if none */
  int32_t send_peer; /* rank sent to, -1 if none */
  size_t offset;     /* first element of the slice */
  size_t count;      /* elements in the slice (> 0) */
};

enum sched_algo { ALGO_RING = 0, ALGO_COUNT };

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
ncclResult_t sched_append(struct schedule* s, enum sched_prim prim, int recv_peer,
                          int send_peer, size_t offset, size_t count);
void sched_free(struct schedule* s);

/* 1 when the primitive reads R / writes Y / sends / produces final data. */
int sched_prim_recvs(enum sched_prim p);
int sched_prim_sends(enum sched_prim p);
int sched_prim_reads_input(enum sched_prim p);
int sched_prim_is_final(enum sched_prim p);
const char* sched_prim_name(enum sched_prim p);

/* Ring all-reduce: reduce-scatter then all-gather around rank order, each
 * of the nranks segments cut into slices of at most chunk_bytes. */
ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* key);

/* Build (or reuse) the schedule for `key`. */
ncclResult_t sched_build(struct schedule* s, const struct sched_key* key);

#endif /* BRAID_SCHEDULE_H_ */
