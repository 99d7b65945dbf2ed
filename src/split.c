/*
 * ncclCommSplit: the parent's ranks all-gather (color, key); each color's
 * first rank in (key, rank) order makes a fresh bootstrap id, a second
 * all-gather hands it to the others, and each group initializes its own
 * communicator. NCCL_SPLIT_NOCOLOR ranks take part, then get NULL.
 */
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "core.h"
#include "work.h"

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
  if (comm->internal_stream) {
    ncclResult_t res = ncclCommFinalize(comm); /* drain what the parent still has queued */
    comm->finalized = 0;
    if (res != ncclSuccess) return res;
  }
  ncclResult_t res = work_issue(&op, 1);
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

NCCL_API(ncclResult_t, ncclCommSplit, ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
         ncclConfig_t* config);
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  ncclResult_t res = ncclSuccess;
  struct split_entry* all = NULL;
  ncclUniqueId *ids = NULL, mine;
  int newrank, size, leader;
  CHECK(comm_check(comm, "ncclCommSplit"));
  if (newcomm == NULL) FAIL(ncclInvalidArgument, "ncclCommSplit : newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    FAIL(ncclInvalidArgument, "ncclCommSplit : invalid color %d", color);
  *newcomm = NULL;
  CHECK(braid_calloc(&all, (size_t)comm->nranks, sizeof(*all)));
  CHECK(braid_calloc(&ids, (size_t)comm->nranks, sizeof(*ids)));
  struct split_entry me = {color, key};
  CHECK(split_allgather(comm, &me, all, sizeof(me)));
  split_place(all, comm->nranks, comm->rank, &newrank, &size, &leader);
  memset(&mine, 0, sizeof(mine));
  if (color != NCCL_SPLIT_NOCOLOR && leader == comm->rank) CHECK(bootstrap_new_root_id(&mine));
  CHECK(split_allgather(comm, &mine, ids, sizeof(mine)));
  if (color != NCCL_SPLIT_NOCOLOR) {
    ncclConfig_t cfg = comm->config;
    if (config) CHECK(comm_config_read(config, &cfg));
    INFO(SUB_INIT, "Split: rank %d color %d key %d -> rank %d of %d", comm->rank, color, key,
         newrank, size);
    res = ncclCommInitRankConfig(newcomm, size, ids[leader], newrank, &cfg);
    if (res == ncclInProgress) goto done;
    CHECK(res);
  }
done:
fail:
  free(all);
  free(ids);
  return res;
}
