/*
 * ncclCommGrow: a new communicator of the parent's ranks (same ranks) and
 * new ranks after them. One parent rank makes the id (ncclCommGetUniqueId:
 * a bootstrap root in its process, which the comm owns until the id is
 * used) and hands it to the new ranks its own way; in ncclCommGrow it
 * passes the id and sends it to the other parent ranks over the control
 * channel (comm_ctrl.h), which they wait for. Then all initialize the new
 * comm with it. A refused call leaves nothing behind: the id stays
 * pending, and the epoch the ranks count their grows by is unchanged.
 */
#include <string.h>

#include "bootstrap/bootstrap_root.h"
#include "comm/comm.h"
#include "comm/comm_ctrl.h"
#include "comm/comm_init.h"
#include "core.h"
#include "param.h"
#include "socket.h"

NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_call_enter(comm, "ncclCommGetUniqueId", COMM_CALL_WORKING));
  if (uniqueId == NULL) {
    WARN("ncclCommGetUniqueId : uniqueId is NULL");
    res = ncclInvalidArgument;
  } else if (comm->grow_id_pending) {
    WARN("ncclCommGetUniqueId : the previous id was not consumed by ncclCommGrow");
    res = ncclInvalidUsage;
  } else {
    res = bootstrap_new_root_id(&comm->grow_id, &comm->grow_root);
  }
  if (res == ncclSuccess) {
    comm->grow_id_pending = 1;
    *uniqueId = comm->grow_id;
  }
  comm_call_leave(comm);
fail:
  return res;
}

/* Whether `given` is this rank's pending id (NULL: another rank's). */
static ncclResult_t grow_check_id(const struct ncclComm* comm, const ncclUniqueId* given) {
  if (given == NULL ||
      (comm->grow_id_pending && memcmp(given, &comm->grow_id, sizeof(*given)) == 0))
    return ncclSuccess;
  WARN(
      "ncclCommGrow : the id is not this rank's unconsumed ncclCommGetUniqueId (other parent "
      "ranks pass NULL)");
  return ncclInvalidArgument;
}

/* A parent rank: the id from the rank that made it (sent to the others
 * when it is this one, whose root then serves on alone). */
static ncclResult_t grow_parent_id(struct ncclComm* comm, const ncclUniqueId* given,
                                   ncclUniqueId* id) {
  ncclResult_t res = ncclSuccess;
  struct ctrl_msg m;
  uint64_t epoch = ++comm->grow_epoch, deadline = socket_deadline(param_timeout_ms());
  if (given == NULL) {
    CHECK(ctrl_recv(comm, CTRL_GROW, epoch, -1, &m, deadline));
    *id = m.id;
    return ncclSuccess;
  }
  comm->grow_id_pending = 0;
  bootstrap_root_detach(comm->grow_root);
  comm->grow_root = NULL;
  *id = *given;
  CHECK(ctrl_send_id(comm, CTRL_GROW, epoch, id, NULL));
fail:
  return res;
}

/* The parent's part: checked, then the id. */
static ncclResult_t grow_from_parent(struct ncclComm* comm, int nRanks,
                                     const ncclUniqueId* uniqueId, int rank, ncclUniqueId* id) {
  ncclResult_t res = ncclSuccess;
  if (rank != -1 || nRanks <= comm->nranks)
    FAIL(ncclInvalidArgument,
         "ncclCommGrow : a parent rank passes rank -1 (got %d) and more than its %d ranks (got %d)",
         rank, comm->nranks, nRanks);
  CHECK(grow_check_id(comm, uniqueId));
  CHECK(grow_parent_id(comm, uniqueId, id));
  INFO(SUB_INIT, "Grow: rank %d of %d joins a comm of %d", comm->rank, comm->nranks, nRanks);
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId,
         int rank, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  ncclUniqueId id;
  ncclConfig_t cfg;
  if (newcomm == NULL) FAIL(ncclInvalidArgument, "ncclCommGrow : newcomm is NULL");
  *newcomm = NULL;
  if (comm == NULL) { /* a new rank */
    if (uniqueId == NULL || rank < 0 || rank >= nRanks)
      FAIL(ncclInvalidArgument,
           "ncclCommGrow : a new rank needs the id and a rank in [0,%d), got %d", nRanks, rank);
    return ncclCommInitRankConfig(newcomm, nRanks, *uniqueId, rank, config);
  }
  if (config) CHECK(comm_config_read(config, &cfg)); /* refused before anything is sent */
  CHECK(comm_call_enter(comm, "ncclCommGrow", COMM_CALL_WORKING));
  res = grow_from_parent(comm, nRanks, uniqueId, rank, &id);
  int my_rank = comm->rank;
  cfg = comm->config;
  comm_call_leave(comm); /* the parent is not touched again */
  CHECK(res);
  if (config) CHECK(comm_config_read(config, &cfg));
  res = ncclCommInitRankConfig(newcomm, nRanks, id, my_rank, &cfg);
  if (res == ncclInProgress) goto done;
  CHECK(res);
done:
fail:
  return res;
}
