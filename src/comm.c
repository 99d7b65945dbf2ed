/*
 * Communicator state after init: argument checks, the error state and its
 * cascade, finalize/destroy/abort and the small queries. (Buffer
 * registration and ncclMemAlloc are in mem.c.)
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "core.h"
#include "stream.h"

#ifdef BRAID_HAVE_CUDA
#include "cuda/cuda_comm.h"
#endif

ncclResult_t comm_check(const struct ncclComm* comm, const char* fn) {
  if (comm == NULL) {
    WARN("%s : comm argument is NULL", fn);
    return ncclInvalidArgument;
  }
  if (!comm_registry_has(comm) || comm->magic != COMM_MAGIC) {
    WARN("%s : comm %p is not a live communicator (destroyed?)", fn, (const void*)comm);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t comm_check_type(ncclDataType_t type, const char* fn) {
  if ((int)type < 0 || type >= ncclNumTypes) {
    WARN("%s : invalid data type %d", fn, (int)type);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t comm_check_count(const char* fn, size_t count, size_t elem_size, size_t blocks) {
  if (count <= COMM_MAX_BYTES / elem_size / blocks) return ncclSuccess;
  if (blocks > 1)
    WARN("%s : count %zu x %zu ranks x %zu bytes is larger than any buffer can be (2^56 bytes)", fn,
         count, blocks, elem_size);
  else
    WARN("%s : count %zu x %zu bytes is larger than any buffer can be (2^56 bytes)", fn, count,
         elem_size);
  return ncclInvalidArgument;
}

/* Why a live comm takes no call now (`allow`: enum comm_call_allow). */
static ncclResult_t comm_call_state(const struct ncclComm* comm, const char* fn, int allow) {
  ncclResult_t res = ncclSuccess;
  if (comm->finalized) {
    WARN("%s : comm %p is finalized", fn, (const void*)comm);
    res = ncclInvalidUsage;
  } else if (atomic_load(&comm->suspended)) {
    WARN("%s : comm %p is suspended (ncclCommResume first)", fn, (const void*)comm);
    res = ncclInvalidUsage;
  } else if (atomic_load(&comm->revoked) && !(allow & COMM_CALL_REVOKED_TOO)) {
    WARN("%s : comm %p is revoked (ncclCommRevoke or an aborting shrink): destroy or shrink it", fn,
         (const void*)comm);
    res = ncclInvalidUsage;
  }
  return res;
}

ncclResult_t comm_check_call(const struct ncclComm* comm, const char* fn) {
  ncclResult_t res = comm_check(comm, fn);
  return res == ncclSuccess ? comm_call_state(comm, fn, COMM_CALL_WORKING) : res;
}

ncclResult_t comm_call_hold(struct ncclComm* comm, const char* fn) {
  ncclResult_t res = comm_check(comm, fn); /* its WARNs for NULL and unknown handles */
  if (res != ncclSuccess) return res;
  if (!comm_registry_enter(comm)) { /* aborted or destroyed since */
    WARN("%s : comm %p is not a live communicator (destroyed?)", fn, (const void*)comm);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t comm_call_enter(struct ncclComm* comm, const char* fn, int allow) {
  ncclResult_t res = comm_call_hold(comm, fn);
  if (res != ncclSuccess) return res;
  res = comm_call_state(comm, fn, allow);
  if (res != ncclSuccess) comm_call_leave(comm);
  return res;
}

void comm_call_leave(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->turn_lock);
  atomic_fetch_sub(&comm->calls, 1);
  pthread_cond_broadcast(&comm->turn_cv);
  pthread_mutex_unlock(&comm->turn_lock);
}

/* Every connection of the comm, both channels and directions. */
static void comm_conns_apply(struct ncclComm* comm, int close_them) {
  struct transport_conn** tables[6] = {comm->send_conns, comm->recv_conns,   comm->p2p_send,
                                       comm->p2p_recv,   comm->p2p_send_dev, comm->p2p_recv_dev};
  for (int t = 0; t < 6; t++)
    for (int p = 0; tables[t] && p < comm->nranks; p++) {
      struct transport_conn* c = __atomic_load_n(&tables[t][p], __ATOMIC_ACQUIRE); /* connect.c */
      if (c == NULL) continue;
      if (close_them) {
        c->ops->close(c);
        tables[t][p] = NULL;
      } else {
        c->ops->shutdown(c);
      }
    }
}

void comm_set_error(struct ncclComm* comm, ncclResult_t err) {
  int expected = ncclSuccess;
  if (err == ncclSuccess) return;
  if (atomic_compare_exchange_strong(&comm->error, &expected, (int)err))
    INFO(SUB_INIT,
         "Rank %d: communicator failed (%s); shutting down its connections so peers notice",
         comm->rank, ncclGetErrorString(err));
  comm_conns_apply(comm, 0);
}

void comm_ref(struct ncclComm* comm) {
  atomic_fetch_add(&comm->refs, 1);
}

void comm_unref(struct ncclComm* comm) {
  if (atomic_fetch_sub(&comm->refs, 1) != 1) return;
  pthread_mutex_destroy(&comm->turn_lock);
  pthread_cond_destroy(&comm->turn_cv);
  comm->magic = 0;
  free(comm);
}

void comm_free(struct ncclComm* comm) {
  if (comm == NULL) return;
  comm_registry_remove(comm);
  stream_destroy(comm->internal_stream); /* finishes queued work first */
  comm->internal_stream = NULL;
#ifdef BRAID_HAVE_CUDA
  cuda_comm_free(comm); /* the same for its proxy */
#endif
  mem_regs_free(&comm->regs); /* while the transports that pinned them are up */
  comm_conns_apply(comm, 1);
  transport_accept_free(&comm->tctx);
  transport_states_free(&comm->tctx);
  if (comm->tctx.listen_fd >= 0) close(comm->tctx.listen_fd);
  if (comm->ctrl_fd >= 0) close(comm->ctrl_fd);
  comm->tctx.listen_fd = comm->ctrl_fd = -1;
  progress_destroy(&comm->progress);
  exec_free(&comm->exec);
  sched_topo_free(&comm->layout);
  redop_free_all(comm);
  free(comm->send_conns);
  free(comm->recv_conns);
  free(comm->p2p_send);
  free(comm->p2p_recv);
  free(comm->p2p_send_dev);
  free(comm->p2p_recv_dev);
  free(comm->peers);
  free(comm->peer_transport);
  free(comm->peer_transport_dev);
  comm->peer_transport = comm->peer_transport_dev = NULL;
  comm->send_conns = comm->recv_conns = comm->p2p_send = comm->p2p_recv = NULL;
  comm->p2p_send_dev = comm->p2p_recv_dev = NULL;
  comm->peers = NULL;
  if (comm->grow_root) bootstrap_root_release(comm->grow_root); /* an id never used */
  comm->grow_root = NULL;
  comm->magic = 0;
  comm_unref(comm);
}

/* Wait until no call comm_call_enter'ed is in flight (each is bounded by
 * BRAID_TIMEOUT_MS, and an abort ends it sooner). */
static void comm_wait_calls(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->turn_lock);
  while (atomic_load(&comm->calls) > 0) pthread_cond_wait(&comm->turn_cv, &comm->turn_lock);
  pthread_mutex_unlock(&comm->turn_lock);
}

ncclResult_t comm_flush(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  /* Blocking comms finish every call before it returns; a non-blocking
   * comm's queue is flushed here. */
  if (comm->internal_stream) res = stream_sync(comm->internal_stream);
#ifdef BRAID_HAVE_CUDA
  if (res == ncclSuccess && comm->cuda && comm->cuda->own_proxy)
    res = stream_sync(comm->cuda->proxy);
#endif
  return res;
}

NCCL_API(ncclResult_t, ncclCommFinalize, ncclComm_t comm);
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  ncclResult_t res = comm_check(comm, "ncclCommFinalize");
  if (res != ncclSuccess) return res;
  comm_wait_calls(comm); /* a shrink or grow in flight finishes first */
  res = comm_flush(comm);
  comm->finalized = 1;
  return res;
}

/* Wait until no unit runs on the comm and, with `all_issued`, until every
 * unit issued on it (on any stream) has run. No wake-up can be missed, so
 * the wait is untimed: a unit lowers `active` and raises `serving` only in
 * turn_leave, under turn_lock, and broadcasts turn_cv there. */
static void comm_wait_units(struct ncclComm* comm, int all_issued) {
  pthread_mutex_lock(&comm->turn_lock);
  while (atomic_load(&comm->active) > 0 || (all_issued && comm->serving != comm->next_ticket))
    pthread_cond_wait(&comm->turn_cv, &comm->turn_lock);
  pthread_mutex_unlock(&comm->turn_lock);
}

/* Stop whatever waits on the comm: init, a running call, queued work. */
static void comm_abort_waits(struct ncclComm* comm) {
  atomic_store(&comm->aborted, 1);
  progress_wake(&comm->progress);
  comm_conns_apply(comm, 0);
  pthread_mutex_lock(&comm->turn_lock);
  pthread_cond_broadcast(&comm->turn_cv);
  pthread_mutex_unlock(&comm->turn_lock);
}

NCCL_API(ncclResult_t, ncclCommDestroy, ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  ncclResult_t res = comm_check(comm, "ncclCommDestroy");
  if (res != ncclSuccess) return res;
  comm_registry_remove(comm);           /* from now on the handle is refused */
  if (!atomic_load(&comm->init_done)) { /* a non-blocking init still waits for ranks */
    INFO(SUB_INIT, "comm %p rank %d destroyed before its init completed: init aborted", (void*)comm,
         comm->rank);
    comm_abort_waits(comm);
  }
  comm_wait_units(comm, 1);            /* work still queued on host streams needs the comm */
  if (atomic_load(&comm->calls) > 0) { /* a shrink or grow waits: it fails now */
    INFO(SUB_INIT, "comm %p rank %d destroyed while a call waited on it: that call fails",
         (void*)comm, comm->rank);
    atomic_store(&comm->closing, 1);
    comm_abort_waits(comm);
    comm_wait_calls(comm);
  }
  INFO(SUB_INIT, "comm %p rank %d nranks %d - Destroy COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  comm_free(comm);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommAbort, ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  ncclResult_t res = comm_check(comm, "ncclCommAbort");
  if (res != ncclSuccess) return res;
  comm_registry_remove(comm);
  atomic_store(&comm->closing, 1);
  comm_abort_waits(comm);
  /* A unit running now wakes on the eventfd and leaves; queued ones find
   * the comm aborted when their turn comes and hold it until then. */
  comm_wait_units(comm, 0);
  comm_wait_calls(comm); /* a waiting shrink or grow saw the abort and leaves */
  INFO(SUB_INIT, "comm %p rank %d nranks %d - Abort COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  comm_free(comm);
  return ncclSuccess;
}

/* Stop the comm's work in flight and refuse new calls; the comm stays for
 * destroy, abort or shrink. Running units wake and leave with an error,
 * queued ones find the comm aborted when their turn comes. */
ncclResult_t comm_revoke(struct ncclComm* comm) {
  atomic_store(&comm->revoked, 1);
  comm_abort_waits(comm);
  comm_wait_units(comm, 0);
  INFO(SUB_INIT, "comm %p rank %d nranks %d - Revoke COMPLETE", (void*)comm, comm->rank,
       comm->nranks);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  ncclResult_t res = comm_check(comm, "ncclCommRevoke");
  if (res != ncclSuccess) return res;
  if (revokeFlags != NCCL_REVOKE_DEFAULT) {
    WARN("ncclCommRevoke : unknown flags 0x%x (only NCCL_REVOKE_DEFAULT)", revokeFlags);
    return ncclInvalidArgument;
  }
  return comm_revoke(comm);
}

/* A watchdog thread asks while another aborts: the comm is held. */
NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclResult_t res = comm_call_hold(comm, "ncclCommGetAsyncError");
  if (res != ncclSuccess) return res;
  if (asyncError == NULL) {
    WARN("ncclCommGetAsyncError : asyncError is NULL");
    res = ncclInvalidArgument;
  } else {
    *asyncError = (ncclResult_t)atomic_load(&comm->error);
    if (*asyncError == ncclSuccess && comm->internal_stream)
      *asyncError = stream_query(comm->internal_stream);
  }
  comm_call_leave(comm);
  return res;
}

/* The three queries share one shape: hold, then read one int field (at
 * `field`, an offset: a refused handle may be freed memory, never read). */
static ncclResult_t comm_query(ncclComm_t comm, int* out, const char* fn, size_t field) {
  ncclResult_t res = comm_call_hold(comm, fn);
  if (res != ncclSuccess) return res;
  if (out == NULL) {
    WARN("%s : output pointer is NULL", fn);
    res = ncclInvalidArgument;
  } else {
    memcpy(out, (const char*)comm + field, sizeof(*out));
  }
  comm_call_leave(comm);
  return res;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return comm_query(comm, count, "ncclCommCount", offsetof(struct ncclComm, nranks));
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return comm_query(comm, rank, "ncclCommUserRank", offsetof(struct ncclComm, rank));
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return comm_query(comm, device, "ncclCommCuDevice", offsetof(struct ncclComm, cuda_dev));
}
