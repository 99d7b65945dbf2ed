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
#include "cuda/cuda_driver.h"
#include "cuda/cudaipc_fd_link.h"
#include "cuda_comm.h"
#include "cuda_deferred.h"
#include "cuda_kernels.h"
#include "cuda/cudaipc_fd.h"
#include "cuda/cudaipc_mem.h"
#include "cudaipc/cudaipc.h"
#include "engine/device.h"
#include "direct.h"
#include "engine/exec_plan.h"
#include "kernels.h"
#include "layout.h"
#include "engine/mem.h"
#include "tune/tuner.h"
#include "tune/tuner_device.h"

enum direct_what { DIRECT_MSG_BUF = 1, DIRECT_MSG_DONE = 2, DIRECT_MSG_FAIL = 3 };

struct direct_msg {
  uint64_t seq;
  uint32_t what;             /* enum direct_what */
  uint32_t buf;              /* DIRECT_MSG_BUF: enum direct_buf */
  uint64_t ptr;              /* at the sender's address; 0: it uses no such buffer */
  struct transport_tag call; /* DIRECT_MSG_BUF: the sender's call (exec_tag_make) */
  struct cudaipc_desc desc;
};

#define DIRECT_FAIL_READ_MS 100 /* how long a failed send looks for the peer's last word */

/* Hier's pinned scratch: grown by replacing it, the old ones freed with
 * the comm (freeing pinned memory may wait for the device). */
struct direct_scratch {
  void* host;
  CUdeviceptr dev;
  size_t bytes;
  struct direct_scratch* older;
};

struct cuda_direct {
  int nranks;
  int nlocal;                  /* the ranks of this node */
  int local[DIRECT_MAX_RANKS]; /* their comm ranks, in node order */
  int me_local;                /* this rank's index among them */
  int* column;                 /* Hier: per node, the rank there with this rank's index */
  struct direct_scratch* scratch;
  int* links;                    /* per peer of this node, else -1 (and for this rank) */
  int* same_process;             /* per peer: its pointers are ours to use, no IPC */
  uint64_t* heard;               /* per peer: the last call it said "done" or "fail" in */
  int any_remote;                /* some peer is in another process */
  struct transport_device* tdev; /* the comm's: its cache maps the peers' buffers */
  CUstream stream;               /* synchronous calls' kernels */
  uint64_t seq;
  struct transport_tag call; /* this call, as every peer must have made it */
  size_t extent[2];          /* bytes of each buffer (DIRECT_SEND, DIRECT_RECV) the call touches */
  int exposed;               /* this call's buffers went to every peer: they may use them */
  int broken;                /* a call failed: the links are out of step */
};

/* ---- Who goes direct ---- */

/* Every rank must decide alike, or some would wait for links the others
 * never use: so the decision rests on the peer table, the node's devices,
 * the call and NCCL_ALGO only, never on this rank's gates or streams. */

static int peer_device(const struct ncclComm* comm, int p) {
  return comm->peers[p].cuda_dev < 0 ? 0 : comm->peers[p].cuda_dev;
}

/* Whether each of the n ranks' devices can read every other's (peer
 * access). */
static int devices_reach(const struct ncclComm* comm, const int* ranks, int n) {
  const struct cuda_api* cu = cuda_driver();
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      CUdevice x, y;
      int can = 0, da = peer_device(comm, ranks[i]), db = peer_device(comm, ranks[j]);
      if (da == db) continue;
      if (cu->cuDeviceGet(&x, da) != CUDA_SUCCESS || cu->cuDeviceGet(&y, db) != CUDA_SUCCESS ||
          cu->cuDeviceCanAccessPeer(&can, x, y) != CUDA_SUCCESS || !can)
        return 0;
    }
  return 1;
}

/* The n ranks (2..DIRECT_MAX_RANKS) are on one host, their devices in
 * reach; *per_device gets the most of them sharing one device. Devices
 * are told apart by UUID; ordinals (for the reach check) mean the same
 * device in every rank only where their processes see the same devices in
 * the same order: else direct needs the ranks on one device. */
static int ranks_direct_shape(const struct ncclComm* comm, const int* ranks, int n,
                              int* per_device) {
  const struct peer_info* first = &comm->peers[ranks[0]];
  int one_view = 1, one_device = 1;
  if (n < 2 || n > DIRECT_MAX_RANKS) return 0;
  *per_device = 1;
  for (int i = 0; i < n; i++) {
    const struct peer_info* q = &comm->peers[ranks[i]];
    int same = 0;
    if (q->host_hash != first->host_hash || q->cuda_uuid == 0) return 0;
    one_view &= q->cuda_view == first->cuda_view;
    one_device &= q->cuda_uuid == first->cuda_uuid;
    for (int j = 0; j < n; j++) same += comm->peers[ranks[j]].cuda_uuid == q->cuda_uuid;
    *per_device = MAX(*per_device, same);
  }
  return one_device || (one_view && devices_reach(comm, ranks, n));
}

/* The comm's ranks on `node`, in node order (at most DIRECT_MAX_RANKS
 * written); returns how many it has. */
static int node_ranks(const struct ncclComm* comm, int node, int* out) {
  const struct sched_topo* t = &comm->layout;
  int n = sched_topo_node_size(t, node);
  for (int j = 0; j < n && j < DIRECT_MAX_RANKS; j++) out[j] = t->order[t->node_start[node] + j];
  return n;
}

/* Every rank of the comm on this host, their devices in reach. */
static int comm_direct_shape(const struct ncclComm* comm, int* per_device) {
  int ranks[DIRECT_MAX_RANKS];
  if (comm->nranks > DIRECT_MAX_RANKS || cuda_comm_shares_process(comm) < 0)
    return 0; /* too many, or the peers are not known yet: a non-blocking init still running */
  for (int r = 0; r < comm->nranks; r++) ranks[r] = r;
  return ranks_direct_shape(comm, ranks, comm->nranks, per_device);
}

/* Several nodes of the same size, each one's ranks fit for direct. */
static int comm_hier_shape(const struct ncclComm* comm) {
  const struct sched_topo* t = &comm->layout;
  int ranks[DIRECT_MAX_RANKS], per_device;
  if (cuda_comm_shares_process(comm) < 0 || t->nnodes < 2 || t->min_ppn != t->max_ppn ||
      t->min_ppn < 2 || t->max_ppn > DIRECT_MAX_RANKS)
    return 0;
  for (int node = 0; node < t->nnodes; node++)
    if (!ranks_direct_shape(comm, ranks, node_ranks(comm, node, ranks), &per_device)) return 0;
  return 1;
}

/* The buffer size the tuner models (the larger of the two, as for host
 * calls). */
static size_t op_bytes(const struct work_op* op) {
  const struct exec_args* a = &op->args;
  size_t bytes = a->count * kern_type_size(a->type);
  if (a->coll == COLL_ALLGATHER || a->coll == COLL_REDUCESCATTER) bytes *= (size_t)op->comm->nranks;
  return bytes;
}

/* Reduce-scatter and all-gather run their node stages as one task of a
 * row per node: each index's ranks must be evenly spaced across nodes. */
static int comm_hier_columns(const struct ncclComm* comm) {
  int first, step;
  for (int local = 0; local < comm->layout.min_ppn; local++)
    if (!direct_column(&comm->layout, local, &first, &step)) return 0;
  return 1;
}

static int hier_fits(const struct work_op* op) {
  switch (op->args.coll) {
    case COLL_ALLREDUCE:
      return comm_hier_shape(op->comm);
    case COLL_REDUCESCATTER:
    case COLL_ALLGATHER:
      return comm_hier_shape(op->comm) && comm_hier_columns(op->comm);
    default:
      return 0;
  }
}

/* Where the host would run Hier (or NCCL_ALGO names Direct): the node's
 * stages then run on the devices instead of through host memory. */
static int hier_wanted(const struct work_op* op) {
  int algo = ALGO_RING;
  if (!hier_fits(op)) return 0;
  if (tuner_forces_direct()) return 1;
  tuner_host_best(op->comm, op->args.coll, op_bytes(op), &algo);
  return algo == ALGO_HIER;
}

/* Device buffers where this rank uses them. */
static int op_on_devices(const struct work_op* op) {
  const struct exec_args* a = &op->args;
  int reads = sched_coll_reads_send(a->coll, op->comm->rank, a->root);
  int writes = sched_coll_writes_recv(a->coll, op->comm->rank, a->root);
  return (!reads || mem_query(a->sendbuff) == MEM_DEVICE) &&
         (!writes || mem_query(a->recvbuff) == MEM_DEVICE);
}

int cuda_direct_kind(const struct work_op* op) {
  const struct exec_args* a = &op->args;
  int per_device = 1;
  if (op->kind != WORK_COLL || a->mem != MEM_DEVICE || a->pre || a->scalar_src ||
      !tuner_allows_direct() || !op_on_devices(op))
    return WORK_DIRECT_NONE;
  /* one pass combines the inputs in rank order, a chain: not the canonical
   * order the deterministic mode promises (algorithms/pairwise.h) */
  if (a->canonical && sched_coll_reduces(a->coll)) return WORK_DIRECT_NONE;
  if (comm_direct_shape(op->comm, &per_device))
    return tuner_forces_direct() ||
                   tuner_prefers_direct(op->comm, a->coll, op_bytes(op), per_device)
               ? WORK_DIRECT_NODE
               : WORK_DIRECT_NONE;
  return hier_wanted(op) ? WORK_DIRECT_HIER : WORK_DIRECT_NONE;
}

int cuda_direct_wanted(const struct work_op* ops, int n) {
  for (int i = 0; i < n; i++)
    if (ops[i].comm != ops[0].comm || cuda_direct_kind(&ops[i]) == WORK_DIRECT_NONE) return 0;
  return n > 0;
}

/* ---- The links, made at the first direct call ---- */

/* Whether `peer` is on this rank's node. */
static int is_local(const struct cuda_direct* d, int peer) {
  for (int j = 0; j < d->nlocal; j++)
    if (d->local[j] == peer) return 1;
  return 0;
}

static ncclResult_t direct_links(struct ncclComm* comm, struct cuda_direct* d) {
  ncclResult_t res = ncclSuccess;
  struct cudaipc_listener* l = NULL;
  int me = comm->rank, lower = 0;
  int64_t tmo = comm->tctx.timeout_ms;
  uint64_t secret = comm->tctx.secret;
  CHECK(cudaipc_fd_listen(secret, "direct", me, comm->peers, comm->nranks, comm->nranks, &l));
  for (int j = 0; j < d->nlocal; j++) { /* to the higher ranks; the lower ones come to us */
    int p = d->local[j];
    lower += p < me;
    if (p > me)
      CHECK(cudaipc_fd_connect(secret, "direct", me, p, comm->peers[p].pid, 0, tmo, &comm->aborted,
                               &d->links[p]));
  }
  for (int k = 0; k < lower; k++) {
    int link, peer, tag;
    CHECK(cudaipc_fd_accept(l, tmo, &comm->aborted, &link, &peer, &tag));
    if (peer >= me || !is_local(d, peer) || d->links[peer] >= 0) {
      close(link);
      FAIL(ncclSystemError, "Direct: rank %d got a link from rank %d twice or out of turn", me,
           peer);
    }
    d->links[peer] = link;
  }
fail:
  cudaipc_fd_listener_free(l);
  return res;
}

/* This rank's node and, on an even layout, its column: the rank with its
 * index on every node. */
static void direct_layout(const struct ncclComm* comm, struct cuda_direct* d) {
  const struct sched_topo* t = &comm->layout;
  d->nranks = comm->nranks;
  d->nlocal = MIN(node_ranks(comm, t->node_of[comm->rank], d->local), DIRECT_MAX_RANKS);
  d->me_local = t->local_of[comm->rank];
  for (int node = 0; node < t->nnodes; node++)
    d->column[node] =
        t->order[t->node_start[node] + MIN(d->me_local, sched_topo_node_size(t, node) - 1)];
}

static ncclResult_t direct_get(struct ncclComm* comm, struct cuda_direct** out) {
  ncclResult_t res = ncclSuccess;
  struct device_comm* cc = comm->device;
  struct cuda_direct* d = cc->direct;
  if (d) {
    *out = d;
    return ncclSuccess;
  }
  CHECK(braid_calloc(&d, 1, sizeof(*d)));
  cc->direct = d; /* from here on cuda_direct_free (with the comm) undoes what is made */
  CHECK(braid_calloc(&d->links, (size_t)comm->nranks, sizeof(int)));
  CHECK(braid_calloc(&d->same_process, (size_t)comm->nranks, sizeof(int)));
  CHECK(braid_calloc(&d->heard, (size_t)comm->nranks, sizeof(uint64_t)));
  CHECK(braid_calloc(&d->column, (size_t)comm->layout.nnodes, sizeof(int)));
  direct_layout(comm, d);
  for (int p = 0; p < comm->nranks; p++) {
    d->links[p] = -1;
    d->same_process[p] = cuda_peer_in_process(comm, p);
    d->any_remote |= !d->same_process[p] && is_local(d, p);
  }
  d->tdev = &cc->tdev;
  /* non-blocking: a user stream waiting on a gate never holds a kernel back */
  CHECK(cuda_check(cuda_driver()->cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING),
                   "cuStreamCreate(direct)"));
  CHECK(direct_links(comm, d));
  INFO(SUB_INIT, "Rank %d: direct calls on device buffers, %d ranks of its node linked", comm->rank,
       d->nlocal);
  *out = d;
fail:
  return res;
}

void cuda_direct_free(struct cuda_direct* d, int streams_passed) {
  if (d == NULL) return;
  while (d->scratch) { /* a kernel may still use it unless every stream passed */
    struct direct_scratch* s = d->scratch;
    d->scratch = s->older;
    if (streams_passed && !d->tdev->mappings_in_use) cuda_driver()->cuMemFreeHost(s->host);
    free(s);
  }
  for (int p = 0; d->links && p < d->nranks; p++)
    if (d->links[p] >= 0) close(d->links[p]);
  if (d->stream) {
    cuda_driver()->cuStreamSynchronize(d->stream);
    cuda_driver()->cuStreamDestroy(d->stream);
  }
  free(d->links);
  free(d->column);
  free(d->same_process);
  free(d->heard);
  free(d);
}

/* ---- One call ---- */

/* The link to `peer` failed with `res`: if the peer said why before it
 * went (its unread messages of this call come first), or closed the link,
 * that is the error, naming it; else (a timeout, an abort) `res`. */
static ncclResult_t link_lost(struct cuda_direct* d, int peer, ncclResult_t res) {
  for (int k = 0; k < 3; k++) {
    struct direct_msg m;
    int fd = -1;
    if (cudaipc_fd_recv(d->links[peer], &m, sizeof(m), &fd, DIRECT_FAIL_READ_MS, NULL) !=
        ncclSuccess)
      break;
    if (fd >= 0) close(fd);
    if (m.what == DIRECT_MSG_FAIL) {
      d->heard[peer] = m.seq;
      WARN("Direct: rank %d failed in call %llu (its log says why)", peer,
           (unsigned long long)m.seq);
      return ncclRemoteError;
    }
  }
  if (!cudaipc_fd_closed(d->links[peer])) return res;
  WARN("Direct: rank %d failed in call %llu: it closed its link (it died or was aborted)", peer,
       (unsigned long long)d->seq);
  return ncclRemoteError;
}

/* Tell every peer about one of this rank's buffers (ptr NULL: unused);
 * peers in other processes get its allocation's description and fd: the
 * registration's, if ncclCommRegister made one that still holds, else
 * made now. */
static ncclResult_t post_buffer(struct ncclComm* comm, struct cuda_direct* d, int buf,
                                const void* ptr) {
  ncclResult_t res = ncclSuccess;
  struct direct_msg m = {d->seq, DIRECT_MSG_BUF, (uint32_t)buf, (uint64_t)(uintptr_t)ptr, d->call,
                         {0}};
  int fd = -1, own_fd = 0;
  if (ptr && d->any_remote) {
    const struct mem_reg* reg = mem_reg_find(&comm->regs, ptr, 1);
    const struct cudaipc_export* ex = reg ? reg->handles[cudaipc_transport.id] : NULL;
    if (cudaipc_export_covers(ex, ptr)) {
      m.desc = ex->desc;
      fd = ex->fd;
    } else {
      CHECK(cudaipc_describe(ptr, &m.desc, &fd));
      own_fd = 1;
    }
  }
  for (int p = 0; p < d->nranks; p++)
    if (d->links[p] >= 0) {
      res = cudaipc_fd_send(d->links[p], &m, sizeof(m), d->same_process[p] ? -1 : fd,
                            comm->tctx.timeout_ms, &comm->aborted);
      if (res != ncclSuccess) res = link_lost(d, p, res);
      if (res != ncclSuccess) goto fail;
    }
fail:
  if (own_fd && fd >= 0) close(fd);
  return res;
}

/* The next message from `peer`, which must be `what` of this call. */
static ncclResult_t recv_msg(struct ncclComm* comm, struct cuda_direct* d, int peer, uint32_t what,
                             struct direct_msg* m, int* fd) {
  ncclResult_t res = ncclSuccess;
  res = cudaipc_fd_recv(d->links[peer], m, sizeof(*m), fd, comm->tctx.timeout_ms, &comm->aborted);
  if (res != ncclSuccess) return link_lost(d, peer, res);
  if (m->what == DIRECT_MSG_DONE || m->what == DIRECT_MSG_FAIL) d->heard[peer] = m->seq;
  if (m->what == DIRECT_MSG_FAIL) {
    if (*fd >= 0) close(*fd), *fd = -1;
    FAIL(ncclRemoteError, "Direct: rank %d failed in call %llu (its log says why)", peer,
         (unsigned long long)m->seq);
  }
  if (m->seq != d->seq || m->what != what) {
    if (*fd >= 0) close(*fd), *fd = -1;
    FAIL(ncclInvalidUsage,
         "Direct: rank %d expected message %u of call %llu from rank %d, got %u of call %llu "
         "(the ranks called different collectives)",
         comm->rank, what, (unsigned long long)d->seq, peer, m->what, (unsigned long long)m->seq);
  }
fail:
  return res;
}

/* Whether peer made this rank's call: else both calls are named, and
 * nothing of this one is written. */
static ncclResult_t check_call(struct ncclComm* comm, struct cuda_direct* d, int peer,
                               const struct direct_msg* m) {
  if (memcmp(&m->call, &d->call, sizeof(d->call)) == 0) return ncclSuccess;
  exec_tag_warn(comm, &d->call, peer, &m->call);
  return ncclInvalidUsage;
}

/* Where peer's buffer of message m is here: a thread of this process
 * names its pointer as it is; another process's buffer is mapped, and the
 * bytes the call touches must lie inside what was mapped. */
static ncclResult_t buffer_at(struct cuda_direct* d, int peer, const struct direct_msg* m, int fd,
                              char** out) {
  ncclResult_t res = ncclSuccess;
  void* base = NULL;
  size_t mapped = 0;
  *out = (char*)(uintptr_t)m->ptr;
  if (m->ptr == 0 || d->same_process[peer]) return ncclSuccess;
  CHECK(cudaipc_cache_map(d->tdev->cache, peer, &m->desc, fd, &base, &mapped));
  CHECK(cudaipc_translate(&m->desc, base, mapped, m->ptr, d->extent[m->buf], peer, out));
fail:
  return res;
}

/* Where peer's buffers are mapped here: bufs[DIRECT_SEND], [DIRECT_RECV]. */
static ncclResult_t map_peer(struct ncclComm* comm, struct cuda_direct* d, int peer,
                             char* bufs[DIRECT_NBUFS]) {
  ncclResult_t res = ncclSuccess;
  for (int k = 0; k < 2; k++) {
    struct direct_msg m;
    int fd = -1;
    CHECK(recv_msg(comm, d, peer, DIRECT_MSG_BUF, &m, &fd));
    if (m.buf != (uint32_t)k) {
      WARN("Direct: rank %d sent its buffers out of order", peer);
      res = ncclInternalError;
    }
    if (res == ncclSuccess) res = check_call(comm, d, peer, &m);
    if (res == ncclSuccess) res = buffer_at(d, peer, &m, fd, &bufs[k]);
    if (fd >= 0) close(fd);
    if (res != ncclSuccess) goto fail;
  }
fail:
  return res;
}

/* Buffers of the node's ranks by node index, as tasks name them. */
typedef char* direct_bufs[DIRECT_MAX_RANKS][DIRECT_NBUFS];

/* The plan's task over every rank's buffers, in the kernel's form;
 * `flags` the post-divide. */
static void direct_task_resolve(const struct exec_args* a, const struct direct_task* p,
                                unsigned flags, direct_bufs bufs, struct kern_dev_task* dt) {
  size_t es = kern_type_size(a->type);
  struct kern_task t;
  memset(&t, 0, sizeof(t));
  t.redop = a->redop;
  t.flags = flags;
  t.nsrcs = p->nsrcs;
  t.ndsts = p->ndsts;
  t.n = p->n;
  for (int s = 0; s < p->nsrcs; s++)
    t.srcs[s] = bufs[p->srcs[s].rank][p->srcs[s].buf] + p->srcs[s].off * es;
  for (int j = 0; j < p->ndsts; j++)
    t.dsts[j] = bufs[p->dsts[j].rank][p->dsts[j].buf] + p->dsts[j].off * es;
  cuda_task_to_dev(&t, dt);
  dt->rows = (uint32_t)p->rows;
  dt->src_row = (int64_t)p->src_row * (int64_t)es;
  dt->dst_row = (int64_t)p->dst_row * (int64_t)es;
}

/* Wait for this rank's kernel, queued on its stream at issue, to have run
 * the task just let go. It runs at once (the stream waits on nothing else
 * before it), so neither an abort nor a peer's failure ends the wait: a
 * kernel still reading and writing the peers' buffers must be done before
 * anyone's stream goes on. Only a broken stream, or the timeout (then the
 * mappings are kept for good), ends it early. */
static ncclResult_t deferred_wait(struct ncclComm* comm, struct cuda_direct* d,
                                  const struct work_op* op, const struct work_deferred* k) {
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

/* Run this rank's `which`-th task of the call: on its stream where the
 * call is gated there (the kernel is queued, waiting for it), else on the
 * comm's own stream, blocking until it is done. */
static ncclResult_t task_run(struct ncclComm* comm, struct cuda_direct* d, const struct work_op* op,
                             int which, const struct kern_dev_task* t) {
  const struct work_deferred* k = &op->deferred[which];
  if (k->slot == NULL) return t->n ? sync_run(d, t) : ncclSuccess;
  cuda_deferred_go(k, t);
  return deferred_wait(comm, d, op, k);
}

/* This rank's buffers to its node's peers, and theirs mapped here. */
static ncclResult_t buffers_exchange(struct ncclComm* comm, struct cuda_direct* d, const void* send,
                                     void* recv, direct_bufs bufs) {
  ncclResult_t res = ncclSuccess;
  bufs[d->me_local][DIRECT_SEND] = (char*)send;
  bufs[d->me_local][DIRECT_RECV] = recv;
  d->exposed = 0;
  CHECK(post_buffer(comm, d, DIRECT_SEND, send));
  CHECK(post_buffer(comm, d, DIRECT_RECV, recv));
  d->exposed = 1;
  for (int j = 0; j < d->nlocal; j++)
    if (d->local[j] != comm->rank) CHECK(map_peer(comm, d, d->local[j], bufs[j]));
fail:
  return res;
}

/* "done" to every peer of the node, then theirs: no rank's stream goes on
 * while a peer may still read its input or write its output. */
static ncclResult_t done_exchange(struct ncclComm* comm, struct cuda_direct* d) {
  ncclResult_t res = ncclSuccess;
  struct direct_msg done = {d->seq, DIRECT_MSG_DONE, 0, 0, {{0}}, {0}};
  for (int p = 0; p < d->nranks; p++)
    if (d->links[p] >= 0) {
      res = cudaipc_fd_send(d->links[p], &done, sizeof(done), -1, comm->tctx.timeout_ms,
                            &comm->aborted);
      if (res != ncclSuccess) res = link_lost(d, p, res);
      if (res != ncclSuccess) goto fail;
    }
  for (int p = 0; p < d->nranks; p++) {
    struct direct_msg m;
    int fd = -1;
    if (d->links[p] >= 0) CHECK(recv_msg(comm, d, p, DIRECT_MSG_DONE, &m, &fd));
  }
fail:
  return res;
}

/* One task over the node's buffers (every rank of the comm). */
static ncclResult_t node_call(struct ncclComm* comm, struct cuda_direct* d,
                              const struct work_op* op, direct_bufs bufs) {
  ncclResult_t res = ncclSuccess;
  const struct exec_args* a = &op->args;
  struct direct_task plan;
  struct kern_dev_task task;
  size_t es = kern_type_size(a->type);
  CHECK(direct_plan(a->coll, d->me_local, d->nlocal, a->root, a->count, a->stride, MAX(16 / es, 1),
                    &plan));
  direct_task_resolve(a, &plan, a->post, bufs, &task);
  CHECK(task_run(comm, d, op, 0, &task));
fail:
  return res;
}

/* Pinned scratch of at least `bytes`, mapped for the device. */
static ncclResult_t scratch_get(struct cuda_direct* d, size_t bytes, struct direct_scratch** out) {
  ncclResult_t res = ncclSuccess;
  struct direct_scratch* s = d->scratch;
  if (s == NULL || s->bytes < bytes) {
    CHECK(braid_calloc(&s, 1, sizeof(*s)));
    s->bytes = MAX(bytes, d->scratch ? 2 * d->scratch->bytes : (size_t)4096);
    res = cuda_flags_alloc(cuda_driver(), s->bytes, "cuMemHostAlloc(Hier scratch)", &s->host,
                           &s->dev);
    if (res != ncclSuccess) {
      free(s);
      goto fail;
    }
    s->older = d->scratch;
    d->scratch = s;
  }
  *out = s;
fail:
  return res;
}

/* This rank's Hier plan for the call (algorithms/direct.h), from the
 * comm's layout: the same at issue (cuda_direct_arm) and on the proxy. */
static ncclResult_t hier_plan(const struct ncclComm* comm, const struct exec_args* a,
                              struct direct_staged* st) {
  const struct sched_topo* t = &comm->layout;
  struct direct_hier h = {.coll = a->coll,
                          .local = t->local_of[comm->rank],
                          .nlocal = t->min_ppn,
                          .node = t->node_of[comm->rank],
                          .nnodes = t->nnodes,
                          .count = a->count,
                          .stride = a->stride,
                          .align = MAX(16 / kern_type_size(a->type), 1)};
  if (a->coll != COLL_ALLREDUCE && !direct_column(t, h.local, &h.column0, &h.column_step)) {
    WARN("Direct: rank %d's column is not evenly spaced", comm->rank); /* hier_fits said it was */
    return ncclInternalError;
  }
  return direct_plan_hier(&h, st);
}

/* The stage between nodes, in the pinned scratch: the call's collective
 * among the ranks of the other nodes that hold this rank's index (a ring
 * over the network, on the host: the executor with a group). */
static ncclResult_t column_call(struct ncclComm* comm, struct cuda_direct* d,
                                const struct exec_args* a, char* scratch,
                                const struct direct_staged* st) {
  ncclResult_t res = ncclSuccess;
  struct exec_args c = *a;
  size_t es = kern_type_size(a->type);
  long nap_ns = 0;
  int done = 0;
  c.sendbuff = scratch + st->send_off * es;
  c.recvbuff = scratch + st->recv_off * es;
  c.count = st->count;
  c.stride = 0;
  c.mem = MEM_HOST;
  c.sendreg = c.recvreg = NULL;
  c.scalar_src = NULL;
  c.algo = ALGO_RING;
  c.chunk_bytes = comm->exec.slot_bytes;
  c.group_size = comm->layout.nnodes;
  c.group_rank = comm->layout.node_of[comm->rank];
  c.group_ranks = d->column;
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

/* Hier with the node's stages direct (direct_plan_hier): the first task
 * into pinned scratch, the stage between nodes there, the second task out
 * of it. The post-divide (avg) happens between nodes, on the total. */
static ncclResult_t hier_call(struct ncclComm* comm, struct cuda_direct* d,
                              const struct work_op* op, direct_bufs bufs) {
  ncclResult_t res = ncclSuccess;
  const struct exec_args* a = &op->args;
  struct direct_staged st;
  struct direct_scratch* scratch;
  struct kern_dev_task task;
  size_t es = kern_type_size(a->type);
  CHECK(hier_plan(comm, a, &st));
  CHECK(scratch_get(d, MAX(st.scratch * es, (size_t)1), &scratch));
  bufs[d->me_local][DIRECT_SCRATCH] = (char*)(uintptr_t)scratch->dev;
  direct_task_resolve(a, &st.before, 0, bufs, &task);
  CHECK(task_run(comm, d, op, 0, &task));
  if (st.count) CHECK(column_call(comm, d, a, scratch->host, &st));
  direct_task_resolve(a, &st.after, 0, bufs, &task);
  CHECK(task_run(comm, d, op, 1, &task));
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
       op->direct == WORK_DIRECT_HIER ? "Hier with direct node stages" : "Direct");
  memset(bufs, 0, sizeof(direct_bufs));
  CHECK(buffers_exchange(comm, d, reads ? a->sendbuff : NULL, writes ? a->recvbuff : NULL, bufs));
  if (op->direct == WORK_DIRECT_HIER)
    CHECK(hier_call(comm, d, op, bufs));
  else
    CHECK(node_call(comm, d, op, bufs));
  CHECK(done_exchange(comm, d));
fail:
  return res;
}

/* Best effort, quietly: the peers may be gone, and the error this rank
 * reports is the one that made it fail. */
static void tell_failure(struct ncclComm* comm, struct cuda_direct* d) {
  struct direct_msg m = {d->seq, DIRECT_MSG_FAIL, 0, 0, {{0}}, {0}};
  for (int p = 0; p < d->nranks; p++)
    if (p != comm->rank && d->links[p] >= 0) cudaipc_fd_try_send(d->links[p], &m, sizeof(m));
}

/* A failed call whose buffers every peer got: a peer's kernel may be using
 * them, so this rank's stream waits until each peer has said its last word
 * of the call ("done" or "fail"), closed its link, or the timeout or an
 * abort passed. */
static void drain_peers(struct ncclComm* comm, struct cuda_direct* d) {
  uint64_t deadline = braid_now_ns() + (uint64_t)comm->tctx.timeout_ms * 1000000ull;
  for (int p = 0; p < d->nranks; p++) {
    if (p == comm->rank || d->links[p] < 0 || d->heard[p] == d->seq) continue;
    for (;;) {
      struct direct_msg m;
      int fd = -1;
      int64_t left_ms = (int64_t)(deadline - braid_now_ns()) / 1000000;
      if (left_ms <= 0 ||
          cudaipc_fd_recv(d->links[p], &m, sizeof(m), &fd, left_ms, &comm->aborted) != ncclSuccess)
        break;
      if (fd >= 0) close(fd);
      if (m.seq == d->seq && (m.what == DIRECT_MSG_DONE || m.what == DIRECT_MSG_FAIL)) break;
    }
  }
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
    res = direct_call(comm, d, op);
  }
  if (res != ncclSuccess && d != NULL && !d->broken) {
    d->broken = 1;
    tell_failure(comm, d);
    if (d->exposed) drain_peers(comm, d);
  }
  cuda_ctx_restore(saved);
fail:
  return res;
}

ncclResult_t cuda_direct_arm(struct work_op* op, CUstream stream) {
  ncclResult_t res = ncclSuccess;
  struct ncclComm* comm = op->comm;
  const struct exec_args* a = &op->args;
  const struct sched_topo* t = &comm->layout;
  struct cuda_deferred_pool* pool = &comm->device->deferred;
  struct direct_task plan;
  struct direct_staged st;
  size_t align = MAX(16 / kern_type_size(a->type), 1);
  int k = sched_topo_node_size(t, t->node_of[comm->rank]), me = t->local_of[comm->rank];
  if (op->direct == WORK_DIRECT_HIER) { /* two kernels: into the scratch, out of it */
    CHECK(hier_plan(comm, a, &st));
    CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, st.before.n, &op->deferred[0]));
    CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, st.after.n, &op->deferred[1]));
    return ncclSuccess;
  }
  CHECK(direct_plan(a->coll, me, k, a->root, a->count, a->stride, align, &plan));
  CHECK(cuda_deferred_arm(pool, cuda_driver(), stream, plan.n, &op->deferred[0]));
fail:
  return res;
}
