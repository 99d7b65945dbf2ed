/*
 * Device calls (src/engine/device.h's device_unit_wanted and device_unit_dispatch):
 * a unit of work (one call, or one group) that names CUDA
 * streams or device buffers is ordered on its streams (docs/architecture.md 4). At
 * issue, each stream gets the copy-in of the device buffers the unit reads,
 * a gate (write "ready", wait for "done"), and the copy-out of what it
 * writes; the comm's proxy thread runs the unit on the pinned mirrors once
 * every stream reached its gate, then opens the gates. A direct unit
 * stages nothing: between its gate's ready and done the stream holds its
 * kernels, which the proxy lets go (cuda_direct.h). Nothing blocks the
 * caller. Without stream memory operations (or where a gate could hold
 * back a stream the unit needs: unit_gated) the caller waits instead: its
 * streams are synchronized and the unit runs before the call returns, its
 * collectives direct or as fused kernels on the executor's device backend
 * (cuda_exec.h), only send/recv buffers staged.
 */
#include "comm/comm.h"
#include "core.h"
#include "cuda/cuda_driver.h"
#include "cuda_comm.h"
#include "cuda/cuda_deferred.h"
#include "cuda_direct.h"
#include "cuda/cuda_gate.h"
#include "cuda_stage.h"
#include "engine/device.h"
#include "engine/mem.h"
#include "engine/stream.h"
#include "transport_table.h"
#include "engine/work.h"

int device_unit_wanted(const struct work_op* ops, int n) {
  if (cuda_driver() == NULL) return 0;
  for (int i = 0; i < n; i++) {
    enum mem_kind kind = ops[i].kind == WORK_COLL ? ops[i].args.mem : ops[i].mem;
    if (ops[i].stream != NULL || kind != MEM_HOST) return 1;
    if (ops[i].kind == WORK_COLL && ops[i].args.scalar_src &&
        mem_query(ops[i].args.scalar_src) != MEM_HOST)
      return 1;
  }
  return 0;
}

/* A stream being captured into a CUDA graph would record the staging and
 * the gate once, while the proxy runs the call once now: each replay of the
 * graph would wait for a gate nobody opens. Refused, clearly. */
static ncclResult_t stream_check_capture(CUstream s) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  const struct cuda_api* cu = cuda_driver();
  CUresult r = cu->cuStreamIsCapturing(s, &status);
  if (r == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_NONE) return ncclSuccess;
  if (r == CUDA_SUCCESS || r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    WARN(
        "Stream %p is being captured into a CUDA graph%s: Braid's device calls cannot be "
        "captured yet (run them outside the capture)",
        (void*)s, r == CUDA_SUCCESS ? "" : " (another stream's capture holds the legacy stream)");
  else
    cuda_check(r, "cuStreamIsCapturing"); /* not a stream this context knows */
  return ncclInvalidUsage;
}

/* The unit's distinct streams, in order of first use. */
static ncclResult_t unit_streams(const struct work_op* ops, int n, CUstream* out, int* m) {
  ncclResult_t res = ncclSuccess;
  *m = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int j = 0; j < *m && !seen; j++) seen = out[j] == (CUstream)ops[i].stream;
    if (seen) continue;
    if (*m == WORK_MAX_GATES)
      FAIL(ncclInvalidUsage, "A group may span at most %d CUDA streams", WORK_MAX_GATES);
    CHECK(stream_check_capture((CUstream)ops[i].stream));
    out[(*m)++] = (CUstream)ops[i].stream;
  }
fail:
  return res;
}

/* Whether ops[i] is the first of its comm on `stream`. */
static int first_of_comm(const struct work_op* ops, int i, CUstream stream) {
  if ((CUstream)ops[i].stream != stream) return 0;
  for (int j = 0; j < i; j++)
    if (ops[j].comm == ops[i].comm && (CUstream)ops[j].stream == stream) return 0;
  return 1;
}

/* Every comm of the unit gets its device state before anything is issued.
 * A comm that failed in an earlier call (which ran after its enqueue
 * returned) refuses the call here: its error reaches the user with the
 * next call, as with NCCL. */
static ncclResult_t unit_comms_ready(struct work_op* ops, int n) {
  ncclResult_t res = ncclSuccess;
  struct device_comm* cc;
  for (int i = 0; i < n; i++) {
    ncclResult_t err = (ncclResult_t)atomic_load(&ops[i].comm->error);
    if (err != ncclSuccess)
      FAIL(err, "Rank %d: the communicator failed in an earlier call (%s); destroy or abort it",
           ops[i].comm->rank, ncclGetErrorString(err));
    CHECK(cuda_comm_get(ops[i].comm, &cc));
  }
fail:
  return res;
}

/* What stream_stage enqueues on a stream. */
enum stage_what {
  STAGE_IN_GATED,  /* copy-ins of all the unit reads: it runs on host memory */
  STAGE_IN_SYNC,   /* of send/recv buffers and scalars: collectives run on the device */
  STAGE_OUT_GATED, /* copy-outs, behind the gate */
  STAGE_OUT_SYNC   /* copy-outs, before a synchronization */
};

/* Stage one stream's copies, comm by comm, in each comm's context. */
static ncclResult_t stream_stage(struct work_op* ops, int n, CUstream s, enum stage_what what) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < n; i++) {
    if (!first_of_comm(ops, i, s)) continue;
    struct device_comm* cc = ops[i].comm->device;
    CUcontext saved;
    CHECK(cuda_ctx_enter(cc->ctx, &saved));
    if (what == STAGE_OUT_GATED || what == STAGE_OUT_SYNC)
      res = cuda_stage_out(cc, s, what == STAGE_OUT_GATED);
    else
      res = cuda_stage_in(cc, ops[i].comm, s, ops, n, what == STAGE_IN_GATED);
    cuda_ctx_restore(saved);
    if (res != ncclSuccess) goto fail;
  }
fail:
  return res;
}

/* Wait for what the unit's streams have queued, each in the context of
 * every comm staged on it: NULL and the per-thread stream name another
 * stream in each context. */
static ncclResult_t streams_sync(const struct work_op* ops, int n, const CUstream* streams,
                                 int ns) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  for (int k = 0; k < ns; k++)
    for (int i = 0; i < n; i++) {
      if (!first_of_comm(ops, i, streams[k])) continue;
      CUcontext saved;
      CHECK(cuda_ctx_enter(ops[i].comm->device->ctx, &saved));
      res = cuda_check(cu->cuStreamSynchronize(streams[k]), "cuStreamSynchronize");
      cuda_ctx_restore(saved);
      if (res != ncclSuccess) goto fail;
    }
fail:
  return res;
}

/* How op runs direct (cuda_direct_kind), and whether its Hier stage
 * between nodes runs on the device (which of its column's peers its unit
 * then links: connect.c). */
static void direct_mark(struct work_op* op) {
  op->direct = cuda_direct_kind(op);
  op->direct_between =
      op->direct == WORK_DIRECT_HIER && cuda_hier_column_on_device(op->comm, op->args.coll);
}

/* Without gates: wait for the streams, run (collectives on the device
 * backend, where its internal stream cannot queue behind a waiting user
 * stream: none waits), copy out, wait again (the mirrors are reused by the
 * next call). The unit is issued: if it cannot run, it is cancelled so
 * later work does not wait. */
static ncclResult_t unit_run_synchronously(struct work_op* ops, int n, const CUstream* streams,
                                           int ns) {
  ncclResult_t res = streams_sync(ops, n, streams, ns), ran;
  for (int i = 0; i < n && res == ncclSuccess; i++) /* a non-blocking init first */
    if (ops[i].comm->internal_stream) res = stream_sync(ops[i].comm->internal_stream);
  if (res != ncclSuccess) {
    work_cancel(ops, n);
    return res;
  }
  if (cuda_direct_wanted(ops, n)) /* a non-blocking init's peers are known only now */
    for (int i = 0; i < n; i++) direct_mark(&ops[i]);
  ran = work_run(ops, n);
  for (int k = 0; k < ns; k++) CHECK(stream_stage(ops, n, streams[k], STAGE_OUT_SYNC));
  CHECK(streams_sync(ops, n, streams, ns));
  res = ran;
fail:
  return res;
}

static void gates_open(struct gpu_gate* gates, int n) {
  for (int k = 0; k < n; k++) __atomic_store_n(gates[k].done, gates[k].value, __ATOMIC_RELEASE);
}

/* Whether a send or receive moves device to device (transports/cudaipc):
 * on device memory, to another rank that a transport of the table joins
 * for device buffers. Decided from the peer table (transport_select is
 * pure), so both ends of the pair agree when both buffers are on devices. */
static int op_ipc(const struct work_op* op) {
  struct ncclComm* c = op->comm;
  return op->kind != WORK_COLL && op->bytes > 0 && op->peer != c->rank && op->mem == MEM_DEVICE &&
         c->tctx.device != NULL &&
         transport_select(&c->tctx, c->rank, op->peer, TRANSPORT_CAP_DEVICE_MEM) != NULL;
}

/* Mark the unit's ipc operations before anything is staged. A comm whose
 * non-blocking init still runs has no peer table yet: its init is waited
 * for first (only a unit with device send/recv does so). */
static ncclResult_t unit_mark_ipc(struct work_op* ops, int n) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < n; i++) {
    if (ops[i].kind == WORK_COLL || ops[i].mem != MEM_DEVICE) continue;
    if (!atomic_load(&ops[i].comm->init_done) && ops[i].comm->internal_stream)
      CHECK(stream_sync(ops[i].comm->internal_stream));
    ops[i].ipc = atomic_load(&ops[i].comm->init_done) && op_ipc(&ops[i]);
  }
fail:
  return res;
}

/* Whether every other rank is joined, for host and device memory alike,
 * by a transport that reads and writes device memory itself (a net
 * plugin's NIC taking CUDA memory at both ends): then every connection a
 * collective uses is device_direct (transport_select is pure, and the
 * connections are made by the same choice). Once per comm. */
static int comm_net_direct(struct ncclComm* c) {
  struct device_comm* cc = c->device;
  if (cc->net_direct != 0) return cc->net_direct > 0;
  cc->net_direct = c->nranks > 1 ? 1 : -1;
  for (int r = 0; r < c->nranks && cc->net_direct > 0; r++)
    if (r != c->rank && !cuda_pair_net_direct(c, c->rank, r)) cc->net_direct = -1;
  return cc->net_direct > 0;
}

/* Whether op's device buffers go to such a network as they are, gated:
 * an all-gather or a broadcast on device memory, which in place needs no
 * task (cuda_stage.c queues an out-of-place call's own copy on the stream
 * before the gate). A reduction stays staged: its kernels would have to
 * be launched by the proxy while the stream waits at its gate, and a
 * stream sharing the waiting one's hardware queue would never run them. */
static int op_net_direct(struct work_op* op) {
  const struct exec_args* a = &op->args;
  int root_reads = a->coll == COLL_ALLGATHER || op->comm->rank == a->root;
  if (op->kind != WORK_COLL || op->direct || a->count == 0) return 0;
  if (a->coll != COLL_ALLGATHER && a->coll != COLL_BROADCAST) return 0;
  if (!atomic_load(&op->comm->init_done) || !op->comm->device || !comm_net_direct(op->comm))
    return 0; /* known once per comm: before asking the driver about the buffers */
  return mem_query(a->recvbuff) == MEM_DEVICE &&
         (!root_reads || mem_query(a->sendbuff) == MEM_DEVICE);
}

/* A direct collective's kernels, or the copy of a send to a transport
 * that moves device memory with one (cudaipc; a NIC reads it itself). */
static int op_has_kernel(const struct work_op* op) {
  if (op->direct) return 1;
  if (!op->ipc || op->kind != WORK_SEND) return 0;
  struct ncclComm* c = op->comm; /* transport_select is pure: op_ipc chose the same */
  const struct transport* t =
      transport_select(&c->tctx, c->rank, op->peer, TRANSPORT_CAP_DEVICE_MEM);
  return t != NULL && (t->caps & TRANSPORT_CAP_DEVICE_COPY);
}

/* Between a gated unit's ready and done: the kernels of its direct
 * collectives and of its ipc sends' copies, each waiting for the proxy to
 * give it its task. On a failure the unit is cancelled, and work.c lets
 * the kernels queued so far go with empty tasks. */
static ncclResult_t unit_kernels_arm(struct work_op* ops, int n, CUstream s) {
  ncclResult_t res = ncclSuccess;
  for (int i = 0; i < n && res == ncclSuccess; i++) {
    struct work_op* op = &ops[i];
    if (op->direct)
      res = cuda_direct_arm(op, s);
    else if (op_has_kernel(op))
      res = cuda_deferred_arm(&op->comm->device->deferred, cuda_driver(), s, op->bytes,
                              &op->deferred[0]);
  }
  return res;
}

/* Arm the gate of a gated unit (one stream: unit_gated) with its
 * copy-outs behind it, and its kernels (unit_kernels_arm) inside. The
 * gate comes from the comm of the first op, whose mirror's mark behind
 * the gate also says when the gate's memory may be freed. Once armed, the
 * stream waits on it: if the copy-outs cannot be staged, it is opened
 * here. */
static ncclResult_t unit_gate(struct work_op* ops, int n, CUstream s, struct gpu_gate* gate) {
  ncclResult_t res = ncclSuccess;
  struct device_comm* cc = ops[0].comm->device;
  struct cuda_gate_arming arming;
  CUcontext saved;
  CHECK(cuda_ctx_enter(cc->ctx, &saved));
  res = cuda_gate_begin(&cc->gates, cuda_driver(), s, &arming);
  if (res == ncclSuccess)
    res = cuda_gate_end(cuda_driver(), s, &arming, unit_kernels_arm(ops, n, s), gate);
  gate->ctx = cc->ctx; /* what the proxy's check runs in */
  cuda_ctx_restore(saved);
  if (res != ncclSuccess) goto fail;
  res = stream_stage(ops, n, s, STAGE_OUT_GATED);
  if (res != ncclSuccess)
    gates_open(gate, 1); /* the unit is cancelled: work.c lets its kernels go */
fail:
  return res;
}

/* Gates only where the unit's stream can go on by itself: stream memory
 * operations work on every comm's device, the unit is on one stream (a
 * stream waiting on a gate whose unit needs another stream of the same
 * context to reach its "ready" may hold that stream back: the driver's
 * warning on stream memory operations), no comm of the unit has two ranks
 * in this process (the same, across the ranks' streams), and its comms are
 * known (a non-blocking init still running is not). */
static int unit_gated(const struct work_op* ops, int n, int nstreams) {
  if (nstreams > 1) return 0;
  for (int i = 0; i < n; i++)
    if (!ops[i].comm->device->memops || cuda_comm_shares_process(ops[i].comm) != 0 ||
        ops[i].comm->device->dev != ops[0].comm->device->dev) /* NULL is one stream per device */
      return 0;
  return 1;
}

ncclResult_t device_unit_dispatch(struct work_op* ops, int n) {
  ncclResult_t res = ncclSuccess;
  CUstream streams[WORK_MAX_GATES] = {0};
  struct gpu_gate gate;
  int ns = 0;
  CHECK(unit_streams(ops, n, streams, &ns));
  CHECK(unit_comms_ready(ops, n));
  CHECK(unit_mark_ipc(ops, n));
  CHECK(work_issue(ops, n));
  struct device_comm* cc = ops[0].comm->device;
  /* a direct unit stages nothing: its kernels read and write the buffers */
  int direct = cuda_direct_wanted(ops, n), gated = unit_gated(ops, n, ns);
  for (int i = 0; i < n && direct; i++) direct_mark(&ops[i]);
  for (int i = 0; i < n && gated && !direct; i++) ops[i].args.no_tasks = op_net_direct(&ops[i]);
  for (int k = 0; k < ns && res == ncclSuccess; k++)
    res = stream_stage(ops, n, streams[k], gated && !direct ? STAGE_IN_GATED : STAGE_IN_SYNC);
  if (res == ncclSuccess && !gated) return unit_run_synchronously(ops, n, streams, ns);
  if (res == ncclSuccess) res = unit_gate(ops, n, streams[0], &gate);
  if (res == ncclSuccess) {
    res = work_submit(cc->proxy, ops, n, &gate, 1);
    if (res != ncclSuccess) gates_open(&gate, 1);
  }
  if (res != ncclSuccess) {
    work_cancel(ops, n); /* issued but never to run: later work must not wait for it */
    streams_sync(ops, n, streams, ns); /* nothing staged may be touched after we return */
    return res;
  }
  return cc->own_proxy ? ncclSuccess : ncclInProgress;
fail:
  return res;
}
void device_launches_skip(struct work_op* ops, int n) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < WORK_MAX_LAUNCHES; k++)
      if (ops[i].deferred[k].slot) cuda_deferred_skip(&ops[i].deferred[k]);
}
