/*
 * ncclCommSplit: the parent's ranks all-gather (color, key); each color's
 * first rank in (key, rank) order makes a fresh bootstrap id, a second
 * all-gather hands it to the others, and each group initializes its own
 * communicator. NCCL_SPLIT_NOCOLOR ranks take part, then get NULL.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "comm/comm_init.h"
#include "comm/comm_teardown.h"
#include "core.h"
#include "engine/work.h"

struct split_entry {
  int32_t color, key;
};

/* An all-gather on the parent, run here and now whatever the parent's
 * blocking mode or the caller's group. */
static ncclResult_t split_allgather(struct ncclComm* comm, const void* send, void* recv,
                                    size_t bytes) {
  struct work_op op;
  memset(&op, 0, sizeof(op));
  op.comm = comm;
  op.kind = WORK_COLL;
  op.args.coll = COLL_ALLGATHER;
  op.args.sendbuff = send;
  op.args.recvbuff = recv;
  op.args.count = bytes;
  op.args.type = ncclUint8;
  op.args.redop.type = ncclUint8;
  ncclResult_t res = comm_flush(comm); /* what the parent still has queued goes first */
  if (res != ncclSuccess) return res;
  res = work_issue(&op, 1);
  return res == ncclSuccess ? work_run(&op, 1) : res;
}

/* Position of `rank` among the ranks sharing its color, ordered by (key,
 * rank); the group's size and its first rank. */
static void split_place(const struct split_entry* all, int n, int rank, int* newrank, int* size,
                        int* leader) {
  int color = all[rank].color;
  *newrank = *size = 0;
  *leader = -1;
  for (int q = 0; q < n; q++) {
    if (all[q].color != color) continue;
    (*size)++;
    int before = all[q].key < all[rank].key || (all[q].key == all[rank].key && q < rank);
    *newrank += before;
    int first = *leader < 0 || all[q].key < all[*leader].key;
    if (first) *leader = q;
  }
}

/* The parent's part: every rank's color and key, then each color's id
 * from its leader (zero for NCCL_SPLIT_NOCOLOR). */
static ncclResult_t split_from_parent(struct ncclComm* comm, int color, int key, int* newrank,
                                      int* size, ncclUniqueId* id) {
  ncclResult_t res = ncclSuccess;
  struct split_entry* all = NULL;
  ncclUniqueId *ids = NULL, mine;
  int leader;
  CHECK(braid_calloc(&all, (size_t)comm->nranks, sizeof(*all)));
  CHECK(braid_calloc(&ids, (size_t)comm->nranks, sizeof(*ids)));
  struct split_entry me = {color, key};
  CHECK(split_allgather(comm, &me, all, sizeof(me)));
  split_place(all, comm->nranks, comm->rank, newrank, size, &leader);
  memset(&mine, 0, sizeof(mine));
  if (color != NCCL_SPLIT_NOCOLOR && leader == comm->rank)
    CHECK(bootstrap_new_root_id(&mine, NULL));
  CHECK(split_allgather(comm, &mine, ids, sizeof(mine)));
  *id = ids[leader];
  INFO(SUB_INIT, "Split: rank %d color %d key %d -> rank %d of %d", comm->rank, color, key,
       *newrank, *size);
fail:
  free(all);
  free(ids);
  return res;
}

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
         ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  ncclUniqueId id;
  ncclConfig_t cfg;
  int newrank, size;
  if (newcomm == NULL) FAIL(ncclInvalidArgument, "ncclCommSplit : newcomm is NULL");
  *newcomm = NULL;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    FAIL(ncclInvalidArgument, "ncclCommSplit : invalid color %d", color);
  if (config) CHECK(comm_config_read(config, &cfg)); /* refused before the parent is asked */
  CHECK(comm_call_enter(comm, "ncclCommSplit", COMM_CALL_WORKING));
  res = split_from_parent(comm, color, key, &newrank, &size, &id);
  cfg = comm->config;
  comm_call_leave(comm); /* the parent is not touched again */
  CHECK(res);
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  if (config) CHECK(comm_config_read(config, &cfg));
  res = ncclCommInitRankConfig(newcomm, size, id, newrank, &cfg);
  if (res == ncclInProgress) goto done;
  CHECK(res);
done:
fail:
  return res;
}
