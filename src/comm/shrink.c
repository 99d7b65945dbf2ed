/*
 * ncclCommShrink: a new communicator of the parent's ranks minus an
 * excluded list, made without the excluded ranks, which may be dead. The
 * survivors keep their order; the first of them (the leader) makes a fresh
 * bootstrap id and hands it to each other survivor over the parent's
 * control channel (comm_ctrl.h), then all initialize the new comm with it.
 * NCCL_SHRINK_ABORT first revokes the parent's work in flight (the way
 * out after a failure); the default waits for it to finish.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/comm_ctrl.h"
#include "comm/comm_init.h"
#include "comm/comm_teardown.h"
#include "core.h"
#include "param.h"
#include "socket.h"
#include "engine/stream.h"

/* The exclude list as a per-rank mask: every entry a rank of the parent,
 * none twice, not the caller. */
static ncclResult_t shrink_mask(const struct ncclComm* comm, const int* list, int n,
                                unsigned char* excluded) {
  if (n < 0 || n >= comm->nranks || (n > 0 && list == NULL)) {
    WARN("ncclCommShrink : %d ranks to exclude of %d (list %p)", n, comm->nranks,
         (const void*)list);
    return ncclInvalidArgument;
  }
  for (int i = 0; i < n; i++) {
    int r = list[i];
    if (r < 0 || r >= comm->nranks || excluded[r]) {
      WARN("ncclCommShrink : excluded rank %d is out of range [0,%d) or listed twice", r,
           comm->nranks);
      return ncclInvalidArgument;
    }
    excluded[r] = 1;
  }
  if (excluded[comm->rank]) {
    WARN("ncclCommShrink : rank %d is in its own exclude list (excluded ranks do not call)",
         comm->rank);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* The leader's side: a fresh id to every other survivor. Its root serves
 * in this process until the new comm's ranks have all registered. */
static ncclResult_t shrink_send_ids(struct ncclComm* comm, const unsigned char* excluded,
                                    uint64_t epoch, ncclUniqueId* id) {
  ncclResult_t res = ncclSuccess;
  CHECK(bootstrap_new_root_id(id, NULL));
  CHECK(ctrl_send_id(comm, CTRL_SHRINK, epoch, id, excluded));
fail:
  return res;
}

/* Let the parent's work end: revoked (abort), or run to completion. */
static ncclResult_t shrink_quiesce(struct ncclComm* comm, int flags) {
  if (flags & NCCL_SHRINK_ABORT) return comm_revoke(comm);
  if (atomic_load(&comm->error) != ncclSuccess) {
    WARN("ncclCommShrink : the communicator has failed; shrink it with NCCL_SHRINK_ABORT");
    return ncclInvalidUsage;
  }
  return comm->internal_stream ? stream_sync(comm->internal_stream) : ncclSuccess;
}

/* The parent's part: the exclude list checked, the parent's work ended,
 * the new comm's id from the leader; *newrank and *cfg for the new comm. */
static ncclResult_t shrink_from_parent(struct ncclComm* comm, int* excludeRanksList,
                                       int excludeRanksCount, int shrinkFlags, int* newrank,
                                       ncclUniqueId* id) {
  ncclResult_t res = ncclSuccess;
  unsigned char* excluded = NULL;
  struct ctrl_msg m;
  int leader = -1;
  CHECK(braid_calloc(&excluded, (size_t)comm->nranks, 1));
  CHECK(shrink_mask(comm, excludeRanksList, excludeRanksCount, excluded));
  *newrank = 0;
  for (int r = 0; r < comm->nranks; r++) {
    if (excluded[r]) continue;
    if (leader < 0) leader = r;
    *newrank += r < comm->rank;
  }
  CHECK(shrink_quiesce(comm, shrinkFlags));
  uint64_t epoch = ++comm->shrink_epoch;
  INFO(SUB_INIT, "Shrink: rank %d -> rank %d of %d (%d excluded%s), leader rank %d", comm->rank,
       *newrank, comm->nranks - excludeRanksCount, excludeRanksCount,
       (shrinkFlags & NCCL_SHRINK_ABORT) ? ", parent revoked" : "", leader);
  if (comm->rank == leader) {
    CHECK(shrink_send_ids(comm, excluded, epoch, id));
  } else {
    CHECK(ctrl_recv(comm, CTRL_SHRINK, epoch, leader, &m, socket_deadline(param_timeout_ms())));
    *id = m.id;
  }
fail:
  free(excluded);
  return res;
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList,
         int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  ncclResult_t res = ncclSuccess;
  ncclUniqueId id;
  ncclConfig_t cfg;
  int newrank = 0;
  if (newcomm == NULL) FAIL(ncclInvalidArgument, "ncclCommShrink : newcomm is NULL");
  *newcomm = NULL;
  if (shrinkFlags & ~NCCL_SHRINK_ABORT)
    FAIL(ncclInvalidArgument, "ncclCommShrink : unknown flags 0x%x", shrinkFlags);
  if (config) CHECK(comm_config_read(config, &cfg)); /* refused before anything is done */
  /* a revoked comm is what a shrink is for */
  CHECK(comm_call_enter(comm, "ncclCommShrink", COMM_CALL_REVOKED_TOO));
  res = shrink_from_parent(comm, excludeRanksList, excludeRanksCount, shrinkFlags, &newrank, &id);
  int nranks = comm->nranks - excludeRanksCount;
  cfg = comm->config;
  comm_call_leave(comm); /* the parent is not touched again */
  CHECK(res);
  if (config) CHECK(comm_config_read(config, &cfg));
  res = ncclCommInitRankConfig(newcomm, nranks, id, newrank, &cfg);
  if (res == ncclInProgress) goto done;
  CHECK(res);
done:
fail:
  return res;
}
