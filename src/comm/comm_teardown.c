/*
 * The end of a communicator's life (comm_teardown.h): ncclCommFinalize,
 * ncclCommDestroy, ncclCommAbort and ncclCommRevoke, and freeing what
 * comm_init.c made. A unit running, or a call waiting on the comm
 * (comm_call_enter), is woken or waited for first: nothing is freed under
 * anyone.
 */
#include "comm/comm_teardown.h"

#include <stdlib.h>
#include <unistd.h>

#include "bootstrap/bootstrap_root.h"
#include "comm/comm.h"
#include "core.h"
#include "engine/device.h"
#include "engine/executor.h"
#include "status/flight_json.h"
#include "status/status_service.h"
#include "layout.h"
#include "engine/p2p_lane.h"
#include "engine/progress.h"
#include "engine/redop.h"
#include "engine/stream.h"
#include "transport_table.h"

/* What comm_init.c made, in reverse, then the user's reference (see
 * comm_teardown.h). */
void comm_free(struct ncclComm* comm) {
  if (comm == NULL) return;
  comm_registry_remove(comm);
  stream_destroy(comm->internal_stream); /* finishes queued work first */
  comm->internal_stream = NULL;
  lane_destroy(comm->lane); /* its connections, while the transports are up */
  comm->lane = NULL;
  device_comm_free(comm);     /* the same for its proxy */
  mem_regs_free(&comm->regs); /* while the transports that pinned them are up */
  comm_conns_apply(comm, 1);
  transport_states_free(&comm->tctx);
  status_unregister(comm); /* the service lets go of its listener and of the comm */
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

ncclResult_t comm_flush(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  /* Blocking comms finish every call before it returns; a non-blocking
   * comm's queue is flushed here. */
  if (comm->internal_stream) res = stream_sync(comm->internal_stream);
  if (res == ncclSuccess) res = device_comm_flush(comm);
  return res;
}

/* Wait until no call comm_call_enter'ed is in flight (each is bounded by
 * BRAID_TIMEOUT_MS, and an abort ends it sooner). */
static void comm_wait_calls(struct ncclComm* comm) {
  pthread_mutex_lock(&comm->turn_lock);
  while (atomic_load(&comm->calls) > 0) pthread_cond_wait(&comm->turn_cv, &comm->turn_lock);
  pthread_mutex_unlock(&comm->turn_lock);
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
  flight_dump(&comm->flight, "ncclCommAbort"); /* before anything of it goes */
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
