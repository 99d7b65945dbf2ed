/*
 * Host executor: runs one schedule at a time per comm on host memory with a
 * window of steps in flight, staging slots for received partials, and the
 * CPU kernels for every reduction.
 */
#ifndef BRAID_EXECUTOR_H_
#define BRAID_EXECUTOR_H_

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "nccl.h"
#include "schedule.h"
#include "transport.h"

#define EXEC_MAX_WINDOW 32

/* A call runs as pieces of at most this many chunks of data (all ranks'
 * blocks together), so a schedule's length is bounded whatever the count:
 * a piece's pipeline drains only once per 8192 chunks. */
#define EXEC_PIECE_CHUNKS 8192

/* One collective call as the executor sees it. `count` is the per-rank
 * block for all-gather and reduce-scatter, else the whole buffer; `stride`
 * (0: count) spaces the blocks of all-gather / reduce-scatter. */
struct exec_args {
  int coll; /* enum sched_coll */
  int root;
  const void* sendbuff;
  void* recvbuff;
  size_t count;
  size_t stride;
  ncclDataType_t type;
  struct kern_redop redop;
  unsigned pre;  /* KERN_PRE when every input read is pre-multiplied */
  unsigned post; /* KERN_POST when every final result is divided */
  int algo;      /* enum sched_algo, from exec_plan */
  size_t chunk_bytes;
};

/* Runtime record of one in-flight step. */
struct exec_rec {
  int slot;          /* staging slot, -1 if none */
  uint64_t recv_seq; /* message number on the receive connection */
  uint64_t send_seq; /* message number on the send connection */
};

struct exec_state {
  /* slots: fixed at init, reused by every call */
  char* slot_mem;
  size_t slot_bytes;
  int nslots;
  int free_slots[EXEC_MAX_WINDOW];
  int nfree;
  int window;
  /* the running call, and the piece of it that runs now (args) */
  int busy;
  struct exec_args call;
  struct transport_tag tag; /* the call, as every message of it carries it */
  struct exec_args args;
  size_t piece;     /* elements per block in every piece but the last */
  size_t piece_off; /* where in each block the running piece starts */
  size_t next_post, next_compute, retired;
  int carry; /* slot a reduce-carry step left for the next step, -1 if none */
  struct exec_rec recs[EXEC_MAX_WINDOW];
  uint64_t last_progress_ns;
};

struct ncclComm;

ncclResult_t exec_init(struct exec_state* ex, int window, size_t slot_bytes);
void exec_free(struct exec_state* ex);

/* The schedule key of a call whose algorithm and chunk are chosen. */
void exec_key(const struct ncclComm* comm, const struct exec_args* args, struct sched_key* key);
/* Let the tuner choose the algorithm and chunk of a call; fills `key` with
 * the schedule it will run. */
void exec_plan(struct ncclComm* comm, struct exec_args* args, struct sched_key* key);

/* The tag every message of a planned call carries (exec_tag.c), and the
 * WARN naming both calls when a peer's message carried another. */
void exec_tag_make(const struct ncclComm* comm, const struct exec_args* args,
                   struct transport_tag* out);
void exec_tag_report(const struct ncclComm* comm, const struct transport_tag* mine);

/* Begin a planned call on `comm` (its executor must be idle). */
ncclResult_t exec_start(struct ncclComm* comm, const struct exec_args* args);
/* Advance without blocking; *done when finished, *progressed when anything
 * moved. On error the comm is put in its error state. */
ncclResult_t exec_progress(struct ncclComm* comm, int* done, int* progressed);

#endif /* BRAID_EXECUTOR_H_ */
