/*
 * Groups, per thread as the NCCL API defines them: ncclGroupStart/End
 * nest, and the calls issued inside are queued and handed over together at
 * the outermost ncclGroupEnd - run now by this thread, queued on a host
 * stream, or (non-blocking comms) queued on the comm's own stream. Deferred
 * jobs such as communicator inits run there too, each on its own thread.
 */
#include "api/group.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "engine/device.h"
#include "engine/exec_plan.h"
#include "kernels.h"
#include "engine/stream.h"
#include "tune/tuner.h"
#include "engine/work.h"

struct group_job {
  ncclResult_t (*fn)(void*);
  void* arg;
  pthread_t thread; /* valid only when started: pthread_t has no "none" value */
  int started;
  ncclResult_t result;
};

static __thread struct {
  int depth;
  ncclResult_t error;
  struct work_op* ops;
  int nops, cap;
  cudaStream_t stream; /* every call of a group names the same one */
  struct group_job* jobs;
  int njobs, cap_jobs;
} t_group;

int group_depth(void) {
  return t_group.depth;
}

void group_record_error(ncclResult_t err) {
  if (t_group.depth > 0 && t_group.error == ncclSuccess) t_group.error = err;
}

/* The per-thread arrays are freed when their thread exits (a thread per
 * rank comes and goes; its queue must not stay behind): a key whose
 * destructor runs at exit, set once the thread has something to free. */
static pthread_key_t g_group_key;
static pthread_once_t g_group_key_once = PTHREAD_ONCE_INIT;

static void group_thread_exit(void* unused) {
  (void)unused;
  free(t_group.ops);
  free(t_group.jobs);
  t_group.ops = NULL;
  t_group.jobs = NULL;
  t_group.cap = t_group.cap_jobs = t_group.nops = t_group.njobs = 0;
}

static void group_key_make(void) {
  pthread_key_create(&g_group_key, group_thread_exit);
}

/* Grow a per-thread array; happens while queueing, never while running. */
static ncclResult_t grow(void** arr, int* cap, int need, size_t elem) {
  if (need <= *cap) return ncclSuccess;
  if (*cap == 0) { /* this thread's first: free it when the thread ends */
    pthread_once(&g_group_key_once, group_key_make);
    pthread_setspecific(g_group_key, &t_group);
  }
  int n = *cap ? 2 * *cap : 16;
  while (n < need) n *= 2;
  ncclResult_t res = braid_realloc(arr, (size_t)n, elem);
  if (res == ncclSuccess) *cap = n;
  return res;
}

ncclResult_t group_add_job(ncclResult_t (*fn)(void*), void* arg) {
  ncclResult_t res = ncclSuccess;
  CHECK(
      grow((void**)&t_group.jobs, &t_group.cap_jobs, t_group.njobs + 1, sizeof(struct group_job)));
  t_group.jobs[t_group.njobs++] = (struct group_job){.fn = fn, .arg = arg, .result = ncclSuccess};
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
  for (int i = 0; i < n; i++) {
    jobs[i].started = pthread_create(&jobs[i].thread, NULL, job_main, &jobs[i]) == 0;
    if (!jobs[i].started) {
      WARN("Cannot start a thread for a grouped operation");
      jobs[i].result = jobs[i].fn(jobs[i].arg); /* run it here instead */
    }
  }
  for (int i = 0; i < n; i++) {
    if (jobs[i].started) pthread_join(jobs[i].thread, NULL);
    if (first == ncclSuccess) first = jobs[i].result;
  }
  return first;
}

/* Whether the unit names nothing but host memory and the NULL stream:
 * then it is the host path's whatever the build (the device path takes
 * only units that name a CUDA stream or device memory). */
static int unit_on_host(const struct work_op* ops, int n) {
  for (int i = 0; i < n; i++) {
    enum mem_kind mem = ops[i].kind == WORK_COLL ? ops[i].args.mem : ops[i].mem;
    if (ops[i].stream != NULL || mem != MEM_HOST) return 0;
  }
  return 1;
}

/* Hand a unit of work to whoever runs it: its CUDA streams (device calls),
 * a host stream, the comm's own stream (non-blocking comms), or this
 * thread now. */
static ncclResult_t work_dispatch(struct work_op* ops, int n, cudaStream_t stream) {
  struct braid_stream* hs = stream_from_handle(stream);
  if (hs == NULL && !unit_on_host(ops, n) && device_unit_wanted(ops, n))
    return device_unit_dispatch(ops, n);
  ncclResult_t res = work_issue(ops, n);
  if (res != ncclSuccess) return res;
  for (int i = 0; i < n && hs == NULL; i++)
    if (atomic_load(&ops[i].comm->nonblocking)) hs = ops[i].comm->internal_stream;
  if (hs == NULL) return work_run(ops, n);
  res = work_submit(hs, ops, n, NULL, 0);
  if (res != ncclSuccess) { /* never queued: give its turns back, or later work waits forever */
    work_cancel(ops, n);
    return res;
  }
  return hs == stream_from_handle(stream) ? ncclSuccess : ncclInProgress;
}

ncclResult_t group_enqueue_op(const struct work_op* op, cudaStream_t stream) {
  ncclResult_t res = ncclSuccess;
  if (t_group.depth == 0) {
    struct work_op one = *op;
    one.stream = stream;
    return work_dispatch(&one, 1, stream);
  }
  /* CUDA streams may differ within a group (each is gated); a host stream
   * runs the whole group, so it must be the only one */
  if (t_group.nops > 0 && stream != t_group.stream &&
      (stream_from_handle(stream) || stream_from_handle(t_group.stream)))
    FAIL(ncclInvalidUsage, "Calls in one group must use one host stream (%p, then %p)",
         (void*)t_group.stream, (void*)stream);
  CHECK(grow((void**)&t_group.ops, &t_group.cap, t_group.nops + 1, sizeof(struct work_op)));
  if (t_group.nops == 0 || stream_from_handle(stream)) t_group.stream = stream;
  t_group.ops[t_group.nops] = *op;
  t_group.ops[t_group.nops++].stream = stream;
  comm_ref(op->comm); /* the queued op's: its comm may be destroyed before the group ends */
fail:
  return res;
}

/* Let go of the queued ops' comms (group_enqueue_op's references). */
static void group_unref(struct work_op* ops, int n) {
  for (int i = 0; i < n; i++) comm_unref(ops[i].comm);
}

/* Count every queued op's comm in as a call (comm_call_enter's count), so
 * that none is freed under the group's end; ncclInvalidArgument when one
 * was destroyed or aborted since its op was queued. *entered: how many
 * ops are counted (for group_leave). */
static ncclResult_t group_enter(const char* fn, struct work_op* ops, int n, int* entered) {
  for (*entered = 0; *entered < n; (*entered)++)
    if (!comm_registry_enter(ops[*entered].comm)) {
      WARN(
          "%s: comm %p was destroyed or aborted after a call was queued on it; the group's "
          "calls were not run",
          fn, (void*)ops[*entered].comm);
      return ncclInvalidArgument;
    }
  return ncclSuccess;
}

static void group_leave(struct work_op* ops, int entered, int n) {
  for (int i = 0; i < entered; i++) comm_call_leave(ops[i].comm);
  group_unref(ops, n);
}

ncclResult_t group_enqueue(struct ncclComm* comm, const struct exec_args* args,
                           cudaStream_t stream) {
  struct work_op op;
  memset(&op, 0, sizeof(op));
  op.comm = comm;
  op.kind = WORK_COLL;
  op.args = *args;
  return group_enqueue_op(&op, stream);
}

NCCL_API(ncclResult_t, ncclGroupStart, void);
ncclResult_t ncclGroupStart(void) {
  t_group.depth++;
  return ncclSuccess;
}

/* The outermost group closes: its jobs run (they own their arguments), and
 * its queued operations are handed to the caller in *nops (t_group.ops),
 * unless a call inside the group failed: that error, nothing to run. */
static ncclResult_t group_close(const char* fn, int* nops) {
  ncclResult_t res = ncclSuccess;
  int njobs = t_group.njobs;
  *nops = t_group.nops;
  t_group.depth = 0;
  t_group.njobs = t_group.nops = 0;
  ncclResult_t queued = t_group.error;
  t_group.error = ncclSuccess;
  if (njobs) res = run_jobs(t_group.jobs, njobs);
  if (res == ncclSuccess && queued != ncclSuccess) {
    WARN("%s: a call inside the group failed; its other calls were not run", fn);
    res = queued;
  }
  if (res != ncclSuccess) {
    group_unref(t_group.ops, *nops);
    *nops = 0;
  }
  return res;
}

NCCL_API(ncclResult_t, ncclGroupEnd, void);
ncclResult_t ncclGroupEnd(void) {
  ncclResult_t res = ncclSuccess;
  int nops;
  if (t_group.depth == 0) {
    WARN("ncclGroupEnd: not in a group call (missing ncclGroupStart)");
    return ncclInvalidUsage;
  }
  if (--t_group.depth > 0) return ncclSuccess;
  CHECK(group_close("ncclGroupEnd", &nops));
  int entered = 0;
  res = group_enter("ncclGroupEnd", t_group.ops, nops, &entered);
  if (res == ncclSuccess && nops) res = work_dispatch(t_group.ops, nops, t_group.stream);
  group_leave(t_group.ops, entered, nops);
fail:
  return res;
}

/* Modelled time (us) of one queued operation: a collective's under the
 * algorithm the tuner would pick, a send or receive's over the link to its
 * peer (one message: the link's ring alpha and beta). */
static double op_estimate(struct work_op* op) {
  struct ncclComm* comm = op->comm;
  if (op->kind == WORK_COLL) {
    struct sched_key key;
    exec_plan(comm, &op->args, &key);
    return tuner_cost(&comm->tune, op->args.coll, op->args.algo,
                      (double)(op->args.count * kern_type_size(op->args.type)));
  }
  if (op->peer == comm->rank) return 0;
  const int* node = comm->layout.node_of;
  int same = node == NULL || node[op->peer] == node[comm->rank];
  const struct tuner_link* l = same ? &comm->tune.intra : &comm->tune.net;
  return l->alpha_us[ALGO_RING] + (double)op->bytes / 1024.0 * l->beta_us_per_kb[ALGO_RING];
}

/* Ends the outermost group like ncclGroupEnd, but runs none of its calls:
 * their modelled times add up in simInfo->estimatedTime (the calls of a
 * group run one after another on each comm). Deferred inits still run:
 * they own their arguments. */
NCCL_API(ncclResult_t, ncclGroupSimulateEnd, ncclSimInfo_t* simInfo);
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  ncclResult_t res = ncclSuccess;
  if (t_group.depth == 0) {
    WARN("ncclGroupSimulateEnd: not in a group call (missing ncclGroupStart)");
    return ncclInvalidUsage;
  }
  if (simInfo == NULL || simInfo->magic != 0x74685283u ||
      simInfo->size < offsetof(ncclSimInfo_t, estimatedTime) + sizeof(float)) {
    WARN("ncclGroupSimulateEnd: simInfo was not initialized with NCCL_SIM_INFO_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (t_group.depth > 1) {
    WARN("ncclGroupSimulateEnd: must end the outermost group (depth %d)", t_group.depth);
    return ncclInvalidUsage;
  }
  int nops, entered = 0;
  CHECK(group_close("ncclGroupSimulateEnd", &nops));
  res = group_enter("ncclGroupSimulateEnd", t_group.ops, nops, &entered);
  double us = 0;
  for (int i = 0; res == ncclSuccess && i < nops; i++) us += op_estimate(&t_group.ops[i]);
  group_leave(t_group.ops, entered, nops);
  CHECK(res);
  simInfo->estimatedTime = (float)us;
  INFO(SUB_TUNING, "ncclGroupSimulateEnd: %d calls, %.1f us modelled", nops, us);
fail:
  return res;
}
