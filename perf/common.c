/* Command line parsing, nccl-tests-style table output and the thread/process team (barrier and
 * reductions over threads, and over MPI processes when built with PERF_HAVE_MPI) of the tools. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device.h"
#include "driver.h"

#if PERF_HAVE_MPI
#include <mpi.h>
#endif

/* ---------------------------------------------------------------- parsing */

/* Long-only options: values past any character, so they never take a letter nccl-tests may use. */
enum { OPT_INPLACE = 256, OPT_MEM, OPT_DET_TURNS };

static const struct option kLongOpts[] = {{"nthreads", required_argument, 0, 't'},
                                          {"ngpus", required_argument, 0, 'g'},
                                          {"minbytes", required_argument, 0, 'b'},
                                          {"maxbytes", required_argument, 0, 'e'},
                                          {"stepbytes", required_argument, 0, 'i'},
                                          {"stepfactor", required_argument, 0, 'f'},
                                          {"iters", required_argument, 0, 'n'},
                                          {"agg_iters", required_argument, 0, 'm'},
                                          {"warmup_iters", required_argument, 0, 'w'},
                                          {"parallel_init", required_argument, 0, 'p'},
                                          {"check", required_argument, 0, 'c'},
                                          {"op", required_argument, 0, 'o'},
                                          {"datatype", required_argument, 0, 'd'},
                                          {"root", required_argument, 0, 'r'},
                                          {"blocking", required_argument, 0, 'z'},
                                          {"stream_null", required_argument, 0, 'y'},
                                          {"timeout", required_argument, 0, 'T'},
                                          {"cudagraph", required_argument, 0, 'G'},
                                          {"report_cputime", required_argument, 0, 'C'},
                                          {"average", required_argument, 0, 'a'},
                                          {"run_cycles", required_argument, 0, 'N'},
                                          {"inplace", required_argument, 0, OPT_INPLACE},
                                          {"mem", required_argument, 0, OPT_MEM},
                                          {"det-turns", required_argument, 0, OPT_DET_TURNS},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};

static void usage(FILE* f, const char* prog) {
  fprintf(f,
          "USAGE: %s \n\t"
          "[-t,--nthreads <num threads>] \n\t"
          "[-g,--ngpus <gpus per thread> (must be 1: host buffers)] \n\t"
          "[-b,--minbytes <min size in bytes>] \n\t"
          "[-e,--maxbytes <max size in bytes>] \n\t"
          "[-i,--stepbytes <increment size>] \n\t"
          "[-f,--stepfactor <increment factor>] \n\t"
          "[-n,--iters <iteration count>] \n\t"
          "[-m,--agg_iters <aggregated iteration count>] \n\t"
          "[-w,--warmup_iters <warmup iteration count>] \n\t"
          "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)] \n\t"
          "[-p,--parallel_init <0/1>] \n\t"
          "[-c,--check <0/1>] \n\t"
          "[-o,--op <sum/prod/min/max/avg/premulsum/all>] \n\t"
          "[-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/"
          "fp8e4m3/fp8e5m2/all>] \n\t"
          "[-r,--root <root> (-1: every rank in turn)] \n\t"
          "[-z,--blocking <0/1>] \n\t"
          "[-y,--stream_null <0/1>] \n\t"
          "[-T,--timeout <time in seconds>] \n\t"
          "[-C,--report_cputime <0/1>] \n\t"
          "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>] \n\t"
          "[--inplace <0/1> (0: out-of-place only; in-place columns N/A)] \n\t"
          "[--mem <host/device> (default: device where a CUDA device is visible)] \n\t"
          "[--det-turns <n> (time each size in n turns of the default and the deterministic "
          "mode, one after the other)] \n\t"
          "[-h,--help]\n",
          prog);
}

/* nccl-tests' sizes: a number, then optionally K, M or G (powers of 1024). */
static int parse_size(const char* s, size_t* out) {
  char* end;
  double v = strtod(s, &end), unit = 1;
  if (end == s || v < 0) return -1;
  while (*end == ' ') end++;
  switch (*end) {
    case 'k':
    case 'K':
      unit = 1024.0;
      end++;
      break;
    case 'm':
    case 'M':
      unit = 1024.0 * 1024;
      end++;
      break;
    case 'g':
    case 'G':
      unit = 1024.0 * 1024 * 1024;
      end++;
      break;
    default:
      break;
  }
  if ((*end == 'b' || *end == 'B') && unit > 1) end++;
  if (*end != '\0' || v * unit > 9.0e18) return -1;
  *out = (size_t)(v * unit);
  return 0;
}

static int parse_int(const char* s, long lo, long hi, int* out) {
  char* end;
  long v = strtol(s, &end, 0);
  if (end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

static void set_defaults(perf_opts_t* o) {
  memset(o, 0, sizeof(*o));
  o->nthreads = o->ngpus = 1;
  o->min_bytes = o->max_bytes = 32 << 20;
  o->step_bytes = 1 << 20;
  o->step_factor = 1;
  o->iters = 20;
  o->warmup = 5;
  o->agg = o->check = o->average = o->cycles = o->inplace = 1;
  o->type_index = 7; /* float */
  o->op_index = PERF_OP_SUM;
  o->mem_device = perf_dev_count(NULL) > 0; /* as nccl-tests: device buffers where there is one */
}

static int parse_name(const char* arg, int is_type, int* out) {
  if (strcmp(arg, "all") == 0) {
    *out = -1;
    return 0;
  }
  for (int i = 0; i < (is_type ? PERF_NUM_TYPES : PERF_NUM_OPS); i++) {
    if (is_type ? perf_type_find(arg) == perf_type_at(i) : perf_op_find(arg) == perf_op_at(i)) {
      *out = i;
      return 0;
    }
  }
  return -1;
}

/* One option; returns 0 or -1 (the message, if any, names the offending option). */
static int parse_opt(int c, const char* arg, perf_opts_t* o) {
  const long big = 1L << 30;
  int step;
  switch (c) {
    case 't':
      return parse_int(arg, 1, 1024, &o->nthreads);
    case 'g':
      return parse_int(arg, 1, 1, &o->ngpus);
    case 'b':
      return parse_size(arg, &o->min_bytes);
    case 'e':
      return parse_size(arg, &o->max_bytes);
    case 'i':
      return parse_size(arg, &o->step_bytes);
    case 'f':
      if (parse_int(arg, 1, big, &step)) return -1;
      o->step_factor = (size_t)step;
      return 0;
    case 'n':
      return parse_int(arg, 1, big, &o->iters);
    case 'm':
      return parse_int(arg, 1, 1 << 16, &o->agg);
    case 'w':
      return parse_int(arg, 0, big, &o->warmup);
    case 'N':
      return parse_int(arg, 0, big, &o->cycles);
    case 'p':
      return parse_int(arg, 0, 1, &o->parallel_init);
    case 'c':
      return parse_int(arg, 0, big, &o->check);
    case 'o':
      return parse_name(arg, 0, &o->op_index);
    case 'd':
      return parse_name(arg, 1, &o->type_index);
    case 'r':
      return parse_int(arg, -1, big, &o->root);
    case 'z':
      return parse_int(arg, 0, 1, &o->blocking);
    case 'y':
      return parse_int(arg, 0, 1, &o->stream_null);
    case 'T':
      return parse_int(arg, 0, big, &o->timeout);
    case 'G':
      return parse_int(arg, 0, 0, &step); /* no CUDA graphs on the host */
    case 'C':
      return parse_int(arg, 0, 1, &o->cputime);
    case 'a':
      return parse_int(arg, 0, 3, &o->average);
    case OPT_INPLACE:
      return parse_int(arg, 0, 1, &o->inplace);
    case OPT_DET_TURNS:
      return parse_int(arg, 0, PERF_MAX_TURNS, &o->det_turns);
    case OPT_MEM:
      if (strcmp(arg, "host") != 0 && strcmp(arg, "device") != 0) return -1;
      o->mem_device = strcmp(arg, "device") == 0;
      return 0;
    default:
      return -1;
  }
}

/* The requested type/op must be one the tool can run. */
static int check_support(const perf_coll_t* coll, const perf_opts_t* o, FILE* err) {
  if (!coll->supports || o->type_index < 0 || o->op_index < 0) return 0;
  if (coll->supports(perf_type_at(o->type_index), coll->has_op ? o->op_index : PERF_OP_SUM))
    return 0;
  if (err)
    fprintf(err, "%s does not support datatype %s with op %s\n", coll->name,
            perf_type_at(o->type_index)->name, perf_op_at(o->op_index)->name);
  return -1;
}

static int check_args(const perf_coll_t* coll, const perf_opts_t* o, FILE* err) {
  if (o->min_bytes > o->max_bytes) {
    if (err)
      fprintf(err, "invalid sizes for 'minbytes' and 'maxbytes': %llu > %llu\n",
              (unsigned long long)o->min_bytes, (unsigned long long)o->max_bytes);
    return -1;
  }
  const char* why = NULL;
  if (o->mem_device && (coll->mpi_native || perf_dev_count(&why) == 0)) {
    if (err)
      fprintf(err, "--mem device: %s; run with --mem host for host buffers\n",
              coll->mpi_native ? "the MPI tools run on host buffers only" : why);
    return -1;
  }
  if (o->det_turns && (coll->mpi_native || !coll->has_op)) {
    if (err) fprintf(err, "--det-turns: %s has no deterministic mode to turn\n", coll->name);
    return -1;
  }
  if (coll->mpi_native && o->nthreads != 1) {
    if (err) fprintf(err, "%s runs one rank per MPI process: -t must be 1\n", coll->name);
    return -1;
  }
  return check_support(coll, o, err);
}

int perf_parse_args(int argc, char** argv, const perf_coll_t* coll, int printer, perf_opts_t* o) {
  const char* prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
  FILE* err = printer ? stderr : NULL;
  set_defaults(o);
  opterr = printer;
  for (;;) {
    int c = getopt_long(argc, argv, "t:g:b:e:i:f:n:m:w:N:p:c:o:d:r:z:y:T:G:C:a:h", kLongOpts, NULL);
    if (c == -1) break;
    if (c == 'h') {
      if (printer) usage(stdout, prog);
      return 1;
    }
    if (c == '?' || parse_opt(c, optarg, o)) {
      if (err && c >= OPT_INPLACE)
        fprintf(err, "%s: invalid value '%s' for option --%s\n", prog, optarg,
                c == OPT_MEM       ? "mem"
                : c == OPT_INPLACE ? "inplace"
                                   : "det-turns");
      else if (err && c != '?')
        fprintf(err, "%s: invalid value '%s' for option -%c\n", prog, optarg, c);
      if (err) usage(err, prog);
      return -1;
    }
  }
  if (optind < argc) {
    if (err) fprintf(err, "%s: unexpected argument '%s'\n", prog, argv[optind]);
    if (err) usage(err, prog);
    return -1;
  }
  return check_args(coll, o, err);
}

/* ---------------------------------------------------------------- output */

void perf_print_config(const perf_opts_t* o) {
  int factor = o->step_factor > 1;
  printf(
      "# nThread %d nGpus %d minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d\n",
      o->nthreads, o->ngpus, o->min_bytes, o->max_bytes, factor ? o->step_factor : o->step_bytes,
      factor ? "factor" : "bytes", o->warmup, o->iters, o->agg, o->check, 0);
  if (o->mem_device) printf("# Device buffers (ncclMemAlloc), a CUDA stream per rank\n");
  if (o->blocking)
    printf("# Blocking Enabled: wait for completion and barrier after each collective \n");
  if (o->parallel_init)
    printf("# Parallel Init Enabled: threads call into NcclInitRank concurrently \n");
  printf("#\n");
}

void perf_hostname(char* buf, size_t cap) {
  if (gethostname(buf, cap) != 0) snprintf(buf, cap, "unknown");
  buf[cap - 1] = '\0';
  char* dot = strchr(buf, '.');
  if (dot) *dot = '\0';
}

/* "model name" from /proc/cpuinfo, or "cpu". */
static void cpu_name(char* buf, size_t cap) {
  snprintf(buf, cap, "cpu");
  FILE* f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof(line), f)) {
    char* colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) != 0 || !colon) continue;
    colon += colon[1] == ' ' ? 2 : 1;
    colon[strcspn(colon, "\n")] = '\0';
    snprintf(buf, cap, "%s", colon);
    break;
  }
  fclose(f);
}

void perf_device_lines(char* line, size_t cap, int proc, int nthreads) {
  char host[256], cpu[128];
  size_t len = strlen(line);
  perf_hostname(host, sizeof(host));
  cpu_name(cpu, sizeof(cpu));
  for (int t = 0; t < nthreads && len < cap; t++) {
    int n = snprintf(line + len, cap - len,
                     "#  Rank %2d Group %2d Pid %6d on %10s device %2d [cpu] %s\n",
                     proc * nthreads + t, 0, (int)getpid(), host, t, cpu);
    if (n < 0) break;
    len += (size_t)n;
  }
  if (len >= cap && cap > 5) strcpy(line + cap - 5, "...\n");
}

void perf_print_table_header(const perf_opts_t* o) {
  const char* tm = o->cputime ? "cputime" : "time";
  printf("#\n");
  printf(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
      "\n",
      "", "", "", "", "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count",
         "type", "redop", "root", tm, "algbw", "busbw", "#wrong", tm, "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
         "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

void perf_print_row_start(size_t bytes, size_t count, const char* type, const char* op, int root) {
  printf("%12zu  %12zu  %8s  %6s  %6d", bytes, count, type, op, root);
}

/* value in exactly `width` columns: fewer decimals as it grows, exponent form last. */
static void fmt_fixed(char* buf, int width, double v) {
  static const char* const kForms[] = {"%*.2f", "%*.1f", "%*.0f"};
  for (int k = 0; k < 3; k++)
    if (snprintf(buf, (size_t)width + 1, kForms[k], width, v) <= width) return;
  snprintf(buf, (size_t)width + 1, width >= 7 ? "%*.1e" : "%*.0e", width, v);
}

void perf_print_result(double usec, double algbw, double busbw, int check, double wrong) {
  char t[16], a[16], b[16];
  fmt_fixed(t, 7, usec);
  fmt_fixed(a, 6, algbw);
  fmt_fixed(b, 6, busbw);
  if (check)
    printf("  %7s  %6s  %6s  %6g", t, a, b, wrong);
  else
    printf("  %7s  %6s  %6s    N/A", t, a, b);
}

void perf_print_skipped(void) {
  printf("  %7s  %6s  %6s    N/A", "N/A", "N/A", "N/A");
}

void perf_print_footer(int errors, double avg_busbw) {
  printf("# %-20s : %d %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
  printf("# %-20s : %g %s\n", "Avg bus bandwidth", avg_busbw, "");
  printf("#\n");
}

/* ---------------------------------------------------------------- team */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int nthreads, nprocs, arrived;
  unsigned gen;
  double acc, out;
  ncclComm_t comm; /* launch without MPI: one rank per process, timings over NCCL */
} g_team = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 1, 0, 0, 0, 0, NULL};

void perf_team_use_comm(ncclComm_t comm) {
  g_team.comm = comm;
}

/* Across processes over the benchmark's own communicator (no MPI): a double per rank. */
static double combine_over_comm(double v, int mode) {
  ncclResult_t res;
  if (mode == PERF_AGG_RANK0) {
    res = ncclBroadcast(&v, &v, 1, ncclFloat64, 0, g_team.comm, NULL);
  } else {
    ncclRedOp_t op = mode == PERF_AGG_MIN ? ncclMin : mode == PERF_AGG_MAX ? ncclMax : ncclSum;
    res = ncclAllReduce(&v, &v, 1, ncclFloat64, op, g_team.comm, NULL);
  }
  if (res != ncclSuccess) {
    fprintf(stderr, "perf: combining timings over NCCL failed: %s (%s)\n", ncclGetErrorString(res),
            ncclGetLastError(g_team.comm));
    ncclCommAbort(g_team.comm); /* its peers hear of it at once; nothing is left behind */
    exit(EXIT_FAILURE);
  }
  return v;
}

void perf_team_init(int nthreads, int nprocs) {
  g_team.nthreads = nthreads;
  g_team.nprocs = nprocs;
}

static void combine(int thread, double v, int mode) {
  if (g_team.arrived == 0) {
    g_team.acc = v;
    return;
  }
  switch (mode) {
    case PERF_AGG_RANK0:
      if (thread == 0) g_team.acc = v;
      break;
    case PERF_AGG_MIN:
      if (v < g_team.acc) g_team.acc = v;
      break;
    case PERF_AGG_MAX:
      if (v > g_team.acc) g_team.acc = v;
      break;
    default:
      g_team.acc += v;
      break;
  }
}

/* Across processes; called by thread 0 only, so MPI_THREAD_FUNNELED is enough. */
static double combine_procs(double v, int mode) {
  if (g_team.comm != NULL) return combine_over_comm(v, mode);
#if PERF_HAVE_MPI
  if (g_team.nprocs > 1) {
    if (mode == PERF_AGG_RANK0) {
      MPI_Bcast(&v, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    } else {
      MPI_Op op = mode == PERF_AGG_MIN ? MPI_MIN : mode == PERF_AGG_MAX ? MPI_MAX : MPI_SUM;
      MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
    }
  }
#else
  (void)mode;
#endif
  return v;
}

double perf_team_reduce(int thread, double value, int mode) {
  pthread_mutex_lock(&g_team.mu);
  unsigned gen = g_team.gen;
  combine(thread, value, mode);
  g_team.arrived++;
  if (thread == 0) {
    while (g_team.arrived < g_team.nthreads) pthread_cond_wait(&g_team.cv, &g_team.mu);
    double v = combine_procs(g_team.acc, mode);
    if (mode == PERF_AGG_AVG) v /= (double)g_team.nthreads * g_team.nprocs;
    g_team.out = v;
    g_team.arrived = 0;
    g_team.gen++;
    pthread_cond_broadcast(&g_team.cv);
  } else {
    if (g_team.arrived == g_team.nthreads) pthread_cond_broadcast(&g_team.cv);
    while (g_team.gen == gen) pthread_cond_wait(&g_team.cv, &g_team.mu);
  }
  double out = g_team.out;
  pthread_mutex_unlock(&g_team.mu);
  return out;
}

void perf_team_barrier(int thread) {
  (void)perf_team_reduce(thread, 0.0, PERF_AGG_SUM);
}

double perf_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
