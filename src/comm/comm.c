/*
 * A communicator's state once made (comm.h): which comms are live, the
 * checks every call makes, calls counted in and out, references, and the
 * error state and its cascade. It calls nothing above the transports: the
 * comm's life (made in comm_init.c, unmade in comm_teardown.c) is the
 * files that do.
 *
 * A handle passed again after ncclCommDestroy/Abort must be refused
 * without reading the memory it pointed to, and only a record outside that
 * memory can tell: the live comms are a pointer set, one of the library's
 * two pieces of process-wide state (the other is ncclMemAlloc's,
 * mem_alloc.c).
 */
#include <stdlib.h>

#include "comm/comm.h"
#include "core.h"
#include "status/flight_json.h"
#include "ptr_set.h"

/* ---- the live comms ---- */

static struct ptr_set g_comms = PTR_SET_INIT;

ncclResult_t comm_registry_add(const struct ncclComm* comm) {
  return ptr_set_add(&g_comms, comm);
}

void comm_registry_remove(const struct ncclComm* comm) {
  ptr_set_remove(&g_comms, comm);
}

int comm_registry_has(const struct ncclComm* comm) {
  return ptr_set_has(&g_comms, comm);
}

int comm_registry_enter(struct ncclComm* comm) {
  ptr_set_lock(&g_comms); /* a remove (abort, destroy) cannot come in between */
  int found = ptr_set_has_locked(&g_comms, comm);
  if (found) atomic_fetch_add(&comm->calls, 1);
  ptr_set_unlock(&g_comms);
  return found;
}

/* ---- checks ---- */

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

void comm_conns_apply(struct ncclComm* comm, int close_them) {
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
  if (atomic_compare_exchange_strong(&comm->error, &expected, (int)err)) {
    INFO(SUB_INIT,
         "Rank %d: communicator failed (%s); shutting down its connections so peers notice",
         comm->rank, ncclGetErrorString(err));
    flight_note_error(&comm->flight, err, debug_last_error()); /* what the WARN said */
    flight_dump(&comm->flight, ncclGetErrorString(err));
  }
  comm_conns_apply(comm, 0);
}

void comm_ref(struct ncclComm* comm) {
  atomic_fetch_add(&comm->refs, 1);
}

void comm_unref(struct ncclComm* comm) {
  if (atomic_fetch_sub(&comm->refs, 1) != 1) return;
  /* the recorder goes last: a unit still queued on a host stream when the
   * comm was aborted ends its entries when the stream cancels it */
  flight_free(&comm->flight);
  pthread_mutex_destroy(&comm->turn_lock);
  pthread_cond_destroy(&comm->turn_cv);
  pthread_mutex_destroy(&comm->mailbox.lock);
  pthread_cond_destroy(&comm->mailbox.cv);
  comm->magic = 0;
  free(comm);
}
