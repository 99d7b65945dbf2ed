/*
 * Recursive doubling all-reduce: the latency algorithm. With p2 the largest
 * power of two <= n, ranks >= p2 hand their input to rank - p2 first and get
 * the result back last; the p2 ranks run log2(p2) rounds of whole-buffer
 * exchanges. Partners combine as (lower rank's data) op (higher's), so both
 * hold bitwise the same result even for max/min of signed zeros. From
 * RD_HALVING_MIN_BYTES on, the core halves instead (rd_halving_core).
 */
#include "recursive_doubling.h"

#include <stdlib.h>

#include "core.h"
#include "schedule.h"

static int rd_pow2_floor(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

int rd_peers(int rank, int nranks, int* peers, int max) {
  int p2 = rd_pow2_floor(nranks), extra = nranks - p2, m = 0;
  if (rank >= p2) {
    if (m < max) peers[m++] = rank - p2;
    return m;
  }
  if (rank < extra && m < max) peers[m++] = rank + p2;
  for (int mask = 1; mask < p2 && m < max; mask <<= 1) peers[m++] = rank ^ mask;
  return m;
}

/* One exchange round over the buffer, in slot-sized slices. */
static ncclResult_t rd_round(struct schedule* s, const struct sched_key* k, int partner,
                             unsigned flags, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  for (size_t off = 0; off < k->count; off += chunk)
    CHECK(sched_append(s, PRIM_EXCHANGE, flags, partner, partner, off, off,
                       MIN(chunk, k->count - off)));
fail:
  return res;
}

/* The slices of a halving round's range in the order the rounds after it
 * use them. The range splits at its middle as the next round splits it
 * (bit `mask` of the rank, which both partners share); a reduce-scatter
 * round takes first the half the next round sends, an all-gather round
 * sends first the half the rank held before the round that brought the
 * other; each half is ordered the same way by the rounds after. So a
 * round's sends leave in the order its data came, while the round before
 * still receives, and every rank waits alike (one rank's waits are
 * another's, which lets braid-sim play one node for all). */
struct rd_cut {
  size_t at, len;
};

struct rd_order {
  struct rd_cut* cuts;
  size_t n, cap;
  size_t chunk;
  int rank, held_first; /* held_first: all-gather rounds */
};

static ncclResult_t rd_order_range(struct rd_order* o, size_t lo, size_t n, int mask) {
  ncclResult_t res = ncclSuccess;
  if (n > o->chunk && mask > 0) {
    size_t half = n / 2;
    int held_lower = !(o->rank & mask); /* the rank keeps the lower half then */
    int lower_first = o->held_first ? held_lower : !held_lower;
    CHECK(rd_order_range(o, lower_first ? lo : lo + half, lower_first ? half : n - half, mask / 2));
    return rd_order_range(o, lower_first ? lo + half : lo, lower_first ? n - half : half, mask / 2);
  }
  for (size_t a = 0; a < n; a += o->chunk) {
    if (o->n == o->cap) return ncclInternalError; /* rd_order_init's bound is wrong */
    o->cuts[o->n++] = (struct rd_cut){lo + a, MIN(o->chunk, n - a)};
  }
fail:
  return res;
}

/* Room for the cuts of n elements: a split range holds more than a chunk,
 * so its halves hold at least half a chunk each, and no more than twice
 * the range's chunks come out of it. */
static ncclResult_t rd_order_init(struct rd_order* o, size_t n, size_t chunk, int rank,
                                  int held_first) {
  *o = (struct rd_order){
      .cap = 2 * DIV_UP(n, chunk) + 1, .chunk = chunk, .rank = rank, .held_first = held_first};
  return braid_calloc(&o->cuts, o->cap, sizeof(*o->cuts));
}

/* One round with `partner`, slice by slice so that each send is followed
 * by its receive (a rendezvous transport needs the peer's receive posted
 * in time): `out_prim` sends [so, so+sn), `in_prim` takes [ro, ro+rn),
 * both in the order of rd_order_range with `mask` (the next round's bit). */
struct rd_round_args {
  int partner, mask, held_first;
  enum sched_prim out_prim, in_prim;
  unsigned in_flags;
  size_t so, sn, ro, rn;
};

static ncclResult_t rd_pair_round(struct schedule* s, const struct rd_round_args* a, int rank,
                                  size_t chunk) {
  ncclResult_t res = ncclSuccess;
  struct rd_order out = {0}, in = {0};
  CHECK(rd_order_init(&out, a->sn, chunk, rank, a->held_first));
  CHECK(rd_order_init(&in, a->rn, chunk, rank, a->held_first));
  CHECK(rd_order_range(&out, a->so, a->sn, a->mask));
  CHECK(rd_order_range(&in, a->ro, a->rn, a->mask));
  for (size_t i = 0; i < MAX(out.n, in.n); i++) {
    if (i < out.n)
      CHECK(sched_append(s, a->out_prim, SCHED_LOCAL_OUT, -1, a->partner, out.cuts[i].at,
                         out.cuts[i].at, out.cuts[i].len));
    if (i < in.n)
      CHECK(sched_append(s, a->in_prim, a->in_flags | SCHED_LOCAL_OUT, a->partner, -1,
                         in.cuts[i].at, in.cuts[i].at, in.cuts[i].len));
  }
fail:
  free(out.cuts);
  free(in.cuts);
  return res;
}

/* Rabenseifner's variant for larger buffers (power-of-two core): recursive
 * halving reduce-scatter, then recursive doubling all-gather. Each rank
 * sends 2(p2-1)/p2 of the buffer instead of log2(p2) whole buffers, in
 * twice the rounds. Every element is reduced on one rank only and copied
 * from there, so all ranks hold bitwise the same result. */
static ncclResult_t rd_halving_core(struct schedule* s, const struct sched_key* k, int r, int p2,
                                    size_t chunk) {
  ncclResult_t res = ncclSuccess;
  size_t lo[32], hi[32];
  int levels = 0;
  lo[0] = 0, hi[0] = k->count;
  for (int mask = p2 / 2; mask >= 1; mask /= 2, levels++) {
    int partner = r ^ mask, low = r < partner;
    size_t mid = lo[levels] + (hi[levels] - lo[levels]) / 2;
    size_t keep_lo = low ? lo[levels] : mid, keep_hi = low ? mid : hi[levels];
    size_t send_lo = low ? mid : lo[levels], send_hi = low ? hi[levels] : mid;
    struct rd_round_args a = {.partner = partner,
                              .mask = mask / 2,
                              .out_prim = PRIM_SEND_OUT,
                              .in_prim = PRIM_RECV_REDUCE_COPY,
                              .in_flags = mask == 1 ? SCHED_POST : 0,
                              .so = send_lo,
                              .sn = send_hi - send_lo,
                              .ro = keep_lo,
                              .rn = keep_hi - keep_lo};
    CHECK(rd_pair_round(s, &a, r, chunk));
    lo[levels + 1] = keep_lo, hi[levels + 1] = keep_hi;
  }
  for (int mask = 1, l = levels; mask < p2; mask *= 2, l--) {
    int partner = r ^ mask, low = r < partner;
    size_t mine = lo[l], mine_n = hi[l] - lo[l];
    size_t theirs = low ? hi[l] : lo[l - 1], theirs_n = (hi[l - 1] - lo[l - 1]) - mine_n;
    struct rd_round_args a = {.partner = partner,
                              .mask = mask / 2,
                              .held_first = 1,
                              .out_prim = PRIM_SEND_OUT,
                              .in_prim = PRIM_RECV,
                              .so = mine,
                              .sn = mine_n,
                              .ro = theirs,
                              .rn = theirs_n};
    CHECK(rd_pair_round(s, &a, r, chunk));
  }
fail:
  return res;
}

int rd_uses_halving(size_t count, size_t elem_size, int nranks) {
  int p2 = rd_pow2_floor(nranks);
  return p2 > 2 && count >= (size_t)p2 && count * elem_size >= RD_HALVING_MIN_BYTES;
}

/* The order in which core rank `core` takes in the input: with halving,
 * the first round's (rd_order_range); otherwise from the start. */
static ncclResult_t rd_input_order(struct rd_order* o, const struct sched_key* k, int core, int p2,
                                   size_t chunk) {
  ncclResult_t res = ncclSuccess;
  CHECK(rd_order_init(o, k->count, chunk, core, 0));
  CHECK(rd_order_range(o, 0, k->count,
                       rd_uses_halving(k->count, k->elem_size, k->nranks) ? p2 / 2 : 0));
fail:
  return res;
}

ncclResult_t rd_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank, p2 = rd_pow2_floor(n), extra = n - p2;
  size_t chunk = MAX((size_t)1, k->chunk_bytes / k->elem_size);
  struct rd_order in = {0};
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, 0, 0, k->count);
  CHECK(rd_input_order(&in, k, r >= p2 ? r - p2 : r, p2, chunk));
  if (r >= p2) { /* folded rank: contribute, then receive the result */
    for (size_t i = 0; i < in.n; i++)
      CHECK(sched_append(s, PRIM_SEND, SCHED_PRE, -1, r - p2, in.cuts[i].at, in.cuts[i].at,
                         in.cuts[i].len));
    for (size_t off = 0; off < k->count; off += chunk)
      CHECK(sched_append(s, PRIM_RECV, 0, r - p2, -1, off, off, MIN(chunk, k->count - off)));
    goto fail;
  }
  for (size_t i = 0; i < in.n; i++) {
    size_t at = in.cuts[i].at, len = in.cuts[i].len;
    if (r < extra)
      CHECK(sched_append(s, PRIM_RECV_REDUCE_COPY, SCHED_PRE, r + p2, -1, at, at, len));
    else
      CHECK(sched_append(s, PRIM_COPY, SCHED_PRE, -1, -1, at, at, len));
  }
  if (rd_uses_halving(k->count, k->elem_size, n)) {
    CHECK(rd_halving_core(s, k, r, p2, chunk));
  } else {
    for (int mask = 1; mask < p2; mask <<= 1) {
      int partner = r ^ mask;
      unsigned flags = (mask * 2 == p2 ? SCHED_POST : 0) | (r > partner ? SCHED_SWAP : 0);
      CHECK(rd_round(s, k, partner, flags, chunk));
    }
  }
  if (r < extra)
    for (size_t off = 0; off < k->count; off += chunk)
      CHECK(sched_append(s, PRIM_SEND_OUT, 0, -1, r + p2, off, off, MIN(chunk, k->count - off)));
fail:
  free(in.cuts);
  return res;
}
