/*
 * braid-sim: Braid's own schedules played on a modelled cluster
 * (docs/simulator.md). For each collective, size and rank count, every
 * algorithm's time and bus bandwidth, the tuner's pick and how far it is
 * from the best:
 *
 *   braid-sim --ranks 16384 --per-node 8 --coll allreduce --bytes 64M
 *   braid-sim --ranks 64:16384 --bytes 8:1G --factor 8 [--check-tuner 1.1]
 *   braid-sim ... nic_gbps=200 net_lat_us=3 oversub=2   (the cluster, sim_cluster.h)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core.h"
#include "sim_cluster.h"
#include "sim_run.h"
#include "tune/tuner.h"
#include "sched_algos.h"

struct sim_args {
  int ranks_lo, ranks_hi, coll; /* coll -1: every one */
  int algo;                     /* -1: every one */
  size_t bytes_lo, bytes_hi, factor;
  unsigned flags;
  double check_tuner; /* 0: no check */
  int csv;            /* rows as comma-separated values */
  int repeat;         /* calls back to back (sim_call) */
};

static void usage(void) {
  fprintf(
      stderr,
      "usage: braid-sim [--ranks N|LO:HI] [--per-node G] [--coll NAME|all] [--bytes B|LO:HI]\n"
      "                 [--factor F] [--algo NAME] [--full] [--exact] [--check-tuner R] [--csv]\n"
      "                 [--repeat K]\n"
      "                 [name=value ...]   (the cluster: docs/simulator.md)\n");
}

/* "64M", "8", "1G": bytes; 0 on garbage. */
static size_t parse_size(const char* s) {
  char* end;
  double v = strtod(s, &end);
  size_t mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = 1u << 10, end++;
  else if (*end == 'M' || *end == 'm')
    mult = 1u << 20, end++;
  else if (*end == 'G' || *end == 'g')
    mult = 1u << 30, end++;
  if (end == s || *end != '\0' || !(v > 0) || v * (double)mult > 1e13) return 0;
  return (size_t)(v * (double)mult);
}

static int parse_range(const char* s, size_t* lo, size_t* hi) {
  const char* colon = strchr(s, ':');
  char first[64];
  if (colon == NULL) return (*lo = *hi = parse_size(s)) > 0;
  if ((size_t)(colon - s) >= sizeof(first)) return 0;
  memcpy(first, s, (size_t)(colon - s));
  first[colon - s] = '\0';
  *lo = parse_size(first), *hi = parse_size(colon + 1);
  return *lo > 0 && *hi >= *lo;
}

static int parse_named(const char* s, const char* (*name)(int), int count) {
  if (strcasecmp(s, "all") == 0) return -1;
  for (int i = 0; i < count; i++)
    if (strcasecmp(s, name(i)) == 0) return i;
  return -2;
}

/* One option (and its value, *used 2) or a cluster setting (*used 1). */
static int parse_one(const char* opt, const char* v, struct sim_args* a, struct sim_cluster* c,
                     int* used) {
  size_t lo, hi;
  *used = 1;
  if (strcmp(opt, "--full") == 0) return a->flags |= SIM_FULL, 1;
  if (strcmp(opt, "--exact") == 0) return a->flags |= SIM_EXACT, 1;
  if (strcmp(opt, "--csv") == 0) return a->csv = 1, 1;
  if (opt[0] != '-' && strchr(opt, '=')) return sim_cluster_set(c, opt) == ncclSuccess;
  *used = 2;
  if (v == NULL) return 0;
  if (strcmp(opt, "--ranks") == 0 && parse_range(v, &lo, &hi) && hi <= (1u << 20))
    return a->ranks_lo = (int)lo, a->ranks_hi = (int)hi, 1;
  if (strcmp(opt, "--per-node") == 0) return (c->per_node = atoi(v)) > 0;
  if (strcmp(opt, "--bytes") == 0) return parse_range(v, &a->bytes_lo, &a->bytes_hi);
  if (strcmp(opt, "--factor") == 0) return (a->factor = (size_t)atoi(v)) >= 2;
  if (strcmp(opt, "--coll") == 0)
    return (a->coll = parse_named(v, sched_coll_name, COLL_COUNT)) >= -1;
  if (strcmp(opt, "--algo") == 0)
    return (a->algo = parse_named(v, sched_algo_name, ALGO_COUNT)) >= -1;
  if (strcmp(opt, "--repeat") == 0) return (a->repeat = atoi(v)) >= 1;
  if (strcmp(opt, "--check-tuner") == 0) return (a->check_tuner = atof(v)) >= 1;
  return 0;
}

static ncclResult_t parse_args(int argc, char** argv, struct sim_args* a, struct sim_cluster* c) {
  *a = (struct sim_args){16, 16, COLL_ALLREDUCE, -1, 8, (size_t)1 << 30, 8, 0, 0, 0, 1};
  for (int i = 1, used = 0; i < argc; i += used) {
    if (parse_one(argv[i], i + 1 < argc ? argv[i + 1] : NULL, a, c, &used)) continue;
    fprintf(stderr, "braid-sim: bad argument '%s'\n", argv[i]);
    usage();
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* The collectives to play: one, or every one. */
static int coll_first(const struct sim_args* a) {
  return a->coll < 0 ? 0 : a->coll;
}
static int coll_last(const struct sim_args* a) {
  return a->coll < 0 ? COLL_COUNT - 1 : a->coll;
}

static void print_header(const struct sim_context* s, int csv) {
  char line[320];
  sim_cluster_describe(s->c, line, sizeof(line));
  printf("# %s\n", line);
  if (csv) {
    printf("ranks,per_node,bytes,coll,algo,us,busbw,played,tuner,model_us\n");
    return;
  }
  printf("# %8s %12s %-13s", "ranks", "bytes", "coll");
  for (int algo = 0; algo < ALGO_COUNT; algo++)
    printf(" %12s us %6s", sched_algo_name(algo), "busbw");
  printf("  %-11s %s\n", "tuner", "pick/best");
}

/* How an algorithm's time was had: every rank played, node 0's for all,
 * extrapolated, or not at all (too many steps). */
static const char* played(const struct sim_result* r) {
  return r->too_big        ? "too_big"
         : r->extrapolated ? "extrapolated"
         : r->symmetric    ? "symmetric"
                           : "full";
}

static void print_time(const struct sim_context* s, const struct sim_args* a, int coll,
                       size_t bytes, int algo, const struct sim_result* r, int pick) {
  double busbw = r->us > 0 ? (double)bytes / r->us / 1e3 * sim_busbw_factor(coll, s->c->nranks) : 0;
  if (a->csv)
    printf("%d,%d,%zu,%s,%s,%.3f,%.4f,%s,%s,%.3f\n", s->c->nranks, s->c->per_node, bytes,
           sched_coll_name(coll), sched_algo_name(algo), r->us, busbw, played(r),
           sched_algo_name(pick), tuner_cost(&s->model, coll, algo, (double)bytes));
  else if (r->too_big)
    printf(" %15s %6s", "too big", "-");
  else
    printf(" %c%14.1f %6.2f", r->extrapolated ? '~' : r->symmetric ? '=' : ' ', r->us, busbw);
}

/* One row: every algorithm, the tuner's pick and its ratio to the best
 * of the algorithms it chooses among (NCCL_ALGO; Pairwise only where
 * named) in *ratio. '~' marks an extrapolated time, '=' a symmetric
 * play's. */
static ncclResult_t sim_row(struct sim_context* s, const struct sim_args* a, int coll, size_t bytes,
                            double* ratio) {
  ncclResult_t res = ncclSuccess;
  double t[ALGO_COUNT], best = 0;
  unsigned eligible = tuner_allowed();
  int pick = sim_tuner_pick(s, coll, bytes);
  if (!a->csv) printf("  %8d %12zu %-13s", s->c->nranks, bytes, sched_coll_name(coll));
  for (int algo = 0; algo < ALGO_COUNT; algo++) {
    struct sim_result r;
    struct sim_call call = {
        .coll = coll, .algo = algo, .root = 0, .bytes = bytes, .repeat = a->repeat};
    t[algo] = -1;
    if ((a->algo >= 0 && a->algo != algo && algo != pick) ||
        !sched_supports_on(&s->topo, coll, algo)) {
      if (!a->csv) printf(" %15s %6s", "-", "-");
      continue;
    }
    CHECK(sim_collective(s, &call, a->flags, &r));
    t[algo] = r.us;
    if ((eligible & (1u << algo)) && r.us >= 0 && (best == 0 || r.us < best)) best = r.us;
    print_time(s, a, coll, bytes, algo, &r, pick);
  }
  /* a pick too big to play cannot be shown within any ratio */
  *ratio = t[pick] < 0 ? HUGE_VAL : best > 0 && t[pick] > 0 ? t[pick] / best : 1.0;
  if (!a->csv) printf("  %-11s %.2f\n", sched_algo_name(pick), *ratio);
fail:
  return res;
}

static ncclResult_t sweep(struct sim_cluster* c, const struct sim_args* a, double* worst) {
  ncclResult_t res = ncclSuccess;
  *worst = 1.0;
  for (long n = a->ranks_lo; n <= a->ranks_hi; n *= 2) {
    struct sim_context s;
    c->nranks = (int)n;
    CHECK(sim_cluster_check(c));
    CHECK(sim_context_init(&s, c));
    print_header(&s, a->csv);
    for (int coll = coll_first(a); coll <= coll_last(a); coll++)
      for (size_t b = a->bytes_lo; b <= a->bytes_hi; b *= a->factor) {
        double ratio;
        res = sim_row(&s, a, coll, b, &ratio);
        if (res != ncclSuccess) break;
        *worst = MAX(*worst, ratio);
        if (b > ((size_t)-1) / a->factor) break;
      }
    sim_context_free(&s);
    if (res != ncclSuccess || n > (1L << 30)) break;
  }
fail:
  return res;
}

int main(int argc, char** argv) {
  struct sim_cluster c;
  struct sim_args a;
  double worst;
  sim_cluster_defaults(&c);
  if (parse_args(argc, argv, &a, &c) != ncclSuccess) return 2;
  if (sweep(&c, &a, &worst) != ncclSuccess) return 1;
  if (a.check_tuner > 0) {
    printf("# tuner: worst pick/best %.3f (limit %.2f): %s\n", worst, a.check_tuner,
           worst <= a.check_tuner ? "ok" : "FAILED");
    if (worst > a.check_tuner) return 1;
  }
  return 0;
}
