/* Internals shared by the perf driver (bench.c) and common.c: parsed options, table printing,
 * the thread/process team used for barriers and for aggregating timings and error counts. */
#ifndef BRAID_PERF_DRIVER_H_
#define BRAID_PERF_DRIVER_H_

#include <stddef.h>

#include "common.h"

/* Most turns --det-turns takes. */
#define PERF_MAX_TURNS 64

/* nccl-tests' command line, same defaults. */
typedef struct {
  int nthreads, ngpus;
  size_t min_bytes, max_bytes, step_bytes, step_factor;
  int iters, warmup, agg, check, average, blocking, timeout, cycles, root;
  int parallel_init, stream_null, cputime;
  int inplace;    /* 0: skip the in-place half of each row (Braid's --inplace, not nccl-tests') */
  int mem_device; /* --mem device (the default where a CUDA device is visible) or host */
  int det_turns;  /* Braid's --det-turns: turns of the two reduction modes per size, 0: none */
  int type_index; /* into perf_type_at, -1: all */
  int op_index;   /* into perf_op_at, -1: all */
} perf_opts_t;

/* Aggregation modes of perf_team_reduce: -a values 0..3, then a plain sum. */
enum { PERF_AGG_RANK0, PERF_AGG_AVG, PERF_AGG_MIN, PERF_AGG_MAX, PERF_AGG_SUM };

/* Parses argv; only `printer` writes messages. Returns 0 to run, 1 after -h, -1 on errors. */
int perf_parse_args(int argc, char** argv, const perf_coll_t* coll, int printer, perf_opts_t* o);

/* Output, all on stdout; callers print only from rank 0. */
void perf_print_config(const perf_opts_t* o);
/* One "#  Rank ..." line per thread of this process, appended to line (cap bytes). */
void perf_device_lines(char* line, size_t cap, int proc, int nthreads);
void perf_print_table_header(const perf_opts_t* o);
void perf_print_row_start(size_t bytes, size_t count, const char* type, const char* op, int root);
void perf_print_result(double usec, double algbw, double busbw, int check, double wrong);
void perf_print_skipped(void); /* the columns of a half not run (--inplace 0) */
void perf_print_footer(int errors, double avg_busbw);

/* Team of nthreads threads in each of nprocs processes; thread 0 is the one that calls MPI. */
void perf_team_init(int nthreads, int nprocs);
double perf_team_reduce(int thread, double value, int mode);
/* Launched without MPI (rank in the environment): combine across processes over this comm. */
void perf_team_use_comm(ncclComm_t comm);
void perf_team_barrier(int thread);

double perf_now(void);                     /* seconds, CLOCK_MONOTONIC */
void perf_hostname(char* buf, size_t cap); /* short host name */

#endif /* BRAID_PERF_DRIVER_H_ */
