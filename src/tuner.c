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

/* Cost model, per algorithm: time = hops * alpha + data * beta, where the
 * data term counts the bytes each rank moves (ring 2(n-1)/n S, tree 2S,
 * recursive doubling S per round). Alpha (us) and beta (us/KB) grow with f,
 * the ranks per core on this host: ranks sharing a core wait for each
 * other's time slices. The lines below were fitted to medians measured on a
 * 2-core VM over loopback TCP at 4 and 8 ranks (f = 2, 4; perf/algo_compare.sh)
 * and are clamped at f = 1; topology detection will measure them instead. */
struct algo_cost {
  double alpha0, alpha_f; /* per hop (per round for recursive doubling) */
  double beta0, beta_f;   /* per KB moved */
};
static const struct algo_cost k_cost[ALGO_COUNT] = {
    [ALGO_RING] = {-1.0, 9.0, -0.274, 0.466},
    [ALGO_TREE] = {7.0, 2.5, -0.44, 0.695},
    [ALGO_RD] = {-4.0, 10.75, -0.07, 0.45},
};

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

static double model(int algo, double f, double hops, double kbytes) {
  const struct algo_cost* c = &k_cost[algo];
  return hops * (c->alpha0 + c->alpha_f * f) + kbytes * (c->beta0 + c->beta_f * f);
}

/* Modelled time (us) of `algo` for `coll` on `bytes` (the whole buffer). */
static double tuner_cost(int coll, int algo, int n, int depth, double f, double bytes,
                         double slot) {
  double frac = (double)(n - 1) / n, kb = bytes / 1024.0;
  int rounds = 0, p2 = 1;
  while (p2 * 2 <= n) p2 *= 2, rounds++;
  f = f < 1.0 ? 1.0 : f;
  switch (algo) {
    case ALGO_RING:
      if (coll == COLL_ALLREDUCE) return model(algo, f, 2.0 * (n - 1), 2 * frac * kb);
      if (coll == COLL_ALLGATHER || coll == COLL_REDUCESCATTER)
        return model(algo, f, n - 1, frac * kb);
      return model(algo, f, n - 1, kb); /* chain broadcast / reduce */
    case ALGO_TREE:
      /* up then down; an interior rank moves the data of two children */
      if (coll == COLL_ALLREDUCE) return model(algo, f, 2.0 * (depth - 1), 2 * kb);
      return model(algo, f, depth - 1, 2 * kb);
    case ALGO_RD: {
      /* whole-buffer exchanges, slot-sized slices one after another */
      double slices = bytes > slot ? bytes / slot : 1.0;
      int r = rounds + (p2 != n ? 2 : 0);
      return model(algo, f, r * slices, r * kb);
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
    double t = tuner_cost(coll, a, comm->nranks, comm->tree_depth, comm->oversub, (double)bytes,
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
  if (comm->rank != 0 || !debug_enabled(DEBUG_INFO, SUB_TUNING)) return;
  for (int c = 0; c < COLL_COUNT; c++)
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
      char line[256];
      int o = snprintf(line, sizeof(line), "%-13s %10zu B:", sched_coll_name(c), sizes[i]);
      for (int a = 0; a < ALGO_COUNT && o < (int)sizeof(line); a++)
        if (sched_supports(c, a))
          o += snprintf(line + o, sizeof(line) - (size_t)o, " %s %.1f us", sched_algo_name(a),
                        tuner_cost(c, a, comm->nranks, comm->tree_depth, comm->oversub,
                                   (double)sizes[i], (double)comm->exec.slot_bytes));
      INFO(SUB_TUNING, "Tuner model: %s", line);
    }
}
