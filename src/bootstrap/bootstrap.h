/*
 * Bootstrap: the unique id (root address + job key), and the root that
 * collects every rank's peer info (common/peer.h) and hands back the full
 * table with the data plane's secret.
 *
 * Scale. A root sends the table (nranks x 152 bytes) to its first
 * BRAID_BOOTSTRAP_FANOUT ranks only; every rank then relays it to that
 * many ranks of its own (bootstrap_relay.h), so the root sends O(N) bytes
 * and every rank O(fanout x N), not the root O(N^2). With several ids
 * (ncclCommInitRankScalable) each root registers one block of ranks and
 * the others hand their blocks to the first root, which answers them
 * with the whole table; each then fans out to its own block.
 *
 * Two secrets. The job key authenticates a rank to the root: random in an
 * id from ncclGetUniqueId, derived from NCCL_COMM_ID and the job's
 * identity (WORLD_SIZE, the launcher's job id, BRAID_JOB_ID) when every
 * rank makes its own id. The data secret opens every data connection: the
 * root draws it at random and hands it only to the ranks it registered, so
 * it never follows from an address or an environment.
 */
#ifndef BRAID_BOOTSTRAP_H_
#define BRAID_BOOTSTRAP_H_

#include <stdatomic.h>
#include <stdint.h>

#include "nccl.h"
#include "peer.h"
#include "socket.h"

#define BOOTSTRAP_MAGIC 0x44494152u /* "RAID" little-endian: Braid id */
/* 3: job keys, the root's data secret, refusal replies; 4: blobs; 5: control addresses;
 * 7: blobs at fixed places, control messages with a proof instead of the secret;
 * 8: several roots, the table relayed down a tree */
#define BOOTSTRAP_VERSION 8u
#define BOOTSTRAP_MAX_RANKS (1 << 20)

/* What a ncclUniqueId holds; the remaining bytes of the 128 are zero. */
struct bootstrap_id {
  uint32_t magic;
  uint32_t version;
  uint64_t key; /* the job key */
  struct socket_wire_addr root;
};

/* ---- the wire between a rank and the root ---- */

/* A rank's registration, or a root's block (ROOT_HELLO_BLOCK). */
struct root_hello {
  uint32_t magic;
  uint32_t version;
  uint64_t key;
  int32_t rank; /* a block: its first rank */
  int32_t nranks;
  uint32_t flags;
  int32_t nroots;                /* the job's roots: 1, or nId of ncclCommInitRankScalable */
  int32_t root_index;            /* which root this is sent to */
  int32_t reserved;              /* zero */
  uint64_t first_key;            /* root 0's key (the one blocks go to), when nroots > 1 */
  struct socket_wire_addr first; /* root 0's address, when nroots > 1 */
  struct peer_info info;         /* a block: unused; its entries follow */
};
/* Sent by a rank 0 that could not serve NCCL_COMM_ID's address because
 * something holds it: if that is a root with our key, two jobs collide. */
#define ROOT_HELLO_COLLISION 1u
/* Sent by root b > 0 to root 0: the entries of block b follow. */
#define ROOT_HELLO_BLOCK 2u

enum root_status {
  ROOT_OK = 0,       /* the table of nranks peer_infos follows */
  ROOT_REFUSED = 1,  /* not this job's key or protocol: the rank is a stranger here */
  ROOT_CONFLICT = 2, /* this job's key, but two jobs use it, or its ranks disagree */
  ROOT_FAILED = 3    /* a rank died, or the root's own rank aborted or timed out */
};

/* The root's answer to every hello. */
struct root_reply {
  uint32_t magic;
  uint32_t status; /* enum root_status */
  uint64_t data_secret;
  int32_t nranks;
  int32_t parent; /* -1: the table follows here; else that rank relays it */
  int32_t fanout; /* the relay tree's degree (bootstrap_relay.h) */
  int32_t reserved;
};

/* What one side of the bootstrap sent and received, for the log and the
 * scaling measurements (tests/unit/test_bootstrap_scale.c). */
struct bootstrap_counts {
  uint64_t msgs_out, bytes_out;
  uint64_t msgs_in, bytes_in;
};

/* The ids a rank bootstraps with: its block's root, and root 0. */
struct bootstrap_ids {
  struct bootstrap_id mine;  /* the root this rank registers with */
  struct bootstrap_id first; /* root 0: its key names the comm (commHash) */
  int nroots;
};

struct bootstrap_root; /* the root's state (bootstrap_root.c) */

/* ---- ids ---- */

void bootstrap_id_encode(const struct bootstrap_id* id, ncclUniqueId* out);
/* ncclInvalidArgument (with a WARN) when the bytes are not a Braid id. */
ncclResult_t bootstrap_id_decode(const ncclUniqueId* in, struct bootstrap_id* id);

/* ncclGetUniqueId: a fresh key and a root serving it, or, with
 * NCCL_COMM_ID, that address and the key derived for this job (no root
 * yet: rank 0 starts it in ncclCommInitRank). */
ncclResult_t bootstrap_get_unique_id(ncclUniqueId* out);

/* A fresh key and a root serving it, whatever NCCL_COMM_ID says (for
 * communicators made from others, e.g. by ncclCommSplit). With `root`
 * (not NULL) the caller owns the root: bootstrap_root_release stops it,
 * bootstrap_root_detach lets it serve on alone. */
ncclResult_t bootstrap_new_root_id(ncclUniqueId* out, struct bootstrap_root** root);

/* The job key of NCCL_COMM_ID `comm_id` and this process's environment. */
uint64_t bootstrap_job_key(const char* comm_id);

/* With NCCL_COMM_ID, rank 0 starts the root inside ncclCommInitRank. A
 * rank 0 that finds the address taken tells whoever holds it (a root of
 * another job with our key then fails loudly too) and fails. */
ncclResult_t bootstrap_maybe_start_root(const struct bootstrap_id* id, int rank, int nranks,
                                        _Atomic int* aborted, struct bootstrap_root** out);

/* ---- a rank ---- */

/* The ids of ncclCommInitRankScalable for `rank`: its block's and the
 * first; nId ids that are all one (NCCL_COMM_ID) count as one root. */
ncclResult_t bootstrap_ids_pick(const ncclUniqueId* ids, int nids, int rank, int nranks,
                                struct bootstrap_ids* out);

/* Register with the root and receive every rank's peer info (nranks
 * entries into `all`) and the data secret, from the root or relayed by a
 * rank to `ctrl_fd` (this rank's control listener), then relay it on.
 * Bounded by `deadline_ns`; *aborted ends it early. `counts` (may be
 * NULL) gets what this rank sent and received. */
ncclResult_t bootstrap_exchange(const struct bootstrap_ids* ids, int rank, int nranks,
                                const struct peer_info* mine, struct peer_info* all,
                                uint64_t* data_secret, int ctrl_fd, uint64_t deadline_ns,
                                _Atomic int* aborted, struct bootstrap_counts* counts);

#endif /* BRAID_BOOTSTRAP_H_ */
