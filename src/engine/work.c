/*
 * Running a unit of work: lock its communicators (in address order, so two
 * threads never deadlock on each other), make the connections it needs,
 * then drive every operation until all are done - collectives of a comm one
 * after another on its executor, point-to-point all at once - polling
 * briefly and then sleeping in the progress engines when nothing moves.
 */
#include "engine/work.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "engine/connect.h"
#include "core.h"
#include "engine/device.h"
#include "engine/exec_plan.h"
#include "status/work_flight.h"
#include "param.h"
#include "engine/plan.h"
#include "engine/redop.h"
#include "engine/stream.h"
#include "engine/work_p2p.h"

#define WORK_WAIT_SLICE_MS 100
#define WORK_MAX_COMMS 64

static int ptr_cmp(const void* a, const void* b) {
  uintptr_t x = *(const uintptr_t*)a, y = *(const uintptr_t*)b;
  return x < y ? -1 : x > y;
}

/* The distinct comms of the work, sorted; returns how many (<= max). */
static int work_comms(const struct work_op* ops, int n, struct ncclComm** out, int max) {
  int m = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int j = 0; j < m && !seen; j++) seen = out[j] == ops[i].comm;
    if (!seen && m < max) out[m++] = ops[i].comm;
  }
  if (m > 1) qsort(out, (size_t)m, sizeof(*out), ptr_cmp); /* one comm: most calls */
  return m;
}

/* Whether a comm's executor waits for a device task, whose completion
 * wakes nobody. */
static int tasks_pending(struct ncclComm* const* comms, int m) {
  for (int i = 0; i < m; i++)
    if (exec_tasks_pending(&comms[i]->exec)) return 1;
  return 0;
}

/* Sleep only after BRAID_SPIN_US of finding nothing to do: a wake-up costs
 * a context switch, a short poll may not. Yielding while polling leaves
 * the core to peers on an oversubscribed host. A device task in flight
 * keeps the loop polling: nothing would wake it when the task is done. */
static int keep_polling(uint64_t* idle_since, struct ncclComm* const* comms, int m) {
  uint64_t spin_ns = (uint64_t)param_spin_us() * 1000ull;
  if (tasks_pending(comms, m)) {
    sched_yield();
    return 1;
  }
  if (spin_ns == 0) return 0;
  uint64_t now = braid_now_ns();
  if (*idle_since == 0) *idle_since = now;
  if (now - *idle_since >= spin_ns) return 0;
  sched_yield();
  return 1;
}

static ncclResult_t work_wait(struct ncclComm* const* comms, int m) {
  struct progress* engines[WORK_MAX_COMMS];
  struct transport_waits* waits[WORK_MAX_COMMS];
  for (int i = 0; i < m; i++) engines[i] = &comms[i]->progress, waits[i] = &comms[i]->waits;
  return progress_wait(engines, waits, m, WORK_WAIT_SLICE_MS);
}

/* Point-to-point operations have no executor to watch them: abort and the
 * no-progress timeout are checked here. */
static ncclResult_t p2p_alive(const struct work_op* op, uint64_t last_progress_ns) {
  struct ncclComm* c = op->comm;
  if (atomic_load(&c->aborted)) {
    WARN("Communicator aborted while rank %d was in a send/recv", c->rank);
    return ncclSystemError;
  }
  if (braid_now_ns() - last_progress_ns > (uint64_t)c->tctx.timeout_ms * 1000000ull) {
    WARN("Rank %d: %s with rank %d made no progress for %lld ms (BRAID_TIMEOUT_MS)", c->rank,
         op->kind == WORK_SEND ? "send" : "recv", op->peer, (long long)c->tctx.timeout_ms);
    return ncclSystemError;
  }
  return ncclSuccess;
}

static ncclResult_t op_step(struct work_op* op, uint64_t pass, uint64_t last_progress_ns,
                            int* progressed) {
  ncclResult_t res;
  if (op->kind != WORK_COLL) {
    int was_started = op->started;
    res = p2p_step(op, pass, progressed);
    if (!was_started && op->started) work_flight_start(op);
    return res == ncclSuccess && !op->done && !*progressed ? p2p_alive(op, last_progress_ns) : res;
  }
  if (op->direct) { /* blocks until done: the unit's ops are all one comm's, run in turn */
    op->done = 1;
    *progressed = 1;
    work_flight_start(op);
    return device_direct_run(op); /* reads a PreMulSum's scalar itself */
  }
  if (!op->started) {
    if (op->comm->exec.busy) return ncclSuccess; /* an earlier collective of this comm runs */
    if (op->args.scalar_src && (res = redop_scalar_read(&op->args)) != ncclSuccess) return res;
    if ((res = exec_comm_start(op->comm, &op->args)) != ncclSuccess) return res;
    op->started = 1;
    work_flight_start(op);
  }
  return exec_comm_progress(op->comm, &op->done, progressed);
}

static ncclResult_t work_drive(struct work_op* ops, int n, struct ncclComm* const* comms, int m) {
  ncclResult_t res = ncclSuccess, first = ncclSuccess;
  uint64_t pass = 0, idle_since = 0, last_progress = braid_now_ns();
  int remaining = 0;
  for (int i = 0; i < n; i++) remaining += !ops[i].done;
  while (remaining > 0) {
    int progressed = 0;
    pass++;
    for (int i = 0; i < m; i++) progress_pass_begin(&comms[i]->progress, &comms[i]->waits);
    for (int i = 0; i < n; i++) {
      if (ops[i].done) continue;
      int moved = 0;
      res = op_step(&ops[i], pass, last_progress, &moved);
      if (res != ncclSuccess) {
        if (first == ncclSuccess) first = res;
        comm_set_error(ops[i].comm, res);
        ops[i].done = 1;
      }
      if (moved) work_flight_progress(&ops[i], 0);
      if (ops[i].done) remaining--, moved = 1, work_flight_end(&ops[i], res);
      progressed |= moved;
    }
    if (progressed || remaining == 0) {
      idle_since = 0;
      last_progress = braid_now_ns();
      continue;
    }
    if (idle_since == 0) /* it stops moving: the recorder counts what it waits with */
      for (int i = 0; i < n; i++)
        if (!ops[i].done) work_flight_progress(&ops[i], 1);
    if (!keep_polling(&idle_since, comms, m)) {
      CHECK(work_wait(comms, m));
      idle_since = 0;
    }
  }
fail:
  return first != ncclSuccess ? first : res;
}

/* The comms of a unit, checked against the limit. */
static ncclResult_t unit_comms(const struct work_op* ops, int n, struct ncclComm** comms, int* m) {
  struct ncclComm* more[WORK_MAX_COMMS + 1];
  if (work_comms(ops, n, more, WORK_MAX_COMMS + 1) > WORK_MAX_COMMS) {
    WARN("A group may span at most %d communicators", WORK_MAX_COMMS);
    return ncclInvalidUsage;
  }
  *m = work_comms(ops, n, comms, WORK_MAX_COMMS);
  return ncclSuccess;
}

static uint64_t unit_ticket(const struct work_op* ops, int n, const struct ncclComm* c) {
  for (int i = 0; i < n; i++)
    if (ops[i].comm == c) return ops[i].ticket;
  return 0;
}

/* Tickets of all the unit's comms are taken together (their locks held in
 * address order), so two units never hold tickets in opposite orders on
 * two comms: waiting for turns cannot deadlock. */
ncclResult_t work_issue(struct work_op* ops, int n) {
  struct ncclComm* comms[WORK_MAX_COMMS];
  int m;
  ncclResult_t res = unit_comms(ops, n, comms, &m);
  if (res != ncclSuccess) return res;
  for (int i = 0; i < m; i++) pthread_mutex_lock(&comms[i]->turn_lock);
  for (int i = 0; i < n; i++) {
    ops[i].ticket = ops[i].comm->next_ticket;
    work_flight_enqueue(&ops[i]); /* numbered in issue order, under the lock */
  }
  for (int i = m - 1; i >= 0; i--) {
    comms[i]->next_ticket++;
    comm_ref(comms[i]); /* the unit's, until it has run: it may wait on a host stream */
    pthread_mutex_unlock(&comms[i]->turn_lock);
  }
  return ncclSuccess;
}

/* Wait until it is this unit's turn on `c`; abort ends the wait. */
static ncclResult_t turn_wait(struct ncclComm* c, uint64_t ticket) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&c->turn_lock);
  while (c->serving != ticket && !atomic_load(&c->aborted))
    braid_cond_wait_ms(&c->turn_cv, &c->turn_lock, 100);
  if (c->serving != ticket) {
    WARN("Communicator aborted while rank %d waited for its turn", c->rank);
    res = ncclSystemError;
  }
  pthread_mutex_unlock(&c->turn_lock);
  return res;
}

/* The unit is done with `c`: pass the turn on (if it had it), stop
 * counting as running, and drop the unit's reference - the comm may be
 * freed now, so this is the unit's last touch of it. */
static void turn_leave(struct ncclComm* c, int got) {
  pthread_mutex_lock(&c->turn_lock);
  if (got) c->serving++;
  atomic_fetch_sub(&c->active, 1);
  pthread_cond_broadcast(&c->turn_cv);
  pthread_mutex_unlock(&c->turn_lock);
  comm_unref(c);
}

static int any_aborted(struct ncclComm* const* comms, int m) {
  for (int i = 0; i < m; i++)
    if (atomic_load(&comms[i]->aborted)) {
      WARN("Communicator of rank %d was aborted before this work ran", comms[i]->rank);
      return 1;
    }
  return 0;
}

/* A direct call gated on its stream queued its kernels there at issue: if
 * the unit did not run them (an error, a cancel), let the stream pass with
 * empty tasks, before the comms (which own the slots) may go. A unit that
 * queued none (every host call) has nothing to ask the device layer. */
static void deferred_release(struct work_op* ops, int n) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < WORK_MAX_LAUNCHES; k++)
      if (ops[i].deferred[k].slot) {
        device_launches_skip(ops, n);
        return;
      }
}

/* Take the unit's turn on every comm (each one, even after a failure:
 * later units wait on them), run the unit (if `run` and every turn came),
 * pass the turns on. An aborted comm's turns are not waited for. */
static ncclResult_t unit_in_turn(struct work_op* ops, int n, int run) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comms[WORK_MAX_COMMS];
  int m, got[WORK_MAX_COMMS];
  CHECK(unit_comms(ops, n, comms, &m));
  for (int i = 0; i < m; i++) atomic_fetch_add(&comms[i]->active, 1);
  for (int i = 0; i < m; i++) {
    ncclResult_t r = turn_wait(comms[i], unit_ticket(ops, n, comms[i]));
    got[i] = r == ncclSuccess;
    if (res == ncclSuccess) res = r;
  }
  /* after `active` went up: an abort either sees us running or we see it */
  if (res == ncclSuccess && any_aborted(comms, m)) res = ncclSystemError;
  if (run && res == ncclSuccess) {
    for (int i = 0; i < n; i++) ops[i].started = ops[i].done = 0;
    work_plan(ops, n);
    res = work_connect(ops, n);
    if (res != ncclSuccess) /* peers waiting for our connections must hear of it */
      for (int i = 0; i < m; i++) comm_set_error(comms[i], res);
    if (res == ncclSuccess) res = p2p_match_self(ops, n);
    if (res == ncclSuccess) res = work_drive(ops, n, comms, m);
  }
  deferred_release(ops, n);
  /* ops that never reached the drive (matched to self, empty, a failure
   * before it, a cancel) end in the recorder with the unit */
  ncclResult_t end = run || res != ncclSuccess ? res : ncclSystemError; /* a cancel failed it */
  for (int i = 0; i < n; i++) work_flight_end(&ops[i], end);
  for (int i = 0; i < m; i++) turn_leave(comms[i], got[i]); /* later units fail fast on errors */
fail:
  return res;
}

ncclResult_t work_run(struct work_op* ops, int n) {
  return unit_in_turn(ops, n, 1);
}

ncclResult_t work_cancel(struct work_op* ops, int n) {
  return unit_in_turn(ops, n, 0);
}

/* ---- a unit on a host stream: its ops, copied into the stream's item ---- */

static int unit_size(size_t bytes) {
  return (int)(bytes / sizeof(struct work_op));
}

static ncclResult_t unit_run(void* data, size_t bytes) {
  return work_run(data, unit_size(bytes));
}

static void unit_cancel(void* data, size_t bytes, ncclResult_t why) {
  (void)why; /* the ops' comms hold their own errors */
  work_cancel(data, unit_size(bytes));
}

static int unit_aborted(const void* data, size_t bytes) {
  const struct work_op* ops = data;
  for (int i = 0; i < unit_size(bytes); i++)
    if (atomic_load(&ops[i].comm->aborted)) return 1;
  return 0;
}

static void unit_failed(void* data, size_t bytes, ncclResult_t res) {
  struct work_op* ops = data;
  for (int i = 0; i < unit_size(bytes); i++) comm_set_error(ops[i].comm, res);
}

static const struct stream_job kUnitJob = {unit_run, unit_cancel, unit_aborted, unit_failed};

ncclResult_t work_submit(struct braid_stream* s, const struct work_op* ops, int n,
                         const struct gpu_gate* gates, int ngates) {
  return stream_submit(s, &kUnitJob, ops, (size_t)n * sizeof(*ops), gates, ngates);
}
