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

/* X is a slice of the input, Y a slice of the output, R what arrives; the
 * local operand L of a reduction is X, or with SCHED_LOCAL_CARRY the carry
 * that the step before left (a node with two children folds the first
 * child's data into the carry, the second child's into what it sends). A
 * step's flags say where the op's pre-multiplier applies (to X) and where
 * the post-divide applies (to the result). */
enum sched_prim {
  PRIM_SEND,                  /* send X */
  PRIM_RECV,                  /* Y = R */
  PRIM_RECV_REDUCE_SEND,      /* send R op L   (partial, not stored) */
  PRIM_RECV_REDUCE_COPY_SEND, /* Y = R op L; send Y */
  PRIM_RECV_COPY_SEND,        /* Y = R; send Y */
  PRIM_RECV_REDUCE_COPY,      /* Y = R op L */
  PRIM_COPY,                  /* Y = X */
  PRIM_SEND_OUT,              /* send Y */
  PRIM_EXCHANGE,              /* send Y to peer, receive R from it; Y = Y op R */
  PRIM_RECV_REDUCE_CARRY,     /* carry = R op L (for the next step) */
  PRIM_LOAD_CARRY,            /* carry = X pre-multiplied, rounded to the type as a sent X is
                               * (only when the op pre-multiplies; else the next step reads X) */
  PRIM_COUNT
};

#define SCHED_PRE 1u         /* X is read pre-multiplied */
#define SCHED_POST 2u        /* the result is post-divided: it is final */
#define SCHED_SWAP 4u        /* exchange computes R op Y: the lower rank's data first */
#define SCHED_LOCAL_CARRY 8u /* reductions combine R with the carry instead of X */
#define SCHED_LOCAL_OUT                                                                \
  16u                         /* reductions combine R with Y, and send sends Y, not X: \
                               * a later phase works on what an earlier one left in Y */
#define SCHED_LOCAL_FIRST 32u /* reductions compute L op R: the local data is the lower half */
/* Only where the op pre-multiplies: a copy makes Y = PRE(X), rounded alone,
 * and a reduction then reads that Y; otherwise the copy does nothing and
 * the reduction reads X. */
#define SCHED_PRE_ROUNDED 64u

/* Carries a rank keeps at once, each a register steps name (sched_step
 * .carry): a schedule may hold several chains of reductions open, each
 * passing its partial from step to step in its own. */
#define SCHED_CARRIES 8

struct sched_step {
  uint8_t prim;
  uint8_t flags;
  uint8_t carry;     /* the carry register the step reads and writes (< SCHED_CARRIES) */
  int32_t recv_peer; /* rank received from, -1 if none */
  int32_t send_peer; /* rank sent to, -1 if none */
  size_t xoff;       /* first element of the slice in the input */
  size_t yoff;       /* first element of the slice in the output */
  size_t count;      /* elements in the slice (> 0) */
};

enum sched_coll {
  COLL_ALLREDUCE = 0,
  COLL_ALLGATHER,
  COLL_REDUCESCATTER,
  COLL_BROADCAST,
  COLL_REDUCE,
  COLL_COUNT
};

/* The library's algorithms, by the id of their row in the algorithms'
 * table (sched_algos.c). Pairwise reduces in the canonical order
 * (pairwise.h), the only order the deterministic mode allows. A build may
 * have rows past ALGO_COUNT (a test's), up to ALGO_MAX: what is kept per
 * algorithm is sized ALGO_MAX, and what walks the algorithms walks
 * sched_algo_count() of them. */
enum sched_algo {
  ALGO_RING = 0,
  ALGO_TREE = 1,
  ALGO_RD = 2,
  ALGO_HIER = 3,
  ALGO_PAIRWISE = 4,
  ALGO_COUNT
};
#define ALGO_MAX 8

/* Levels of Pairwise's tree a one-node placement may re-pair: up to 1024
 * ranks on the node (choosing costs ranks^2 steps at init). */
#define SCHED_PAIR_LEVELS 10

/* Where the ranks are: nodes (hosts), and each rank's place on its node.
 * The comm builds it once; schedules only read it. A key without one
 * means a single node with the ranks in rank order. */
struct sched_topo {
  int nranks;
  int nnodes;
  const int* node_of;    /* per rank: its node (numbered by their lowest rank) */
  const int* local_of;   /* per rank: its index among its node's ranks */
  const int* node_start; /* per node: where its ranks begin in `order`; [nnodes] = nranks */
  const int* order;      /* the ranks node by node, in rank order within a node, or by
                          * the caches they are bound inside (sched_topo_place) */
  const int* pos_of;     /* per rank: its index in `order` */
  int min_ppn, max_ppn;  /* fewest and most ranks on a node */
  /* Pairwise's partner at level l is rank ^ pair_xor[l] (sched_topo_place:
   * ranks bound inside one cache paired where the tree allows); 0 at
   * every level: the canonical rank ^ 2^l. */
  int pair_xor[SCHED_PAIR_LEVELS];
  /* how much the partners at level l share caches (2 a rank sharing its
   * L2, 1 its L3 only); 0 at every level: nothing known (Pairwise's
   * gather then takes the levels top down) */
  int pair_shared[SCHED_PAIR_LEVELS];
};

/* Rank at index `i` of `order` (identity without a topology), and back. */
int sched_topo_rank(const struct sched_topo* t, int i);
int sched_topo_pos(const struct sched_topo* t, int rank);

const char* sched_coll_name(int coll);

/* Whether `rank` reads its send buffer / writes its receive buffer in
 * collective `coll` (a broadcast's non-root reads nothing, a reduce's
 * non-root writes nothing). */
int sched_coll_reads_send(int coll, int rank, int root);
int sched_coll_writes_recv(int coll, int rank, int root);
/* Whether `coll` combines values (all-reduce, reduce-scatter, reduce): its
 * result depends on the order of combining. */
int sched_coll_reduces(int coll);

/* What a schedule was built for; a comm reuses it when the key matches.
 * `count` is the per-rank block for all-gather and reduce-scatter, and
 * `stride` the distance in elements from one rank's block to the next in
 * the gathered buffer (0: count, the blocks back to back; more when the
 * call runs as pieces, each a slice of every block). */
struct sched_key {
  const struct sched_topo* topo; /* NULL: one node */
  int coll;
  int algo;
  int rank;
  int nranks;
  int root; /* broadcast and reduce */
  size_t count;
  size_t stride;
  size_t elem_size;
  size_t chunk_bytes;
  int slices_per_step; /* per iteration; at most half the executor window */
  /* A collective among some of the comm's ranks: the algorithm runs over
   * ranks 0..nranks-1 (rank: this one's index), whose comm ranks are
   * ranks[]; steps and peers name comm ranks. NULL: the comm's ranks. */
  const int* ranks;
};

/* Where rank `r`'s block starts in the gathered buffer of an all-gather or
 * reduce-scatter. */
static inline size_t sched_block_offset(const struct sched_key* k, int r) {
  return (size_t)r * (k->stride ? k->stride : k->count);
}

struct schedule {
  struct sched_key key;
  int valid;
  struct sched_step* steps;
  size_t nsteps;
  size_t capacity;
  int plain_sends;  /* some step sends X or Y as it is (PRIM_SEND, PRIM_SEND_OUT) */
  size_t max_count; /* elements of its largest step */
};

/* Make room for `n` steps (grows only; the comm keeps the memory). */
ncclResult_t sched_reserve(struct schedule* s, size_t n);
ncclResult_t sched_append(struct schedule* s, enum sched_prim prim, unsigned flags, int recv_peer,
                          int send_peer, size_t xoff, size_t yoff, size_t count);
void sched_free(struct schedule* s);

/* 1 when the primitive receives / sends. */
int sched_prim_recvs(enum sched_prim p);
int sched_prim_sends(enum sched_prim p);
/* 1 when the primitive combines what it receives with a local operand
 * (X, Y or the carry): the reduce-* primitives, not the exchange. Inline:
 * the executor asks it of every step it plans. */
static inline int sched_prim_reads_local(enum sched_prim p) {
  return p == PRIM_RECV_REDUCE_SEND || p == PRIM_RECV_REDUCE_CARRY ||
         p == PRIM_RECV_REDUCE_COPY_SEND || p == PRIM_RECV_REDUCE_COPY;
}
/* 1 when the primitive writes its slice of the output Y. */
int sched_prim_writes_y(enum sched_prim p);
/* 1 when the step is a plain send of its slice of Y (out of place, the
 * only sends that an earlier step's write can hold back). */
int sched_step_sends_y(const struct sched_step* st);
const char* sched_prim_name(enum sched_prim p);

/* Append p (ignored when negative or already there) to a peer list of m
 * entries (at most max); returns the new length. */
int sched_add_peer(int* peers, int m, int max, int p);

int sched_key_equal(const struct sched_key* a, const struct sched_key* b);

#endif /* BRAID_SCHEDULE_H_ */
