/*
 * Group state (per thread, as the NCCL API defines groups per thread) and
 * the loop that drives every queued operation to completion: ops of one
 * comm in order, different comms concurrently, sleeping in the progress
 * engine when nothing can move.
 */
#include "group.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "core.h"
#include "param.h"

#define GROUP_WAIT_SLICE_MS 100

struct group_op {
  struct ncclComm* comm;
  struct exec_args args;
  int started;
  int done;
};

struct group_job {
  ncclResult_t (*fn)(void*);
  void* arg;
  pthread_t thread;
  ncclResult_t result;
};

static __thread struct {
  int depth;
  ncclResult_t error;
  struct group_op* ops;
  int nops, cap;
  struct group_job* jobs;
  int njobs, cap_jobs;
} t_group;

int group_depth(void) {
  return t_group.depth;
}

void group_record_error(ncclResult_t err) {
  if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = err;
}

/* Grow a per-thread array; happens while queueing, never while running. */
static ncclResult_t grow(void** arr, int* cap, int need, size_t elem) {
  if (need <= *cap) return ncclSuccess;
  int n = *cap ? 2 * *cap : 16;
  while (n < need) n *= 2;
  void* p = realloc(*arr, (size_t)n * elem);
  if (p == NULL) {
    WARN("Out of memory queueing group operations");
    return ncclSystemError;
  }
  *arr = p;
  *cap = n;
  return ncclSuccess;
}

ncclResult_t group_add_job(ncclResult_t (*fn)(void*), void* arg) {
  ncclResult_t res = ncclSuccess;
  CHECK(
      grow((void**)&t_group.jobs, &t_group.cap_jobs, t_group.njobs + 1, sizeof(struct group_job)));
  t_group.jobs[t_group.njobs++] = (struct group_job){fn, arg, 0, ncclSuccess};
fail:
  return res;
}

static void* job_main(void* p) {
  struct group_job* j = p;
  j->result = j->fn(j->arg);
  return NULL;
}

static ncclResult_t run_jobs(struct group_job* jobs, int n) {
  ncclResult_t first = ncclSuccess;
  for (int i = 0; i < n; i++)
    if (pthread_create(&jobs[i].thread, NULL, job_main, &jobs[i]) != 0) {
      WARN("Cannot start a thread for a grouped operation");
      jobs[i].result = jobs[i].fn(jobs[i].arg); /* run it here instead */
      jobs[i].thread = 0;
    }
  for (int i = 0; i < n; i++) {
    if (jobs[i].thread) pthread_join(jobs[i].thread, NULL);
    if (first == ncclSuccess) first = jobs[i].result;
  }
  return first;
}

/* Start op i when its comm's executor is free (earlier ops of the same comm
 * come first in the queue, so per-comm order is kept). */
static ncclResult_t op_step(struct group_op* op, int* progressed) {
  ncclResult_t res;
  if (!op->started) {
    if (op->comm->exec.busy) return ncclSuccess;
    if ((res = exec_start(op->comm, &op->args)) != ncclSuccess) return res;
    op->started = 1;
  }
  return exec_progress(op->comm, &op->done, progressed);
}

/* Sleep until one of the running comms has an event. */
static ncclResult_t ops_wait(struct group_op* ops, int n) {
  struct progress* engines[64];
  int m = 0;
  for (int i = 0; i < n && m < 64; i++) {
    if (ops[i].done || !ops[i].started) continue;
    int seen = 0;
    for (int j = 0; j < m; j++) seen |= engines[j] == &ops[i].comm->progress;
    if (!seen) engines[m++] = &ops[i].comm->progress;
  }
  return m ? progress_wait(engines, m, GROUP_WAIT_SLICE_MS) : ncclSuccess;
}

/* Sleep only after BRAID_SPIN_US of finding nothing to do: a wake-up costs
 * a context switch, a short poll may not. Yielding while polling leaves
 * the core to peers on an oversubscribed host. */
static int ops_keep_polling(uint64_t* idle_since) {
  uint64_t spin_ns = (uint64_t)param_spin_us() * 1000ull;
  if (spin_ns == 0) return 0;
  uint64_t now = braid_now_ns();
  if (*idle_since == 0) *idle_since = now;
  if (now - *idle_since >= spin_ns) return 0;
  sched_yield();
  return 1;
}

static ncclResult_t ops_run(struct group_op* ops, int n) {
  ncclResult_t res = ncclSuccess, first = ncclSuccess;
  int remaining = n;
  uint64_t idle_since = 0;
  for (int i = 0; i < n; i++) atomic_fetch_add(&ops[i].comm->active, 1);
  while (remaining > 0) {
    int progressed = 0;
    for (int i = 0; i < n; i++) {
      if (ops[i].done) continue;
      res = op_step(&ops[i], &progressed);
      if (res != ncclSuccess && first == ncclSuccess) first = res;
      if (res != ncclSuccess || ops[i].done) {
        ops[i].done = 1;
        remaining--;
        progressed = 1;
      }
    }
    if (progressed || remaining == 0) {
      idle_since = 0;
    } else if (!ops_keep_polling(&idle_since)) {
      CHECK(ops_wait(ops, n));
      idle_since = 0;
    }
  }
fail:
  for (int i = 0; i < n; i++) atomic_fetch_sub(&ops[i].comm->active, 1);
  return first != ncclSuccess ? first : res;
}

ncclResult_t group_enqueue(struct ncclComm* comm, const struct exec_args* args) {
  ncclResult_t res = ncclSuccess;
  if (t_group.depth == 0) {
    struct group_op op = {comm, *args, 0, 0};
    return ops_run(&op, 1);
  }
  CHECK(grow((void**)&t_group.ops, &t_group.cap, t_group.nops + 1, sizeof(struct group_op)));
  t_group.ops[t_group.nops++] = (struct group_op){comm, *args, 0, 0};
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclGroupStart, void);
ncclResult_t ncclGroupStart(void) {
  t_group.depth++;
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void);
ncclResult_t ncclGroupEnd(void) {
  ncclResult_t res = ncclSuccess;
  if (t_group.depth == 0) {
    WARN("ncclGroupEnd: not in a group call (missing ncclGroupStart)");
    return ncclInvalidUsage;
  }
  if (--t_group.depth > 0) return ncclSuccess;
  int njobs = t_group.njobs, nops = t_group.nops;
  t_group.njobs = t_group.nops = 0;
  ncclResult_t queued = t_group.error;
  t_group.error = ncclSuccess;
  if (njobs) CHECK(run_jobs(t_group.jobs, njobs)); /* jobs own their args: always run */
  if (queued != ncclSuccess) {
    WARN("ncclGroupEnd: a call inside the group failed; its collectives were not run");
    return queued;
  }
  if (nops) CHECK(ops_run(t_group.ops, nops));
fail:
  return res;
}
