/*
 * The direct algorithm's links and messages (cuda_direct_exchange.c): the
 * messages on a link, the comm's direct state, and the exchange's calls.
 * The algorithm is three files: cuda_direct_policy.c decides who goes
 * direct, cuda_direct_exchange.c makes the links and moves the messages
 * (buffers, "done", "fail"), cuda_direct.c runs a call (cuda_direct.h).
 */
#ifndef BRAID_CUDA_DIRECT_EXCHANGE_H_
#define BRAID_CUDA_DIRECT_EXCHANGE_H_

#include <cuda.h>

#include "cuda/cudaipc_mem.h"
#include "direct.h"
#include "cuda_direct_policy.h"
#include "transport.h"

struct ncclComm;

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
  int nlocal;                         /* the ranks of this node */
  int local[DIRECT_MAX_RANKS];        /* their comm ranks, in node order */
  int me_local;                       /* this rank's index among them */
  int* column;                        /* Hier: per node, the rank there with this rank's index */
  struct direct_scratch* scratch;     /* Hier's, pinned */
  struct direct_scratch* dev_scratch; /* Hier's, on the device (gathered) */
  struct direct_scratch* premul;      /* a PreMulSum's input times its scalar, on the device */
  int* links;                         /* per peer of this node, else -1 (and for this rank) */
  int* same_process;                  /* per peer: its pointers are ours to use, no IPC */
  uint64_t* heard;                    /* per peer: the last call it said "done" or "fail" in */
  int any_remote;                     /* some peer is in another process */
  struct transport_device* tdev;      /* the comm's: its cache maps the peers' buffers */
  CUstream stream;                    /* synchronous calls' kernels */
  uint64_t seq;
  struct transport_tag call; /* this call, as every peer must have made it */
  size_t extent[2];          /* bytes of each buffer (DIRECT_SEND, DIRECT_RECV) the call touches */
  int exposed;               /* this call's buffers went to every peer: they may use them */
  int broken;                /* a call failed: the links are out of step */
};

/* Buffers of the node's ranks by node index, as tasks name them. */
typedef char* direct_bufs[DIRECT_MAX_RANKS][DIRECT_NBUFS];

/* The comm's direct state, made (links, layout) at its first direct call. */
ncclResult_t direct_get(struct ncclComm* comm, struct cuda_direct** out);
/* This rank's buffers to its node's peers, and theirs mapped into bufs. */
ncclResult_t direct_buffers_exchange(struct ncclComm* comm, struct cuda_direct* d, const void* send,
                                     void* recv, direct_bufs bufs);
/* "done" to every peer of the node, then theirs. */
ncclResult_t direct_done_exchange(struct ncclComm* comm, struct cuda_direct* d);
/* A failed call: "fail" to the peers (best effort), and, where they had
 * this rank's buffers, wait for their last word of the call. */
void direct_tell_failure(struct ncclComm* comm, struct cuda_direct* d);
void direct_drain_peers(struct ncclComm* comm, struct cuda_direct* d);

/* Close the links and (once every stream passed what was queued on it:
 * streams_passed) free Hier's pinned scratch; in the comm's context (the
 * mappings are the comm's cache's, cuda_comm.c frees them). */
void cuda_direct_free(struct cuda_direct* d, int streams_passed);

#endif /* BRAID_CUDA_DIRECT_EXCHANGE_H_ */
