/*
 * Tuner: picks the algorithm and pipeline chunk per call from a cost model,
 *   time = hops * alpha + bytes_on_the_critical_path * beta,
 * with alpha/beta for TCP until topology detection measures them.
 * NCCL_ALGO restricts the choice with NCCL's syntax ("Ring,Tree", "^Tree");
 * a collective no allowed algorithm implements falls back to Ring.
 * NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING prints every choice.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "comm.h"
#include "core.h"
#include "param.h"

/* Loopback/LAN TCP with ranks sharing cores: ~20 us a hop, ~1 GB/s a link. */
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

unsigned tuner_parse_algos(const char* s) {
  unsigned all = (1u << ALGO_COUNT) - 1, named = 0;
  if (s == NULL || *s == '\0') return all;
  int exclude = s[0] == '^';
  for (int a = 0; a < ALGO_COUNT; a++)
    if (algo_named(s + exclude, sched_algo_name(a))) named |= 1u << a;
  return exclude ? all & ~named : named;
}

/* Bit mask of algorithms NCCL_ALGO allows (all when unset). */
static unsigned tuner_allowed(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return (unsigned)v;
  const char* s = param_read_str("NCCL_ALGO");
  unsigned mask = tuner_parse_algos(s);
  if (mask == 0) {
    WARN("NCCL_ALGO=%s names no algorithm (Ring, Tree, RecDoubling); using all", s);
    mask = (1u << ALGO_COUNT) - 1;
  }
  atomic_store_explicit(&cached, (int)mask, memory_order_relaxed);
  return mask;
}

static double hops_cost(double hops, double bytes) {
  return hops * TUNER_ALPHA_US + bytes * TUNER_BETA_US_PER_BYTE;
}

/* Modelled time of `algo` for `coll` on `bytes` (the whole buffer). */
static double tuner_cost(int coll, int algo, int n, int depth, double bytes, double slot) {
  double frac = (double)(n - 1) / n;
  int rounds = 0, p2 = 1;
  while (p2 * 2 <= n) p2 *= 2, rounds++;
  switch (algo) {
    case ALGO_RING:
      if (coll == COLL_ALLREDUCE) return hops_cost(2.0 * (n - 1), 2 * frac * bytes);
      if (coll == COLL_ALLGATHER || coll == COLL_REDUCESCATTER)
        return hops_cost(n - 1, frac * bytes);
      return hops_cost(n - 1, bytes); /* chain broadcast / reduce */
    case ALGO_TREE:
      /* up then down: each phase crosses depth-1 links and moves the data
       * twice through an interior rank (two children) */
      if (coll == COLL_ALLREDUCE) return hops_cost(2.0 * (depth - 1), 2 * bytes);
      return hops_cost(depth - 1, 2 * bytes);
    case ALGO_RD: {
      /* whole-buffer exchanges, slices one after another */
      double slices = bytes > slot ? bytes / slot : 1.0;
      return hops_cost((rounds + (p2 != n ? 2 : 0)) * slices, (rounds + (p2 != n ? 2 : 0)) * bytes);
    }
    default:
      return 1e30;
  }
}

void tuner_choose(const struct ncclComm* comm, int coll, size_t bytes, int* algo,
                  size_t* chunk_bytes) {
  unsigned allowed = tuner_allowed();
  double best = 0;
  *algo = -1;
  for (int a = 0; a < ALGO_COUNT; a++) {
    if (!(allowed & (1u << a)) || !sched_supports(coll, a)) continue;
    double t = tuner_cost(coll, a, comm->nranks, comm->tree_depth, (double)bytes,
                          (double)comm->exec.slot_bytes);
    if (*algo < 0 || t < best) *algo = a, best = t;
  }
  if (*algo < 0) *algo = ALGO_RING; /* every collective has a ring */
  /* Whole slots: on 4 ranks over TCP, cutting a 64 KiB ring segment into 4
   * slices made 256 KiB all-reduces 2x slower (per-message costs outweigh
   * the deeper pipeline); from 1 MiB up slot-sized slices pipeline enough. */
  *chunk_bytes = comm->exec.slot_bytes;
  INFO(SUB_TUNING, "%s %zu bytes nranks %d: %s (modelled %.1f us)", sched_coll_name(coll), bytes,
       comm->nranks, sched_algo_name(*algo), best);
}

void tuner_log_table(const struct ncclComm* comm) {
  static const size_t sizes[] = {8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
  if (!debug_enabled(DEBUG_INFO, SUB_TUNING)) return;
  for (int c = 0; c < COLL_COUNT; c++)
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
      char line[256];
      int o = snprintf(line, sizeof(line), "%-13s %10zu B:", sched_coll_name(c), sizes[i]);
      for (int a = 0; a < ALGO_COUNT && o < (int)sizeof(line); a++)
        if (sched_supports(c, a))
          o += snprintf(line + o, sizeof(line) - (size_t)o, " %s %.1f us", sched_algo_name(a),
                        tuner_cost(c, a, comm->nranks, comm->tree_depth, (double)sizes[i],
                                   (double)comm->exec.slot_bytes));
      INFO(SUB_TUNING, "Tuner model: %s", line);
    }
}
