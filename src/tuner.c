/*
 * Tuner: picks the algorithm and pipeline chunk per call from a cost model,
 *   time = hops * alpha + bytes_on_the_critical_path * beta,
 * with alpha/beta for TCP until topology detection measures them.
 * NCCL_ALGO overrides the choice ("Ring", "RecDoubling", "^Ring", lists).
 */
#include <string.h>
#include <strings.h>

#include "comm.h"
#include "core.h"
#include "param.h"

/* Loopback/LAN TCP: ~20 us per hop, ~1 GB/s per stream under contention. */
#define TUNER_ALPHA_US 20.0
#define TUNER_BETA_US_PER_BYTE (1.0 / 1000.0)

static int algo_named(const char* list, const char* name) {
  size_t len = strlen(name);
  for (const char* p = list; *p;) {
    size_t n = strcspn(p, ",");
    if (n == len && strncasecmp(p, name, len) == 0) return 1;
    p += n + (p[n] == ',');
  }
  return 0;
}

/* Bit mask of algorithms NCCL_ALGO allows (all when unset). */
static unsigned tuner_allowed(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return (unsigned)v;
  const char* s = param_read_str("NCCL_ALGO");
  unsigned mask = (1u << ALGO_COUNT) - 1;
  if (s) {
    int exclude = s[0] == '^';
    unsigned named = 0;
    for (int a = 0; a < ALGO_COUNT; a++)
      if (algo_named(s + exclude, sched_algo_name(a))) named |= 1u << a;
    mask = exclude ? mask & ~named : named;
    if (mask == 0) {
      WARN("NCCL_ALGO=%s leaves no all-reduce algorithm (have Ring, RecDoubling); using all", s);
      mask = (1u << ALGO_COUNT) - 1;
    }
  }
  atomic_store_explicit(&cached, (int)mask, memory_order_relaxed);
  return mask;
}

static double cost_ring(int n, double bytes) {
  return 2.0 * (n - 1) * TUNER_ALPHA_US + 2.0 * (n - 1) / n * bytes * TUNER_BETA_US_PER_BYTE;
}

static double cost_rd(int n, double bytes, size_t slot) {
  int rounds = 0, p2 = 1;
  while (p2 * 2 <= n) p2 *= 2, rounds++;
  int hops = rounds + (p2 != n ? 2 : 0);
  double slices = bytes > slot ? bytes / (double)slot : 1.0; /* slices run one by one */
  return hops * (TUNER_ALPHA_US * slices + bytes / slices * TUNER_BETA_US_PER_BYTE * slices);
}

void tuner_choose_allreduce(const struct ncclComm* comm, size_t count, size_t elem_size, int* algo,
                            size_t* chunk_bytes) {
  size_t max_chunk = comm->exec.slot_bytes;
  size_t bytes = count * elem_size;
  unsigned allowed = tuner_allowed();
  double t_ring = cost_ring(comm->nranks, (double)bytes);
  double t_rd = cost_rd(comm->nranks, (double)bytes, max_chunk);
  int use_rd = (allowed & (1u << ALGO_RD)) && (!(allowed & (1u << ALGO_RING)) || t_rd < t_ring);
  *algo = use_rd ? ALGO_RD : ALGO_RING;
  /* Whole slots: measured on 4 ranks over TCP, cutting a 64 KiB ring
   * segment into 4 slices made 256 KiB all-reduces 2x slower (per-message
   * costs outweigh the deeper pipeline); from 1 MiB up slot-sized slices
   * pipeline enough. */
  *chunk_bytes = max_chunk;
  TRACE(SUB_TUNING, "AllReduce %zu bytes: Ring %.1f us, RecDoubling %.1f us -> %s chunk %zu", bytes,
        t_ring, t_rd, sched_algo_name(*algo), *chunk_bytes);
}
