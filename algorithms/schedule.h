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
  PRIM_COUNT
};

#define SCHED_PRE 1u         /* X is read pre-multiplied */
#define SCHED_POST 2u        /* the result is post-divided: it is final */
#define SCHED_SWAP 4u        /* exchange computes R op Y: the lower rank's data first */
#define SCHED_LOCAL_CARRY 8u /* reductions combine R with the carry instead of X */
#define SCHED_LOCAL_OUT                                        \
  16u /* reductions combine R with Y, and send sends Y, not X: \
       * a later phase works on what an earlier one left in Y */

struct sched_step {
  uint8_t prim;
  uint8_t flags;
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

enum sched_algo { ALGO_RING = 0, ALGO_TREE = 1, ALGO_RD = 2, ALGO_HIER = 3, ALGO_COUNT };

/* Where the ranks are: nodes (hosts), and each rank's place on its node.
 * The comm builds it once; schedules only read it. A key without one
 * means a single node with the ranks in rank order. */
struct sched_topo {
  int nranks;
  int nnodes;
  const int* node_of;    /* per rank: its node (numbered by their lowest rank) */
  const int* local_of;   /* per rank: its index among its node's ranks */
  const int* node_start; /* per node: where its ranks begin in `order`; [nnodes] = nranks */
  const int* order;      /* the ranks node by node, in rank order within a node */
  const int* pos_of;     /* per rank: its index in `order` */
  int min_ppn, max_ppn;  /* fewest and most ranks on a node */
};

/* Group ranks into nodes by `host` (nranks keys; equal key = same node). */
ncclResult_t sched_topo_init(struct sched_topo* t, int nranks, const uint64_t* host);
void sched_topo_free(struct sched_topo* t);

/* Ranks on `node`. */
int sched_topo_node_size(const struct sched_topo* t, int node);

/* Rank at index `i` of `order` (identity without a topology), and back. */
int sched_topo_rank(const struct sched_topo* t, int i);
int sched_topo_pos(const struct sched_topo* t, int rank);

const char* sched_algo_name(int algo);
const char* sched_coll_name(int coll);

/* Whether `rank` reads its send buffer / writes its receive buffer in
 * collective `coll` (a broadcast's non-root reads nothing, a reduce's
 * non-root writes nothing). */
int sched_coll_reads_send(int coll, int rank, int root);
int sched_coll_writes_recv(int coll, int rank, int root);

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
};

/* Make room for `n` steps (grows only; the comm keeps the memory). */
ncclResult_t sched_reserve(struct schedule* s, size_t n);
ncclResult_t sched_append(struct schedule* s, enum sched_prim prim, unsigned flags, int recv_peer,
                          int send_peer, size_t xoff, size_t yoff, size_t count);
void sched_free(struct schedule* s);

/* 1 when the primitive receives / sends. */
int sched_prim_recvs(enum sched_prim p);
int sched_prim_sends(enum sched_prim p);
const char* sched_prim_name(enum sched_prim p);

/* Ring algorithms around rank order (ring.c): all-reduce as reduce-scatter
 * then all-gather, each segment cut into slices of at most chunk_bytes;
 * broadcast and reduce as a pipelined chain from/to the root. */
ncclResult_t ring_schedule_allreduce(struct schedule* s, const struct sched_key* key);
ncclResult_t ring_schedule_allgather(struct schedule* s, const struct sched_key* key);
ncclResult_t ring_schedule_reducescatter(struct schedule* s, const struct sched_key* key);
ncclResult_t chain_schedule_broadcast(struct schedule* s, const struct sched_key* key);
ncclResult_t chain_schedule_reduce(struct schedule* s, const struct sched_key* key);

/* Trees (tree.c): double binary tree all-reduce (two trees, each carrying
 * half the data, every rank interior in at most one), and a binary tree
 * rooted at the root for broadcast and reduce. */
ncclResult_t tree_schedule_allreduce(struct schedule* s, const struct sched_key* key);
ncclResult_t tree_schedule_broadcast(struct schedule* s, const struct sched_key* key);
ncclResult_t tree_schedule_reduce(struct schedule* s, const struct sched_key* key);

/* Tree shape: rank's parent (-1 at the root) and up to two children (-1
 * where absent) in tree `which` (0 or 1) of the double binary tree. */
void tree_links(int rank, int nranks, int which, int* parent, int child[2]);
/* Levels of the binary tree over nranks (1 for a single rank). */
int tree_depth(int nranks);

/* Recursive doubling all-reduce: log2 rounds of whole-buffer exchanges
 * between partners, non-power-of-two ranks folded in first and served last.
 * Few hops: the small-message algorithm. */
ncclResult_t rd_schedule_allreduce(struct schedule* s, const struct sched_key* key);

/* Peers rank `rank` sends to and receives from under recursive doubling
 * (at most 2 + log2(nranks)); returns how many were written to `peers`. */
int rd_peers(int rank, int nranks, int* peers, int max);
/* Recursive doubling all-reduce halves (Rabenseifner) from this many bytes
 * on, when at least 4 ranks are in its power-of-two core. */
#define RD_HALVING_MIN_BYTES ((size_t)32 << 10)
int rd_uses_halving(size_t count, size_t elem_size, int nranks);
/* Does hierarchical all-reduce of `bytes` take its leader variant with
 * chunks of `chunk_bytes`? (The tuner models and sizes it by this.) */
int hier_allreduce_uses_leaders(size_t bytes, size_t chunk_bytes);

/* Ranks a schedule for `key` exchanges data with, in both directions
 * (the relation is symmetric: if p is my peer, I am p's). Returns how many
 * were written to `peers` (at most `max`). */
int sched_peers(const struct sched_key* key, int* peers, int max);
/* Append p (ignored when negative or already there) to a peer list of m
 * entries (at most max); returns the new length. */
int sched_add_peer(int* peers, int m, int max, int p);

/* Tree 0 relabelled so that `root` is the tree's root. */
void tree_rooted_links(int rank, int nranks, int root, int* parent, int child[2]);

/* Hierarchical (hier.c). All-reduce: intra-node reduce-scatter, then an
 * inter-node all-reduce per piece among the ranks owning it on each node
 * (each rank carries 1/ppn of the data), then intra-node all-gather; for
 * small buffers the leader variant: reduce to each node's first rank,
 * leaders all-reduce, broadcast back. Reduce-scatter / all-gather: the
 * inter-node part on ppn parallel rings, when every node has as many
 * ranks. */
ncclResult_t hier_schedule_allreduce(struct schedule* s, const struct sched_key* key);
/* 1 when hier_schedule_allreduce overlaps its rounds' node and network
 * stages for this key (the executor window is wide enough). */
int hier_allreduce_pipelines(const struct sched_key* key);
ncclResult_t hier_schedule_allgather(struct schedule* s, const struct sched_key* key);
ncclResult_t hier_schedule_reducescatter(struct schedule* s, const struct sched_key* key);
/* Peers of a hierarchical schedule (rank space). */
int hier_peers(const struct sched_key* key, int* peers, int max);

/* 1 when `algo` implements `coll` (on this topology: hierarchical
 * reduce-scatter and all-gather need equal ranks per node). */
int sched_supports(int coll, int algo);
int sched_supports_on(const struct sched_topo* t, int coll, int algo);

/* Build (or reuse) the schedule for `key`. */
ncclResult_t sched_build(struct schedule* s, const struct sched_key* key);
int sched_key_equal(const struct sched_key* a, const struct sched_key* b);

/* The schedules a comm ran last (sched_cache.c): calls that alternate
 * sizes or collectives, and the full and last pieces of a long call, find
 * theirs built. An evicted entry's steps are reused by the next build, so
 * once warm the cache allocates nothing. */
#define SCHED_CACHE_SIZE 8
struct sched_cache {
  struct schedule entries[SCHED_CACHE_SIZE];
  uint64_t used[SCHED_CACHE_SIZE]; /* `clock` at the entry's last use */
  uint64_t clock;
  int last;        /* the entry used last */
  uint64_t builds; /* schedules built since init: tests watch it stop growing */
};

/* The schedule for `key`, built into the least recently used entry when
 * none matches. It stays valid until the next call. */
ncclResult_t sched_cache_get(struct sched_cache* c, const struct sched_key* key,
                             const struct schedule** out);
void sched_cache_free(struct sched_cache* c);

#endif /* BRAID_SCHEDULE_H_ */
