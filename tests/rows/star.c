/*
 * The star: a test-only algorithm (compiled into mp_test_rows alone) where
 * every collective goes through one hub, rank 0 of the call (a broadcast's
 * or reduce's root). The hub reduces what the others send, in rank order,
 * and sends each what it needs; the others talk to the hub alone.
 *
 * It exists to prove a claim of docs/architecture.md: adding an algorithm
 * is its own file and one row. The library's algorithms' table takes the
 * descriptor at the end where a test build names it (BRAID_TEST_ALGORITHM,
 * algorithms/sched_algos.c); the tuner prices it by its shape, and
 * NCCL_ALGO=Star forces it like any other.
 *
 * Every schedule is deadlock-free on transports that hold no message: a
 * rank's receives from the hub come after the sends the hub needs first.
 */
#include "star.h"

#include "core.h"

/* The hub of a call: its root where it has one, else rank 0. */
static int star_hub(const struct sched_key* k) {
  return k->coll == COLL_BROADCAST || k->coll == COLL_REDUCE ? k->root : 0;
}

/* How many slices [0, count) takes, none larger than a chunk. */
static size_t star_nslices(const struct sched_key* k, size_t count) {
  size_t chunk = MAX((size_t)1, k->chunk_bytes / k->elem_size);
  return DIV_UP(count, chunk);
}

/* The i-th of those n slices: [*lo, *hi). */
static void star_slice(size_t count, size_t nslices, size_t i, size_t* lo, size_t* hi) {
  *lo = count * i / nslices;
  *hi = count * (i + 1) / nslices;
}

/* The ranks but the hub, in rank order: the order the hub combines them. */
static int star_spoke(const struct sched_key* k, int i) {
  return i < star_hub(k) ? i : i + 1;
}

/* The hub combines slice [x, x+len) of every spoke's input into Y at y
 * (x its own input's offset): Y = X first, each spoke's R added in rank
 * order, the last step post-divided. */
static ncclResult_t star_reduce_into_y(struct schedule* s, const struct sched_key* k, size_t x,
                                       size_t y, size_t len) {
  ncclResult_t res = ncclSuccess;
  int spokes = k->nranks - 1;
  if (spokes == 0) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, x, y, len);
  for (int i = 0; i < spokes; i++) {
    unsigned f = (i == 0 ? SCHED_PRE : SCHED_LOCAL_OUT) | (i == spokes - 1 ? SCHED_POST : 0);
    CHECK(sched_append(s, PRIM_RECV_REDUCE_COPY, f, star_spoke(k, i), -1, x, y, len));
  }
fail:
  return res;
}

/* As star_reduce_into_y, but the result goes to rank `to` instead of Y:
 * partial sums travel in the carry. */
static ncclResult_t star_reduce_to(struct schedule* s, const struct sched_key* k, size_t x,
                                   size_t len, int to) {
  ncclResult_t res = ncclSuccess;
  int spokes = k->nranks - 1;
  for (int i = 0; i < spokes; i++) {
    unsigned f = i == 0 ? SCHED_PRE : SCHED_LOCAL_CARRY;
    if (i < spokes - 1)
      CHECK(sched_append(s, PRIM_RECV_REDUCE_CARRY, f, star_spoke(k, i), -1, x, x, len));
    else
      CHECK(
          sched_append(s, PRIM_RECV_REDUCE_SEND, f | SCHED_POST, star_spoke(k, i), to, x, x, len));
  }
fail:
  return res;
}

static ncclResult_t star_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  size_t n = star_nslices(k, k->count), lo, hi;
  for (size_t i = 0; i < n; i++) {
    star_slice(k->count, n, i, &lo, &hi);
    if (k->rank != star_hub(k)) {
      CHECK(sched_append(s, PRIM_SEND, SCHED_PRE, -1, star_hub(k), lo, lo, hi - lo));
      CHECK(sched_append(s, PRIM_RECV, 0, star_hub(k), -1, lo, lo, hi - lo));
      continue;
    }
    CHECK(star_reduce_into_y(s, k, lo, lo, hi - lo));
    for (int j = 0; j < k->nranks - 1; j++)
      CHECK(sched_append(s, PRIM_SEND_OUT, 0, -1, star_spoke(k, j), lo, lo, hi - lo));
  }
fail:
  return res;
}

static ncclResult_t star_broadcast(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  size_t n = star_nslices(k, k->count), lo, hi;
  for (size_t i = 0; i < n; i++) {
    star_slice(k->count, n, i, &lo, &hi);
    if (k->rank != star_hub(k)) {
      CHECK(sched_append(s, PRIM_RECV, 0, star_hub(k), -1, lo, lo, hi - lo));
      continue;
    }
    CHECK(sched_append(s, PRIM_COPY, 0, -1, -1, lo, lo, hi - lo));
    for (int j = 0; j < k->nranks - 1; j++)
      CHECK(sched_append(s, PRIM_SEND, 0, -1, star_spoke(k, j), lo, lo, hi - lo));
  }
fail:
  return res;
}

static ncclResult_t star_reduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  size_t n = star_nslices(k, k->count), lo, hi;
  for (size_t i = 0; i < n; i++) {
    star_slice(k->count, n, i, &lo, &hi);
    if (k->rank != star_hub(k))
      CHECK(sched_append(s, PRIM_SEND, SCHED_PRE, -1, star_hub(k), lo, lo, hi - lo));
    else
      CHECK(star_reduce_into_y(s, k, lo, lo, hi - lo));
  }
fail:
  return res;
}

/* Each rank's block of the gathered buffer (sched_block_offset), sliced:
 * `emit` for every slice. */
typedef ncclResult_t (*star_block_fn)(struct schedule* s, const struct sched_key* k, int block,
                                      size_t lo, size_t len, int peer);
static ncclResult_t star_each_slice(struct schedule* s, const struct sched_key* k, int block,
                                    int peer, star_block_fn emit) {
  ncclResult_t res = ncclSuccess;
  size_t n = star_nslices(k, k->count), lo, hi;
  for (size_t i = 0; i < n; i++) {
    star_slice(k->count, n, i, &lo, &hi);
    CHECK(emit(s, k, block, lo, hi - lo, peer));
  }
fail:
  return res;
}

static ncclResult_t ag_copy_own(struct schedule* s, const struct sched_key* k, int b, size_t lo,
                                size_t len, int peer) {
  (void)peer;
  return sched_append(s, PRIM_COPY, 0, -1, -1, lo, sched_block_offset(k, b) + lo, len);
}
static ncclResult_t ag_send_own(struct schedule* s, const struct sched_key* k, int b, size_t lo,
                                size_t len, int peer) {
  (void)k, (void)b;
  return sched_append(s, PRIM_SEND, 0, -1, peer, lo, lo, len);
}
static ncclResult_t ag_recv_block(struct schedule* s, const struct sched_key* k, int b, size_t lo,
                                  size_t len, int peer) {
  size_t y = sched_block_offset(k, b) + lo;
  return sched_append(s, PRIM_RECV, 0, peer, -1, y, y, len);
}
static ncclResult_t ag_send_block(struct schedule* s, const struct sched_key* k, int b, size_t lo,
                                  size_t len, int peer) {
  size_t y = sched_block_offset(k, b) + lo;
  return sched_append(s, PRIM_SEND_OUT, 0, -1, peer, y, y, len);
}

/* All-gather: the spokes send their block to the hub, which sends every
 * spoke the blocks of all the others. */
static ncclResult_t star_allgather(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int hub = star_hub(k), n = k->nranks;
  CHECK(star_each_slice(s, k, k->rank, -1, ag_copy_own));
  if (k->rank != hub) {
    CHECK(star_each_slice(s, k, k->rank, hub, ag_send_own));
    for (int b = 0; b < n; b++)
      if (b != k->rank) CHECK(star_each_slice(s, k, b, hub, ag_recv_block));
    return ncclSuccess;
  }
  for (int j = 0; j < n - 1; j++)
    CHECK(star_each_slice(s, k, star_spoke(k, j), star_spoke(k, j), ag_recv_block));
  for (int j = 0; j < n - 1; j++)
    for (int b = 0; b < n; b++)
      if (b != star_spoke(k, j)) CHECK(star_each_slice(s, k, b, star_spoke(k, j), ag_send_block));
fail:
  return res;
}

static ncclResult_t rs_send_block(struct schedule* s, const struct sched_key* k, int b, size_t lo,
                                  size_t len, int peer) {
  size_t x = sched_block_offset(k, b) + lo;
  return sched_append(s, PRIM_SEND, SCHED_PRE, -1, peer, x, lo, len);
}
/* A spoke's own block: each slice's result comes back right after the
 * slice goes, so the hub never holds results a spoke is too busy sending
 * to receive (they would take the hub's slots, and then it could receive
 * nothing more). */
static ncclResult_t rs_send_recv_own(struct schedule* s, const struct sched_key* k, int b,
                                     size_t lo, size_t len, int peer) {
  ncclResult_t res = rs_send_block(s, k, b, lo, len, peer);
  return res == ncclSuccess ? sched_append(s, PRIM_RECV, 0, peer, -1, lo, lo, len) : res;
}
static ncclResult_t rs_hub_block(struct schedule* s, const struct sched_key* k, int b, size_t lo,
                                 size_t len, int peer) {
  size_t x = sched_block_offset(k, b) + lo;
  (void)peer;
  if (b == k->rank) return star_reduce_into_y(s, k, x, lo, len);
  return star_reduce_to(s, k, x, len, b);
}

/* Reduce-scatter: the spokes send every block to the hub, which reduces
 * each and sends it to its owner. */
static ncclResult_t star_reducescatter(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int hub = star_hub(k), n = k->nranks;
  for (int b = 0; b < n; b++) {
    if (k->rank == hub) {
      CHECK(star_each_slice(s, k, b, -1, rs_hub_block));
      continue;
    }
    CHECK(star_each_slice(s, k, b, hub, b == k->rank ? rs_send_recv_own : rs_send_block));
  }
fail:
  return res;
}

static int star_peers(const struct sched_key* k, int* peers, int max) {
  int m = 0, hub = star_hub(k);
  if (k->rank != hub) return sched_add_peer(peers, 0, max, hub);
  for (int j = 0; j < k->nranks - 1; j++) m = sched_add_peer(peers, m, max, star_spoke(k, j));
  return m;
}

/* The hub's load: it receives every spoke's share and sends each its
 * result, one hop each way (two for the combining collectives). */
static void star_shape(int coll, int n, double bytes, struct sched_shape* out) {
  double spokes = n - 1, block = bytes / n;
  switch (coll) {
    case COLL_ALLREDUCE:
      *out = (struct sched_shape){2, 2 * spokes * bytes, spokes * bytes};
      break;
    case COLL_ALLGATHER:
      *out = (struct sched_shape){2, spokes * block + spokes * (bytes - block), 0};
      break;
    case COLL_REDUCESCATTER:
      *out = (struct sched_shape){2, spokes * bytes + spokes * block, spokes * bytes};
      break;
    case COLL_REDUCE:
      *out = (struct sched_shape){1, spokes * bytes, spokes * bytes};
      break;
    default: /* broadcast */
      *out = (struct sched_shape){1, spokes * bytes, 0};
  }
}

const struct sched_algorithm star_algorithm = {
    .name = "Star",
    .builders = {[COLL_ALLREDUCE] = star_allreduce,
                 [COLL_ALLGATHER] = star_allgather,
                 [COLL_REDUCESCATTER] = star_reducescatter,
                 [COLL_BROADCAST] = star_broadcast,
                 [COLL_REDUCE] = star_reduce},
    .peers = star_peers,
    .shape = star_shape,
};
