/*
 * The direct algorithm on device buffers (cuda_direct.h). Links join the
 * ranks of this rank's node (every rank, on one node). Per call, every
 * link carries, in order: the sender's send buffer, its receive buffer
 * (each a direct_msg, with the allocation's fd where it is cuMem memory),
 * then its "done"; a rank whose call fails sends "fail" instead of what
 * was to come, so its peers stop waiting at once. Tasks name ranks by
 * their index on the node (algorithms/direct.h).
 *
 * Nothing is written before every rank knows the others made the same
 * call: each buffer message carries the call as the executor tags it
 * (collective, count, type, op, root), and a peer's buffer is used only
 * where its call is this rank's and the bytes the call touches lie inside
 * the allocation the peer named, as mapped here.
 */
#include "cuda_direct.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core.h"
#include "cuda_comm.h"
#include "cuda/cuda_kernels.h"
#include "engine/exec_plan.h"
#include "layout.h"
#include "cuda_direct_exchange.h"
#include "engine/device.h"
#include "engine/redop.h"

/* ---- One call ---- */

/* A PreMulSum's first kernel (premul_input) keeps the last launch slot:
 * the plan's take 0 .. DIRECT_MAX_STEPS + 1. */
#define DIRECT_PREMUL_LAUNCH (DIRECT_MAX_STEPS + 2)
_Static_assert(WORK_MAX_LAUNCHES > DIRECT_PREMUL_LAUNCH, "a halving's kernels fit work_op");

/* Where the device reads a task's table (algorithms/direct.h: the rows
 * of columns not evenly spaced): the comm's, pinned and mapped. */
static const int32_t* rows_on_device(const struct ncclComm* comm, const int32_t* at) {
  const struct device_comm* cc = comm->device;
  if (at == NULL) return NULL;
  return (const int32_t*)(uintptr_t)(cc->hier_rows_dev +
                                     (CUdeviceptr)(at - cc->hier_rows) * sizeof(int32_t));
}

_Static_assert(DIRECT_MAX_RANKS <= KB_MAX_SRCS && DIRECT_MAX_RANKS <= KB_MAX_DSTS,
               "a node's ranks fit one kernel task");

/* The plan's task over every rank's buffers, in the kernel's form;
 * `flags` the post-divide. The operator and scalar come from a kern_task
 * (cuda_task_to_dev), the operands, up to DIRECT_MAX_RANKS of each (more
 * than a kern_task holds), straight from the plan. */
static void direct_task_resolve(const struct ncclComm* comm, const struct exec_args* a,
                                const struct direct_task* p, unsigned flags, direct_bufs bufs,
                                struct kern_dev_task* dt) {
  size_t es = kern_type_size(a->type);
  struct kern_task t;
  memset(&t, 0, sizeof(t));
  t.redop = a->redop;
  t.flags = flags;
  t.nsrcs = MIN(p->nsrcs, 2); /* 1: a copy; 2 or more: the operator */
  t.n = p->n;
  cuda_task_to_dev(&t, dt);
  dt->nsrcs = p->nsrcs;
  dt->ndsts = p->ndsts;
  for (int s = 0; s < p->nsrcs; s++)
    dt->srcs[s] = bufs[p->srcs[s].rank][p->srcs[s].buf] + p->srcs[s].off * es;
  for (int j = 0; j < p->ndsts; j++)
    dt->dsts[j] = bufs[p->dsts[j].rank][p->dsts[j].buf] + p->dsts[j].off * es;
  if (p->spread == DIRECT_SPREAD_SRCS) dt->op = KB_COPY; /* a row reads one source */
  dt->rows = (uint32_t)p->rows;
  dt->src_row = (int64_t)p->src_row * (int64_t)es;
  dt->dst_row = (int64_t)p->dst_row * (int64_t)es;
  dt->src_at = rows_on_device(comm, p->src_at);
  dt->dst_at = rows_on_device(comm, p->dst_at);
  dt->tree = p->tree != 0;
  dt->spread = p->spread == DIRECT_SPREAD_SRCS   ? KB_SPREAD_SRCS
               : p->spread == DIRECT_SPREAD_DSTS ? KB_SPREAD_DSTS
                                                 : 0u;
}

/* Wait for this rank's kernel, queued on its stream at issue, to have run
 * the task just let go. It runs at once (the stream waits on nothing else
 * before it), so neither an abort nor a peer's failure ends the wait: a
 * kernel still reading and writing the peers' buffers must be done before
 * anyone's stream goes on. Only a broken stream, or the timeout (then the
 * mappings are kept for good), ends it early. */
static ncclResult_t deferred_wait(struct ncclComm* comm, struct cuda_direct* d,
                                  const struct work_op* op, const struct gpu_launch* k) {
  uint64_t start = braid_now_ns(), next_check = start + 100000000ull;
  uint64_t deadline = start + (uint64_t)comm->tctx.timeout_ms * 1000000ull;
  long nap_ns = 0;
  while (!cuda_deferred_ran(k)) {
    if (!braid_backoff(&nap_ns) || braid_now_ns() < next_check) continue;
    next_check = braid_now_ns() + 100000000ull;
    if (cuda_stream_check(comm->device->ctx, op->stream) != ncclSuccess)
      return ncclUnhandledCudaError;
    if (braid_now_ns() > deadline) {
      d->tdev->mappings_in_use = 1;
      WARN("Direct: rank %d's stream did not run its kernel within %lld ms", comm->rank,
           (long long)comm->tctx.timeout_ms);
      return ncclSystemError;
    }
  }
  return ncclSuccess;
}

/* The kernel on the comm's own stream, waited for. */
static ncclResult_t sync_run(struct cuda_direct* d, const struct kern_dev_task* t) {
  ncclResult_t res = ncclSuccess;
  CHECK(cuda_reduce_copy(t, d->stream));
  CHECK(cuda_check(cuda_driver()->cuStreamSynchronize(d->stream), "cuStreamSynchronize(direct)"));
fail:
  return res;
}

/* A plan's task on the comm's own stream, waited for: a launch per row,
 * each made here (the by-value kernel reads no table). */
static ncclResult_t sync_rows(const struct ncclComm* comm, struct cuda_direct* d,
                              const struct exec_args* a, const struct direct_task* p,
                              unsigned flags, direct_bufs bufs) {
  ncclResult_t res = ncclSuccess;
  struct direct_task one;
  struct kern_dev_task t;
  if (p->n == 0) return ncclSuccess;
  for (size_t r = 0; r < p->rows; r++)
    if (direct_task_row(p, r, &one)) {
      direct_task_resolve(comm, a, &one, flags, bufs, &t);
      CHECK(cuda_reduce_copy(&t, d->stream));
    }
  CHECK(cuda_check(cuda_driver()->cuStreamSynchronize(d->stream), "cuStreamSynchronize(direct)"));
fail:
  return res;
}

/* Run this rank's `which`-th kernel of the call, task t: on its stream
 * where the call is gated there (the kernel is queued, waiting for it),
 * else on the comm's own stream, blocking until it is done. */
static ncclResult_t launch_run(struct ncclComm* comm, struct cuda_direct* d,
                               const struct work_op* op, int which, const struct kern_dev_task* t) {
  const struct gpu_launch* k = &op->deferred[which];
  if (k->slot == NULL) return t->n ? sync_run(d, t) : ncclSuccess;
  cuda_deferred_go(k, t);
  return deferred_wait(comm, d, op, k);
}

/* The same for task `p` of the plan: synchronous, a launch per row. */
static ncclResult_t task_run(struct ncclComm* comm, struct cuda_direct* d, const struct work_op* op,
                             int which, const struct direct_task* p, unsigned flags,
                             direct_bufs bufs) {
  struct kern_dev_task t;
  if (op->deferred[which].slot == NULL) return sync_rows(comm, d, &op->args, p, flags, bufs);
  direct_task_resolve(comm, &op->args, p, flags, bufs, &t);
  return launch_run(comm, d, op, which, &t);
}

/* This rank's task when every rank of the comm is on its node: planned by
 * comm rank (its blocks, its slice, the root's, the sources in rank
 * order: algorithms/direct.h; in the deterministic mode combined in its
 * tree), then each buffer named by the rank's
 * index on the node, as the buffers are exchanged (local_of: the order
 * by cache where ranks are bound, algorithms/layout.c). The same at
 * issue (cuda_direct_arm) and on the proxy. */
static ncclResult_t node_plan(const struct ncclComm* comm, const struct exec_args* a,
                              struct direct_task* plan) {
  ncclResult_t res = ncclSuccess;
  const int* local_of = comm->layout.local_of;
  CHECK(direct_plan(a->coll, comm->rank, comm->nranks, a->root, a->count, a->stride,
                    MAX(16 / kern_type_size(a->type), 1), plan));
  plan->tree = a->canonical && sched_coll_reduces(a->coll); /* the sources are in rank order */
  for (int s = 0; s < plan->nsrcs; s++) plan->srcs[s].rank = local_of[plan->srcs[s].rank];
  for (int j = 0; j < plan->ndsts; j++) plan->dsts[j].rank = local_of[plan->dsts[j].rank];
fail:
  return res;
}

/* One task over the node's buffers (every rank of the comm). */
static ncclResult_t node_call(struct ncclComm* comm, struct cuda_direct* d,
                              const struct work_op* op, direct_bufs bufs) {
  ncclResult_t res = ncclSuccess;
  const struct exec_args* a = &op->args;
  struct direct_task plan;
  CHECK(node_plan(comm, a, &plan));
  CHECK(task_run(comm, d, op, 0, &plan, a->post, bufs));
fail:
  return res;
}

/* Scratch of at least `bytes` from `list`: pinned and mapped for the
 * device, or (on_device) device memory. */
static ncclResult_t scratch_get(struct direct_scratch** list, size_t bytes, int on_device,
                                struct direct_scratch** out) {
  ncclResult_t res = ncclSuccess;
  struct direct_scratch* s = *list;
  if (s == NULL || s->bytes < bytes) {
    CHECK(braid_calloc(&s, 1, sizeof(*s)));
    s->bytes = MAX(bytes, *list ? 2 * (*list)->bytes : (size_t)4096);
    if (on_device)
      res = cuda_check(cuda_driver()->cuMemAlloc(&s->dev, s->bytes), "cuMemAlloc(direct scratch)");
    else
      res = cuda_flags_alloc(cuda_driver(), s->bytes, "cuMemHostAlloc(Hier scratch)", &s->host,
                             &s->dev);
    if (res != ncclSuccess) {
      free(s);
      goto fail;
    }
    s->older = *list;
    *list = s;
  }
  *out = s;
fail:
  return res;
}

/* This rank's Hier plan for the call (algorithms/direct.h), from the
 * comm's layout: the same at issue (cuda_direct_arm) and on the proxy. */
static ncclResult_t hier_plan(const struct ncclComm* comm, const struct exec_args* a, int on_device,
                              struct direct_staged* st) {
  const struct sched_topo* t = &comm->layout;
  struct direct_hier h = {.coll = a->coll,
                          .local = t->local_of[comm->rank],
                          .nlocal = t->min_ppn,
                          .node_ranks = sched_topo_node_size(t, t->node_of[comm->rank]),
                          .node = t->node_of[comm->rank],
                          .nnodes = t->nnodes,
                          .count = a->count,
                          .stride = a->stride,
                          .align = MAX(16 / kern_type_size(a->type), 1),
                          .gathered = on_device && a->coll != COLL_ALLGATHER,
                          .canonical = a->canonical && sched_coll_reduces(a->coll),
                          .root_node = t->node_of[a->root],
                          .root_local = t->local_of[a->root],
                          .topo = t,
                          .rows_at = comm->device->hier_rows};
  return direct_plan_hier(&h, st);
}

/* One collective between nodes, in the scratch: `coll` of `count` (and
 * `stride`, as in exec_args) from scratch + send_off into scratch +
 * recv_off among the group's ranks (this rank `group_rank` of them), a
 * ring over the network run by the executor. On the host, pinned scratch;
 * on the device, an all-gather that moves data only, every link taking
 * device memory, so the executor may launch nothing (exec_args.no_tasks)
 * while the stream waits for the next task. */
struct column_stage {
  int coll;
  size_t send_off, recv_off, count, stride;
  int group_size, group_rank;
  int* group_ranks;
  int root; /* a broadcast's, among the group */
};

/* The column's ring neighbours are linked both ways (the unit linked
 * them, connect.c): a link missing is a bug in what the unit asked for,
 * and an error here, not a fault in the executor. */
static ncclResult_t column_linked(const struct ncclComm* comm, const struct column_stage* cs) {
  int n = cs->group_size, me = cs->group_rank;
  int next = cs->group_ranks[(me + 1) % n], prev = cs->group_ranks[(me + n - 1) % n];
  if (n < 2 || (comm->send_conns[next] && comm->recv_conns[next] && comm->send_conns[prev] &&
                comm->recv_conns[prev]))
    return ncclSuccess;
  WARN("Direct: rank %d's stage between nodes has no link to rank %d or %d", comm->rank, prev,
       next);
  return ncclInternalError;
}

static ncclResult_t column_call(struct ncclComm* comm, const struct exec_args* a, char* scratch,
                                int on_device, const struct column_stage* cs) {
  ncclResult_t res = ncclSuccess;
  struct exec_args c = *a;
  size_t es = kern_type_size(a->type);
  long nap_ns = 0;
  int done = 0;
  c.coll = cs->coll;
  c.root = cs->root;
  c.sendbuff = scratch + cs->send_off * es;
  c.recvbuff = scratch + cs->recv_off * es;
  c.count = cs->count;
  c.stride = cs->stride;
  c.mem = on_device ? MEM_DEVICE : MEM_HOST;
  c.no_tasks = on_device;
  c.sendreg = c.recvreg = NULL;
  c.scalar_src = NULL;
  c.pre = 0; /* the node's partials: each input was multiplied once, before */
  c.algo = ALGO_RING;
  c.chunk_bytes = comm->exec.slot_bytes;
  c.group_size = cs->group_size;
  c.group_rank = cs->group_rank;
  c.group_ranks = cs->group_ranks;
  CHECK(column_linked(comm, cs));
  CHECK(exec_comm_start(comm, &c));
  while (!done) {
    int progressed = 0;
    CHECK(exec_comm_progress(comm, &done, &progressed));
    if (progressed)
      nap_ns = 0;
    else
      braid_backoff(&nap_ns);
  }
fail:
  return res;
}

/* A step's move between its two nodes, in device scratch: the swap (an
 * all-gather of two), or one way (a broadcast from member `from`). */
static ncclResult_t pair_move(struct ncclComm* comm, struct cuda_direct* d,
                              const struct work_op* op, char* scratch,
                              const struct direct_step* s) {
  int pair[2] = {d->column[s->lower], d->column[s->upper]};
  struct column_stage move = {s->from < 0 ? COLL_ALLGATHER : COLL_BROADCAST,
                              s->send_off,
                              s->recv_off,
                              s->count,
                              0,
                              2,
                              s->member,
                              pair,
                              MAX(s->from, 0)};
  return column_call(comm, &op->args, scratch, 1, &move);
}

/* A halving's or a fold's step (algorithms/direct.h): the move between
 * the two nodes (none in a local step), then the reduce kernel, task
 * `which` of the call. */
static ncclResult_t stage_step(struct ncclComm* comm, struct cuda_direct* d,
                               const struct work_op* op, char* scratch, direct_bufs bufs,
                               const struct direct_staged* st, int i) {
  ncclResult_t res = ncclSuccess;
  const struct direct_step* s = &st->steps[i];
  int which = 1 + i;
  if (s->from != DIRECT_STEP_LOCAL) CHECK(pair_move(comm, d, op, scratch, s));
  CHECK(task_run(comm, d, op, which, &s->reduce, which == st->post_task ? op->args.post : 0, bufs));
fail:
  return res;
}

/* Hier with the node's stages direct (direct_plan_hier): the first task
 * into the scratch, the stage between nodes there (a halving's steps, the
 * column's collective), the last task out of it. The post-divide (avg)
 * happens on the total: between nodes, or in the task the plan names. */
static ncclResult_t hier_call(struct ncclComm* comm, struct cuda_direct* d,
                              const struct work_op* op, direct_bufs bufs) {
  ncclResult_t res = ncclSuccess;
  const struct exec_args* a = &op->args;
  struct direct_staged st;
  struct direct_scratch* scratch;
  size_t es = kern_type_size(a->type);
  int on_device = op->direct_between;
  char* base;
  CHECK(hier_plan(comm, a, on_device, &st));
  CHECK(scratch_get(on_device ? &d->dev_scratch : &d->scratch, MAX(st.scratch * es, (size_t)1),
                    on_device, &scratch));
  base = on_device ? (char*)(uintptr_t)scratch->dev : scratch->host;
  bufs[d->me_local][DIRECT_SCRATCH] = (char*)(uintptr_t)scratch->dev;
  CHECK(task_run(comm, d, op, 0, &st.before, 0, bufs));
  for (int i = 0; i < st.nsteps; i++) CHECK(stage_step(comm, d, op, base, bufs, &st, i));
  if (st.count) {
    struct column_stage column = {st.column_coll,
                                  st.send_off,
                                  st.recv_off,
                                  st.count,
                                  st.stride,
                                  comm->layout.nnodes,
                                  comm->layout.node_of[comm->rank],
                                  d->column,
                                  st.column_root};
    CHECK(column_call(comm, a, base, on_device, &column));
  }
  if (st.unfolds) CHECK(pair_move(comm, d, op, base, &st.unfold));
  CHECK(task_run(comm, d, op, st.nsteps + 1, &st.after, st.post_task == st.nsteps + 1 ? a->post : 0,
                 bufs));
fail:
  return res;
}

/* A PreMulSum multiplies each rank's input by that rank's own scalar, and
 * a kernel's task has one scalar for all its sources: the ranks' may
 * differ. So each rank first writes its input times its scalar into device
 * scratch (its first kernel, rounded to the type as a rank's first step
 * of a ring does), and the call sums those: its peers read the scratch as
 * its input. Run before the buffers go to the peers, so that they find it
 * written. */
static ncclResult_t premul_input(struct ncclComm* comm, struct cuda_direct* d,
                                 const struct work_op* op, const void** send) {
  ncclResult_t res = ncclSuccess;
  const struct exec_args* a = &op->args;
  struct direct_scratch* scratch;
  struct kern_task t;
  struct kern_dev_task task;
  size_t es = kern_type_size(a->type), n = d->extent[DIRECT_SEND] / es;
  CHECK(scratch_get(&d->premul, MAX(n * es, (size_t)1), 1, &scratch));
  memset(&t, 0, sizeof(t));
  t.redop = a->redop;
  t.pre = 1u; /* source 0, times redop.scalar */
  t.nsrcs = t.ndsts = 1;
  t.n = n;
  t.srcs[0] = *send;
  t.dsts[0] = (void*)(uintptr_t)scratch->dev;
  cuda_task_to_dev(&t, &task);
  CHECK(launch_run(comm, d, op, DIRECT_PREMUL_LAUNCH, &task));
  *send = (const void*)(uintptr_t)scratch->dev;
fail:
  return res;
}

static ncclResult_t direct_call(struct ncclComm* comm, struct cuda_direct* d,
                                const struct work_op* op) {
  ncclResult_t res = ncclSuccess;
  const struct exec_args* a = &op->args;
  direct_bufs bufs;
  int me = comm->rank;
  int reads = sched_coll_reads_send(a->coll, me, a->root);
  int writes = sched_coll_writes_recv(a->coll, me, a->root);
  d->seq++;
  exec_tag_make(comm, a, &d->call);
  exec_extents(a, comm->nranks, &d->extent[DIRECT_SEND], &d->extent[DIRECT_RECV]);
  INFO(SUB_TUNING, "%s %zu elements nranks %d: %s instead (device buffers)",
       sched_coll_name(a->coll), a->count, d->nranks,
       op->direct != WORK_DIRECT_HIER ? "Direct"
       : op->direct_between           ? "Hier with direct node stages, on the device"
                                      : "Hier with direct node stages");
  memset(bufs, 0, sizeof(direct_bufs));
  d->exposed = 0; /* nothing of this call's reached the peers yet */
  const void* send = reads ? a->sendbuff : NULL;
  if (a->pre && send) CHECK(premul_input(comm, d, op, &send));
  CHECK(direct_buffers_exchange(comm, d, send, writes ? a->recvbuff : NULL, bufs));
  if (op->direct == WORK_DIRECT_HIER)
    CHECK(hier_call(comm, d, op, bufs));
  else
    CHECK(node_call(comm, d, op, bufs));
  CHECK(direct_done_exchange(comm, d));
fail:
  return res;
}

ncclResult_t device_direct_run(struct work_op* op) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = op->comm;
  struct cuda_direct* d = NULL;
  CUcontext saved;
  res = (ncclResult_t)atomic_load(&comm->error);
  if (res != ncclSuccess) return res; /* an earlier op of the unit failed, and said so */
  CHECK(cuda_ctx_enter(comm->device->ctx, &saved));
  res = direct_get(comm, &d);
  if (res == ncclSuccess && d->broken) {
    WARN("Direct: rank %d's links are out of step after an earlier failure", comm->rank);
    res = ncclInvalidUsage;
  } else if (res == ncclSuccess) {
    if (op->args.scalar_src) /* read here: a failure tells the peers, as any does */
      res = redop_scalar_read(&op->args);
    if (res == ncclSuccess) res = direct_call(comm, d, op);
  }
  if (res != ncclSuccess && d != NULL && !d->broken) {
    d->broken = 1;
    direct_tell_failure(comm, d);
    if (d->exposed) direct_drain_peers(comm, d);
  }
  cuda_ctx_restore(saved);
fail:
  return res;
}

ncclResult_t cuda_direct_arm(struct work_op* op, CUstream stream) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = op->comm;
  const struct exec_args* a = &op->args;
  struct cuda_deferred_pool* pool = &comm->device->deferred;
  struct direct_task plan;
  struct direct_staged st;
  if (a->pre) { /* premul_input's kernel, first */
    size_t send, recv;
    exec_extents(a, comm->nranks, &send, &recv);
    CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, send / kern_type_size(a->type),
                            &op->deferred[DIRECT_PREMUL_LAUNCH]));
  }
  if (op->direct == WORK_DIRECT_HIER) { /* into the scratch, each step's, out of it */
    CHECK(hier_plan(comm, a, op->direct_between, &st));
    CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, st.before.n, &op->deferred[0]));
    for (int i = 0; i < st.nsteps; i++) /* a step that reduces nothing queues nothing */
      if (st.steps[i].reduce.n > 0)
        CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, st.steps[i].reduce.n,
                                &op->deferred[1 + i]));
    CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, st.after.n, &op->deferred[st.nsteps + 1]));
    return ncclSuccess;
  }
  CHECK(node_plan(comm, a, &plan));
  CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, plan.n, &op->deferred[0]));
fail:
  return res;
}
