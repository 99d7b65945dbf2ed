/*
 * Recursive doubling all-reduce: the latency algorithm. With p2 the largest
 * power of two <= n, ranks >= p2 hand their input to rank - p2 first and get
 * the result back last; the p2 ranks run log2(p2) rounds of whole-buffer
 * exchanges. Partners combine as (lower rank's data) op (higher's), so both
 * hold bitwise the same result even for max/min of signed zeros. From
 * RD_HALVING_MIN_BYTES on, the core halves instead (rd_halving_core).
 */
#include "recursive_doubling.h"

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

/* One round of paired halves with `partner`, slice by slice so that each
 * send is followed by its receive (a rendezvous transport needs the peer's
 * receive posted in time): `out_prim` sends [so, so+sn), `in_prim` takes
 * [ro, ro+rn). */
static ncclResult_t rd_pair_round(struct schedule* s, int partner, size_t chunk,
                                  enum sched_prim out_prim, size_t so, size_t sn,
                                  enum sched_prim in_prim, unsigned in_flags, size_t ro,
                                  size_t rn) {
  ncclResult_t res = ncclSuccess;
  size_t slices = MAX(DIV_UP(sn, chunk), DIV_UP(rn, chunk));
  for (size_t i = 0; i < slices; i++) {
    size_t a = i * chunk;
    if (a < sn)
      CHECK(sched_append(s, out_prim, SCHED_LOCAL_OUT, -1, partner, so + a, so + a,
                         MIN(chunk, sn - a)));
    if (a < rn)
      CHECK(sched_append(s, in_prim, in_flags | SCHED_LOCAL_OUT, partner, -1, ro + a, ro + a,
                         MIN(chunk, rn - a)));
  }
fail:
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
    unsigned post = mask == 1 ? SCHED_POST : 0;
    CHECK(rd_pair_round(s, partner, chunk, PRIM_SEND_OUT, send_lo, send_hi - send_lo,
                        PRIM_RECV_REDUCE_COPY, post, keep_lo, keep_hi - keep_lo));
    lo[levels + 1] = keep_lo, hi[levels + 1] = keep_hi;
  }
  for (int mask = 1, l = levels; mask < p2; mask *= 2, l--) {
    int partner = r ^ mask, low = r < partner;
    size_t mine = lo[l], mine_n = hi[l] - lo[l];
    size_t theirs = low ? hi[l] : lo[l - 1], theirs_n = (hi[l - 1] - lo[l - 1]) - mine_n;
    CHECK(rd_pair_round(s, partner, chunk, PRIM_SEND_OUT, mine, mine_n, PRIM_RECV, 0, theirs,
                        theirs_n));
  }
fail:
  return res;
}

int rd_uses_halving(size_t count, size_t elem_size, int nranks) {
  int p2 = rd_pow2_floor(nranks);
  return p2 > 2 && count >= (size_t)p2 && count * elem_size >= RD_HALVING_MIN_BYTES;
}

ncclResult_t rd_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, r = k->rank, p2 = rd_pow2_floor(n), extra = n - p2;
  size_t chunk = MAX((size_t)1, k->chunk_bytes / k->elem_size);
  if (k->count == 0) return ncclSuccess;
  if (n == 1) return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, 0, 0, k->count);
  if (r >= p2) { /* folded rank: contribute, then receive the result */
    for (size_t off = 0; off < k->count; off += chunk)
      CHECK(
          sched_append(s, PRIM_SEND, SCHED_PRE, -1, r - p2, off, off, MIN(chunk, k->count - off)));
    for (size_t off = 0; off < k->count; off += chunk)
      CHECK(sched_append(s, PRIM_RECV, 0, r - p2, -1, off, off, MIN(chunk, k->count - off)));
    return ncclSuccess;
  }
  for (size_t off = 0; off < k->count; off += chunk) {
    size_t len = MIN(chunk, k->count - off);
    if (r < extra)
      CHECK(sched_append(s, PRIM_RECV_REDUCE_COPY, SCHED_PRE, r + p2, -1, off, off, len));
    else
      CHECK(sched_append(s, PRIM_COPY, SCHED_PRE, -1, -1, off, off, len));
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
  return res;
}
