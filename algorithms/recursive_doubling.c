/*
 * Recursive doubling all-reduce: the latency algorithm. With p2 the largest
 * power of two <= n, ranks >= p2 hand their input to rank - p2 first and get
 * the result back last; the p2 ranks run log2(p2) rounds of whole-buffer
 * exchanges. Partners combine as (lower rank's data) op (higher's), so both
 * hold bitwise the same result even for max/min of signed zeros.
 */
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
  for (int mask = 1; mask < p2; mask <<= 1) {
    int partner = r ^ mask;
    unsigned flags = (mask * 2 == p2 ? SCHED_POST : 0) | (r > partner ? SCHED_SWAP : 0);
    CHECK(rd_round(s, k, partner, flags, chunk));
  }
  if (r < extra)
    for (size_t off = 0; off < k->count; off += chunk)
      CHECK(sched_append(s, PRIM_SEND_OUT, 0, -1, r + p2, off, off, MIN(chunk, k->count - off)));
fail:
  return res;
}
