/* The perf driver: MPI/thread bootstrap, one NCCL rank per thread, the size sweep with warmup,
 * timed iterations and the exact check of the last one, and the nccl-tests report. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "device.h"
#include "driver.h"
#include "braid.h"

#if PERF_HAVE_MPI
#include <mpi.h>
#endif

#define POISON_BYTE 0xA5
#define DEVICE_LINES 4096
#define MAX_RANKS_WATCHED 1024

typedef struct {
  const perf_opts_t* o;
  const perf_coll_t* coll;
  int proc, thread, rank, nranks;
  int host_rank; /* this rank's index among the ranks of its host (launcher's, else rank) */
  ncclUniqueId id;
  ncclComm_t comm;
  char *send, *recv;           /* o->agg slots each: what the calls get */
  char *hsend, *hrecv;         /* --mem device: host copies for filling and checking, else =
                                * send, recv */
  cudaStream_t stream;         /* --mem device: this rank's stream */
  size_t send_slot, recv_slot; /* bytes per slot */
  uint64_t reps;               /* advances identically on every rank: the data seed */
  int errors, bw_count;
  double bw_sum;
  pthread_t tid;
  int proc_comm;          /* timings travel between processes over a comm of this rank's */
  ncclComm_t timing_comm; /* that comm: split off the measured one, so the barriers and sums
                           * never replace the schedule the measured calls reuse */
} perf_rank_t;

static const perf_op_t kNoOp = {"none", NULL, PERF_OP_SUM};
static _Atomic double g_inflight[MAX_RANKS_WATCHED]; /* start time of the running op, or 0 */

static void die(void) {
  fflush(stdout);
  fflush(stderr);
  _exit(EXIT_FAILURE);
}

/* Abort (not just exit): the comm's peers hear of it at once, and nothing
 * of it (a shared-memory segment not yet mapped) is left behind. */
static void nccl_fail(const perf_rank_t* r, ncclResult_t res, const char* what, int line) {
  char host[256];
  perf_hostname(host, sizeof(host));
  fprintf(stderr, "%s: Test NCCL failure %s:%d rank %d %s '%s / %s'\n", host, __FILE__, line,
          r ? r->rank : -1, what, ncclGetErrorString(res), ncclGetLastError(r ? r->comm : NULL));
  if (r && r->timing_comm) ncclCommAbort(r->timing_comm);
  if (r && r->comm) ncclCommAbort(r->comm);
  die();
}

#define PERF_NCCL(r, cmd)                                          \
  do {                                                             \
    ncclResult_t res_ = (cmd);                                     \
    if (res_ != ncclSuccess) nccl_fail((r), res_, #cmd, __LINE__); \
  } while (0)

static void* xalloc(size_t bytes) {
  size_t n = (bytes + 63) / 64 * 64;
  void* p = aligned_alloc(64, n ? n : 64);
  if (!p) {
    fprintf(stderr, "perf: cannot allocate %zu bytes\n", bytes);
    die();
  }
  memset(p, 0, n ? n : 64);
  return p;
}

/* ---------------------------------------------------------------- one operation */

/* Where slot `slot`'s input and output are, in the call's buffers (host 0) or in their host
 * copies (host 1; the same buffers without --mem device). */
static char* send_ptr(const perf_rank_t* r, const perf_test_t* t, int in_place, int slot,
                      int host) {
  char *send = host ? r->hsend : r->send, *recv = host ? r->hrecv : r->recv;
  if (!in_place) return send + (size_t)slot * r->send_slot;
  return recv + (size_t)slot * r->recv_slot + t->n.send_inplace * (size_t)t->rank * t->type->size;
}

static char* recv_ptr(const perf_rank_t* r, const perf_test_t* t, int in_place, int slot,
                      int host) {
  size_t off = in_place ? t->n.recv_inplace * (size_t)t->rank * t->type->size : 0;
  return (host ? r->hrecv : r->recv) + (size_t)slot * r->recv_slot + off;
}

/* --mem device: the host copies to the device, or back (whole slots). */
static void slots_copy(perf_rank_t* r, int to_device) {
  size_t sb = r->send_slot * (size_t)r->o->agg, rb = r->recv_slot * (size_t)r->o->agg;
  if (r->hrecv == r->recv) return;
  if (to_device ? perf_dev_copy(r->recv, r->hrecv, rb, r->stream) ||
                      perf_dev_copy(r->send, r->hsend, sb, r->stream)
                : perf_dev_copy(r->hrecv, r->recv, rb, r->stream))
    die();
}

/* The calls of a timed stretch are done: on device buffers, their stream is drained. */
static void calls_done(perf_rank_t* r) {
  if (r->stream && perf_dev_sync(r->stream)) die();
}

/* One outer iteration: o->agg operations, grouped when there are several. */
static void run_iter(perf_rank_t* r, const perf_test_t* t, int in_place) {
  int group = r->o->agg > 1 && !r->coll->mpi_native;
  if (r->rank < MAX_RANKS_WATCHED) g_inflight[r->rank] = perf_now();
  if (group) PERF_NCCL(r, ncclGroupStart());
  for (int a = 0; a < r->o->agg; a++) {
    ncclResult_t res =
        r->coll->run(t, send_ptr(r, t, in_place, a, 0), recv_ptr(r, t, in_place, a, 0));
    if (res != ncclSuccess) nccl_fail(r, res, t->coll->name, __LINE__);
  }
  if (group) PERF_NCCL(r, ncclGroupEnd());
  if (r->rank < MAX_RANKS_WATCHED) g_inflight[r->rank] = 0;
}

/* Fresh inputs (new seed) and poisoned outputs in every slot, then a barrier. In-place inputs
 * are written after the poison, over whatever part of the output they share. */
static void prepare(perf_rank_t* r, perf_test_t* t, int in_place) {
  t->seed = 0x5eedULL + ++r->reps;
  for (int a = 0; a < r->o->agg; a++) {
    memset(recv_ptr(r, t, in_place, a, 1), POISON_BYTE, t->n.recv * t->type->size);
    r->coll->init(t, send_ptr(r, t, in_place, a, 1));
  }
  slots_copy(r, 1);
  perf_team_barrier(r->thread);
}

static double count_wrong(perf_rank_t* r, const perf_test_t* t, int in_place) {
  size_t wrong = 0;
  slots_copy(r, 0);
  for (int a = 0; a < r->o->agg; a++) wrong += perf_count_wrong(t, recv_ptr(r, t, in_place, a, 1));
  return (double)wrong;
}

/* Seconds per operation over o->iters timed iterations. With checking on, the inputs are
 * re-initialized (untimed) before the last iteration so that its results are the ones checked. */
static double timed_loop(perf_rank_t* r, perf_test_t* t, int in_place) {
  const perf_opts_t* o = r->o;
  if (o->check)
    prepare(r, t, in_place);
  else
    perf_team_barrier(r->thread);
  double paused = 0, t0 = perf_now();
  for (int it = 0; it < o->iters; it++) {
    if (o->check && it > 0 && it == o->iters - 1) {
      calls_done(r); /* the earlier calls still read the inputs; their time counts */
      double p = perf_now();
      prepare(r, t, in_place);
      paused += perf_now() - p;
    }
    run_iter(r, t, in_place);
    if (o->blocking) calls_done(r), perf_team_barrier(r->thread);
  }
  calls_done(r);
  return (perf_now() - t0 - paused) / ((double)o->iters * o->agg);
}

static void bench(perf_rank_t* r, perf_test_t* t, int in_place) {
  const perf_opts_t* o = r->o;
  int check = o->check && !(in_place && t->coll->inplace_unchecked);
  double sec = perf_team_reduce(r->thread, timed_loop(r, t, in_place), o->average);
  double wrong = check ? count_wrong(r, t, in_place) : 0;
  wrong = perf_team_reduce(r->thread, wrong, PERF_AGG_SUM);
  double bytes = t->coll->alg_bytes ? t->coll->alg_bytes(t) : (double)(t->n.param * t->type->size);
  double algbw = sec > 0 ? bytes / 1.0e9 / sec : 0;
  double busbw = algbw * t->coll->bus_factor(t->nranks);
  if (r->rank == 0) perf_print_result(sec * 1.0e6, algbw, busbw, check, wrong);
  r->bw_sum += busbw;
  r->bw_count++;
  if (wrong > 0) r->errors++;
}

/* ---------------------------------------------------------------- mode turns */

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(const double* v, int n) {
  double s[PERF_MAX_TURNS];
  memcpy(s, v, sizeof(double) * (size_t)n);
  qsort(s, (size_t)n, sizeof(double), cmp_double);
  return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void print_turns(const char* what, const double* v, int n, double scale) {
  printf("#  %-21s", what);
  for (int i = 0; i < n; i++) printf(" %.2f", v[i] * scale);
  printf("\n");
}

/* --det-turns: out of place, the default mode then the deterministic one
 * (braidCommSetDeterministic), turn after turn, so that both see the same
 * state of a machine whose speed drifts; per turn the two modes' times,
 * and the median of the turns' ratios. The deterministic mode is warmed
 * up first (the sweep warmed up the default); the mode the comm had is
 * restored. */
static void det_turns(perf_rank_t* r, perf_test_t* t) {
  const int n = r->o->det_turns;
  double sec[2][PERF_MAX_TURNS], ratio[PERF_MAX_TURNS];
  int was = 0;
  PERF_NCCL(r, braidCommGetDeterministic(r->comm, &was));
  PERF_NCCL(r, braidCommSetDeterministic(r->comm, 1)); /* its schedules built, as the default's */
  for (int i = 0; i < r->o->warmup; i++) run_iter(r, t, 0);
  calls_done(r);
  for (int turn = 0; turn < n; turn++)
    for (int mode = 0; mode < 2; mode++) {
      PERF_NCCL(r, braidCommSetDeterministic(r->comm, mode));
      sec[mode][turn] = perf_team_reduce(r->thread, timed_loop(r, t, 0), r->o->average);
    }
  PERF_NCCL(r, braidCommSetDeterministic(r->comm, was));
  for (int i = 0; i < n; i++) ratio[i] = sec[1][i] / sec[0][i];
  if (r->rank != 0) return;
  print_turns("default, us:", sec[0], n, 1e6);
  print_turns("deterministic, us:", sec[1], n, 1e6);
  print_turns("det / default, time:", ratio, n, 1);
  printf("#  turns %d, medians: default %.2f us, deterministic %.2f us; det / default time %.3f\n",
         n, median(sec[0], n) * 1e6, median(sec[1], n) * 1e6, median(ratio, n));
}

/* ---------------------------------------------------------------- the sweep */

static void setup(perf_test_t* t, size_t bytes) {
  t->coll->counts(bytes / t->type->size, t->type->size, t->nranks, &t->n);
}

static size_t next_size(const perf_opts_t* o, size_t s) {
  if (s == 0 && o->step_factor > 1) return 1;
  size_t n = o->step_factor > 1 ? s * o->step_factor : s + o->step_bytes;
  return n > s ? n : (size_t)-1; /* a step that does not grow ends the sweep */
}

static void warmup(perf_rank_t* r, perf_test_t* t) {
  for (size_t s = r->o->min_bytes; s <= r->o->max_bytes; s = s ? s * 2 : 1) {
    setup(t, s);
    for (int i = 0; i < r->o->warmup; i++) run_iter(r, t, 0);
    if (s > r->o->max_bytes / 2) break;
  }
  calls_done(r);
}

static void sweep(perf_rank_t* r, perf_test_t* t) {
  const perf_opts_t* o = r->o;
  for (size_t s = o->min_bytes; s <= o->max_bytes; s = next_size(o, s)) {
    setup(t, s);
    if (r->rank == 0) {
      size_t elems = t->n.send > t->n.recv ? t->n.send : t->n.recv;
      perf_print_row_start(elems * t->type->size, t->n.param, t->type->name, t->op->name, t->root);
    }
    bench(r, t, 0);
    if (o->inplace)
      bench(r, t, 1);
    else if (r->rank == 0)
      perf_print_skipped();
    if (r->rank == 0) printf("\n");
    if (o->det_turns) det_turns(r, t);
  }
}

static void make_premulsum(perf_rank_t* r, perf_test_t* t) {
  uint64_t scalar = 0;
  perf_store(t->type, &scalar, 0, perf_val_of(t->type, PERF_PREMUL_SCALAR));
  PERF_NCCL(r, ncclRedOpCreatePreMulSum(&t->redop, &scalar, t->type->type, ncclScalarHostImmediate,
                                        r->comm));
}

static void time_test(perf_rank_t* r, const perf_type_t* type, const perf_op_t* op, int root) {
  perf_test_t t = {.coll = r->coll,
                   .stream = r->stream,
                   .type = type,
                   .op = op,
                   .redop = (ncclRedOp_t)op->index,
                   .comm = r->comm,
                   .rank = r->rank,
                   .nranks = r->nranks,
                   .root = root};
  int premul = op->index == PERF_OP_PREMULSUM && !r->coll->mpi_native;
  if (premul) make_premulsum(r, &t);
  perf_team_barrier(r->thread);
  warmup(r, &t);
  int cycles = r->o->cycles;
  do sweep(r, &t);
  while (cycles == 0 || --cycles > 0);
  if (premul) PERF_NCCL(r, ncclRedOpDestroy(t.redop, r->comm));
}

static int supported(const perf_coll_t* coll, const perf_type_t* type, const perf_op_t* op) {
  return !coll->supports || coll->supports(type, op->index);
}

/* Types, then ops, then roots (-r -1: every rank in turn), as nccl-tests orders them. */
static void run_all(perf_rank_t* r) {
  const perf_opts_t* o = r->o;
  int all_roots = r->coll->has_root && o->root < 0;
  int first = r->coll->has_root ? (all_roots ? 0 : o->root) : -1;
  int last = all_roots ? r->nranks - 1 : first;
  for (int ti = 0; ti < PERF_NUM_TYPES; ti++) {
    if (o->type_index >= 0 && ti != o->type_index) continue;
    for (int oi = 0; oi < PERF_NUM_OPS; oi++) {
      const perf_op_t* op = r->coll->has_op ? perf_op_at(oi) : &kNoOp;
      if (r->coll->has_op ? (o->op_index >= 0 && oi != o->op_index) : oi > 0) continue;
      if (!supported(r->coll, perf_type_at(ti), op)) continue;
      for (int root = first; root <= last; root++) time_test(r, perf_type_at(ti), op, root);
    }
  }
}

/* ---------------------------------------------------------------- ranks */

static void init_comm(perf_rank_t* r) {
  int count = -1, rank = -1;
  PERF_NCCL(r, ncclCommInitRank(&r->comm, r->nranks, r->id, r->rank));
  PERF_NCCL(r, ncclCommCount(r->comm, &count));
  PERF_NCCL(r, ncclCommUserRank(r->comm, &rank));
  if (count != r->nranks || rank != r->rank) {
    fprintf(stderr, "perf: rank %d: ncclCommCount %d / ncclCommUserRank %d, expected %d / %d\n",
            r->rank, count, rank, r->nranks, r->rank);
    die();
  }
}

/* Device buffers come from ncclMemAlloc, as nccl-tests' -R; their host copies are the
 * filling and checking side. */
/* --mem device never runs on host memory silently: a library whose
 * device path is off (its INFO line says why) hands out host memory. */
static char* device_alloc(perf_rank_t* r, size_t bytes) {
  void* p = NULL;
  PERF_NCCL(r, ncclMemAlloc(&p, bytes ? bytes : 64));
  if (!perf_dev_owns(p)) {
    fprintf(stderr,
            "perf: --mem device, but ncclMemAlloc gave host memory: the library has no device "
            "path (NCCL_DEBUG=INFO says why)\n");
    die();
  }
  return p;
}

/* Both buffers hold the larger side: in-place runs keep the input inside the receive buffer
 * (ReduceScatter: all of it). */
static void alloc_buffers(perf_rank_t* r) {
  perf_counts_t n;
  r->coll->counts(r->o->max_bytes, 1, r->nranks, &n); /* 1-byte elements: the largest counts */
  size_t bytes = n.send > n.recv ? n.send : n.recv;
  r->send_slot = r->recv_slot = (bytes + 63) / 64 * 64;
  r->hsend = xalloc(r->send_slot * (size_t)r->o->agg);
  r->hrecv = xalloc(r->recv_slot * (size_t)r->o->agg);
  r->send = r->o->mem_device ? device_alloc(r, r->send_slot * (size_t)r->o->agg) : r->hsend;
  r->recv = r->o->mem_device ? device_alloc(r, r->recv_slot * (size_t)r->o->agg) : r->hrecv;
}

static void free_buffers(perf_rank_t* r) {
  if (r->send != r->hsend) ncclMemFree(r->send);
  if (r->recv != r->hrecv) ncclMemFree(r->recv);
  free(r->hsend);
  free(r->hrecv);
}

/* --mem device: a rank works on its index on the host modulo the devices there are (one
 * process per GPU, or threads; several ranks share a GPU when there are more ranks than
 * GPUs). The index is the launcher's local rank where it gives one, else the rank. */
static void bind_device(perf_rank_t* r) {
  if (r->o->mem_device && perf_dev_bind(r->host_rank % perf_dev_count(NULL), &r->stream)) die();
}

static void* rank_main(void* arg) {
  perf_rank_t* r = arg;
  bind_device(r);
  if (!r->coll->mpi_native) init_comm(r);
  if (r->proc_comm) {
    PERF_NCCL(r, ncclCommSplit(r->comm, 0, r->rank, &r->timing_comm, NULL));
    perf_team_use_comm(r->timing_comm);
  }
  alloc_buffers(r);
  run_all(r);
  free_buffers(r);
  if (r->proc_comm) PERF_NCCL(r, ncclCommDestroy(r->timing_comm));
  if (!r->coll->mpi_native) PERF_NCCL(r, ncclCommDestroy(r->comm));
  return NULL;
}

/* -T: a collective running longer than the timeout ends the process. */
static void* watchdog(void* arg) {
  const perf_opts_t* o = arg;
  for (;;) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    double now = perf_now();
    for (int i = 0; i < MAX_RANKS_WATCHED; i++) {
      double since = g_inflight[i];
      if (since == 0 || now - since < o->timeout) continue;
      char host[256];
      perf_hostname(host, sizeof(host));
      fprintf(stderr, "%s: Test timeout (%ds) rank %d\n", host, o->timeout, i);
      die();
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------- process */

typedef struct {
  int proc, nprocs;
  int local;    /* this process's index on its host, as the launcher says (else proc) */
  int from_env; /* launched with the rank in the environment: no MPI, the NCCL comm carries
                 * the timings */
  int mpi;      /* MPI_Init was called */
} perf_world_t;

/* The launchers that start one process per rank and say which in the environment, in the
 * order they are believed (a launcher run inside another's job sees both: the inner one
 * wins): torchrun's names, Open MPI's (read here only when the tool is built without MPI:
 * with it, mpirun's processes call MPI_Init), MPICH's Hydra and Intel MPI (PMI), Slurm's
 * srun. NCCL_COMM_ID names the bootstrap root. */
static const struct launcher {
  const char *name, *rank, *size, *local;
} kLaunchers[] = {
    {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}};

/* A variable's value in [0, 2^24]: 1, unset or empty: 0, anything else: -1. */
static int env_int(const char* name, long* out) {
  const char* s = getenv(name);
  if (s == NULL || *s == '\0') return 0;
  char* end;
  long v = strtol(s, &end, 10);
  if (*end != '\0' || v < 0 || v > (1L << 24)) return -1;
  *out = v;
  return 1;
}

/* This process's rank from a launcher's pair of variables; 0 when neither is set. A half
 * pair, a rank outside the size, or several ranks without NCCL_COMM_ID end the process. */
static int world_from_launcher(const struct launcher* k, perf_world_t* w) {
  long r = -1, n = -1, local;
  int has_rank = env_int(k->rank, &r), has_size = env_int(k->size, &n);
  if (has_rank == 0 && has_size == 0) return 0;
  if (has_rank != 1 || has_size != 1 || n < 1 || r >= n) {
    fprintf(stderr, "perf: %s=%s %s=%s: need 0 <= %s < %s\n", k->rank,
            getenv(k->rank) ? getenv(k->rank) : "(unset)", k->size,
            getenv(k->size) ? getenv(k->size) : "(unset)", k->rank, k->size);
    exit(EXIT_FAILURE);
  }
  if (n > 1 && getenv("NCCL_COMM_ID") == NULL) {
    fprintf(stderr, "perf: ranks launched by %s need NCCL_COMM_ID=host:port (rank 0's)\n", k->name);
    exit(EXIT_FAILURE);
  }
  w->proc = (int)r;
  w->nprocs = (int)n;
  w->local = env_int(k->local, &local) == 1 ? (int)local : w->proc;
  w->from_env = 1;
  return 1;
}

/* A process whose launcher put its rank in the environment. Under Open MPI's mpirun, MPI
 * decides when the tool is built with it. */
static int world_from_env(perf_world_t* w) {
#if PERF_HAVE_MPI
  if (getenv("OMPI_COMM_WORLD_SIZE") != NULL) return 0;
#endif
  for (size_t i = 0; i < sizeof(kLaunchers) / sizeof(kLaunchers[0]); i++)
    if (world_from_launcher(&kLaunchers[i], w)) return 1;
  return 0;
}

static void world_init(int* argc, char*** argv, perf_world_t* w) {
  *w = (perf_world_t){.proc = 0, .nprocs = 1};
  if (world_from_env(w)) return;
#if PERF_HAVE_MPI
  int provided;
  long local;
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &w->proc);
  MPI_Comm_size(MPI_COMM_WORLD, &w->nprocs);
  w->local = env_int("OMPI_COMM_WORLD_LOCAL_RANK", &local) == 1 ? (int)local : w->proc;
  w->mpi = 1;
#else
  (void)argc;
  (void)argv;
#endif
}

static int world_end(const perf_world_t* w, int status) {
#if PERF_HAVE_MPI
  if (w->mpi) MPI_Finalize();
#else
  (void)w;
#endif
  return status;
}

static void print_devices(const perf_world_t* w, int nthreads) {
  static char line[DEVICE_LINES];
  line[0] = '\0';
  perf_device_lines(line, sizeof(line), w->proc, nthreads);
#if PERF_HAVE_MPI
  if (w->mpi && w->nprocs > 1) {
    char* all = w->proc == 0 ? malloc((size_t)w->nprocs * DEVICE_LINES) : NULL;
    MPI_Gather(line, DEVICE_LINES, MPI_CHAR, all, DEVICE_LINES, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int p = 0; all && p < w->nprocs; p++) printf("%s", all + (size_t)p * DEVICE_LINES);
    free(all);
    return;
  }
#endif
  printf("%s", line);
}

/* Process 0 makes the id; under mpirun MPI_Bcast hands it to the others. Launched from the
 * environment, every process makes it from NCCL_COMM_ID. */
static void bootstrap_id(const perf_world_t* w, ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  if (w->proc == 0 || w->from_env) PERF_NCCL(NULL, ncclGetUniqueId(id));
#if PERF_HAVE_MPI
  if (w->mpi && w->nprocs > 1) MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
}

static void run_ranks(const perf_world_t* w, const perf_opts_t* o, const perf_coll_t* coll,
                      perf_rank_t* ranks) {
  ncclUniqueId id;
  if (!coll->mpi_native) bootstrap_id(w, &id);
  for (int t = 0; t < o->nthreads; t++) {
    perf_rank_t* r = &ranks[t];
    r->o = o;
    r->coll = coll;
    r->proc = w->proc;
    r->thread = t;
    r->rank = w->proc * o->nthreads + t;
    r->host_rank = w->local * o->nthreads + t;
    r->nranks = w->nprocs * o->nthreads;
    r->proc_comm = w->from_env && w->nprocs > 1;
    if (!coll->mpi_native) r->id = id;
  }
  for (int t = 1; t < o->nthreads; t++)
    if (pthread_create(&ranks[t].tid, NULL, rank_main, &ranks[t]) != 0) {
      fprintf(stderr, "perf: pthread_create failed\n");
      die();
    }
  rank_main(&ranks[0]); /* thread 0 is the main thread: the only one calling MPI */
  for (int t = 1; t < o->nthreads; t++) pthread_join(ranks[t].tid, NULL);
}

int perf_main(int argc, char** argv, const perf_coll_t* coll) {
  perf_world_t w;
  perf_opts_t o;
  setvbuf(stdout, NULL, _IOLBF, 0);
  world_init(&argc, &argv, &w);
  int rc = perf_parse_args(argc, argv, coll, w.proc == 0, &o);
  if (rc == 0 && coll->has_root && o.root >= w.nprocs * o.nthreads) {
    if (w.proc == 0)
      fprintf(stderr, "%s: invalid root %d for %d ranks\n", coll->name, o.root,
              w.nprocs * o.nthreads);
    rc = -1;
  }
  if (rc == 0 && w.from_env && w.nprocs > 1 && (o.nthreads != 1 || coll->mpi_native)) {
    if (w.proc == 0 && coll->mpi_native)
      fprintf(stderr, "%s: runs under Open MPI's mpirun only\n", coll->name);
    else if (w.proc == 0)
      fprintf(stderr, "%s: launched without mpirun, a process runs one Braid rank (-t 1)\n",
              coll->name);
    rc = -1;
  }
  if (rc != 0) return world_end(&w, rc > 0 ? 0 : EXIT_FAILURE);
  perf_team_init(o.nthreads, w.nprocs);
  if (w.proc == 0) {
    perf_print_config(&o);
    printf("# Using devices\n");
  }
  print_devices(&w, o.nthreads);
  if (w.proc == 0) perf_print_table_header(&o);
  pthread_t dog;
  if (o.timeout > 0) pthread_create(&dog, NULL, watchdog, &o);
  perf_rank_t* ranks = calloc((size_t)o.nthreads, sizeof(*ranks));
  run_ranks(&w, &o, coll, ranks);
  int errors = ranks[0].errors;
  double avg = ranks[0].bw_count ? ranks[0].bw_sum / ranks[0].bw_count : 0;
  if (w.proc == 0) perf_print_footer(errors, avg);
  free(ranks);
  return world_end(&w, errors ? EXIT_FAILURE : EXIT_SUCCESS);
}
