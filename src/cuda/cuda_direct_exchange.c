/*
 * The direct algorithm's links and messages (cuda_direct_state.h): a
 * Unix-socket link to each rank of the node, made at the first direct
 * call; per call this rank's buffers out and the peers' mapped in,
 * "done", and "fail" when a call fails.
 */
#include "cuda_direct_exchange.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core.h"
#include "cuda/cudaipc_fd_link.h"
#include "cuda_comm.h"
#include "cuda/cudaipc_fd.h"
#include "cudaipc/cudaipc.h"
#include "engine/exec_plan.h"
#include "layout.h"

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
  d->nlocal = MIN(direct_node_ranks(comm, t->node_of[comm->rank], d->local), DIRECT_MAX_RANKS);
  d->me_local = t->local_of[comm->rank];
  for (int node = 0; node < t->nnodes; node++)
    d->column[node] =
        t->order[t->node_start[node] + MIN(d->me_local, sched_topo_node_size(t, node) - 1)];
}

ncclResult_t direct_get(struct ncclComm* comm, struct cuda_direct** out) {
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
  struct direct_scratch** on_device[] = {&d->dev_scratch, &d->premul};
  for (size_t k = 0; k < sizeof(on_device) / sizeof(on_device[0]); k++)
    while (*on_device[k]) {
      struct direct_scratch* s = *on_device[k];
      *on_device[k] = s->older;
      if (streams_passed && !d->tdev->mappings_in_use) cuda_driver()->cuMemFree(s->dev);
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

/* This rank's buffers to its node's peers, and theirs mapped here. */
ncclResult_t direct_buffers_exchange(struct ncclComm* comm, struct cuda_direct* d, const void* send,
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
ncclResult_t direct_done_exchange(struct ncclComm* comm, struct cuda_direct* d) {
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

/* Best effort, quietly: the peers may be gone, and the error this rank
 * reports is the one that made it fail. */
void direct_tell_failure(struct ncclComm* comm, struct cuda_direct* d) {
  struct direct_msg m = {d->seq, DIRECT_MSG_FAIL, 0, 0, {{0}}, {0}};
  for (int p = 0; p < d->nranks; p++)
    if (p != comm->rank && d->links[p] >= 0) cudaipc_fd_try_send(d->links[p], &m, sizeof(m));
}

/* A failed call whose buffers every peer got: a peer's kernel may be using
 * them, so this rank's stream waits until each peer has said its last word
 * of the call ("done" or "fail"), closed its link, or the timeout or an
 * abort passed. */
void direct_drain_peers(struct ncclComm* comm, struct cuda_direct* d) {
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
