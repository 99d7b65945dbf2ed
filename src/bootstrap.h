/*
 * Bootstrap: the unique id (root address + random secret), the root that
 * collects every rank's peer info and hands back the full table, and the
 * hello that opens every data connection.
 */
#ifndef BRAID_BOOTSTRAP_H_
#define BRAID_BOOTSTRAP_H_

#include <stdint.h>

#include "nccl.h"
#include "socket.h"

#define BOOTSTRAP_MAGIC 0x44494152u /* "RAID" little-endian: Braid id */
#define BOOTSTRAP_VERSION 2u
#define BOOTSTRAP_MAX_RANKS (1 << 20)

/* What a ncclUniqueId holds; the remaining bytes of the 128 are zero. */
struct bootstrap_id {
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  struct socket_wire_addr root;
};

/* What every rank tells every other rank at init. */
struct peer_info {
  int32_t rank;
  int32_t pid;
  uint64_t host_hash; /* hostname + boot id, or NCCL_HOSTID */
  int32_t cuda_dev;
  int32_t ncpus; /* online cores of its host (topology) */
  /* Ranks with the same host_hash and shm_domain share /dev/shm and a pid
   * namespace: the shared-memory transport can join them. */
  uint64_t shm_domain;
  uint64_t shm_tag;               /* random per rank and comm: names its shm segments */
  uint32_t nic_mbps;              /* speed of the NIC its sockets use, 0 if unknown */
  uint32_t mem_mbps;              /* its host's measured memcpy bandwidth, MB/s */
  int32_t bell_fd;                /* its progress engine's bell pipe, in its process */
  uint64_t bell_ino;              /* that pipe's inode, 0 if none */
  struct socket_wire_addr listen; /* where its data listener accepts */
};

void bootstrap_id_encode(const struct bootstrap_id* id, ncclUniqueId* out);
/* ncclInvalidArgument (with a WARN) when the bytes are not a Braid id. */
ncclResult_t bootstrap_id_decode(const ncclUniqueId* in, struct bootstrap_id* id);

/* ncclGetUniqueId: a fresh secret and a root serving it, or, with
 * NCCL_COMM_ID, that address and a secret derived from it (no root yet). */
ncclResult_t bootstrap_get_unique_id(ncclUniqueId* out);

/* A fresh secret and a root serving it, whatever NCCL_COMM_ID says (for
 * communicators made from others, e.g. by ncclCommSplit). */
ncclResult_t bootstrap_new_root_id(ncclUniqueId* out);

/* With NCCL_COMM_ID, rank 0 starts the root inside ncclCommInitRank. */
ncclResult_t bootstrap_maybe_start_root(const struct bootstrap_id* id, int rank);

/* Register with the root and receive every rank's peer info (nranks
 * entries into `all`). Bounded by `deadline_ns`. */
ncclResult_t bootstrap_exchange(const struct bootstrap_id* id, int rank, int nranks,
                                const struct peer_info* mine, struct peer_info* all,
                                uint64_t deadline_ns);

/* Random 64-bit value from the kernel. */
uint64_t bootstrap_random64(void);

/* Host identity: NCCL_HOSTID if set, else hash of hostname and boot id. */
uint64_t bootstrap_host_hash(void);

/* Shared-memory domain: boot id, /dev/shm and pid namespace. */
uint64_t bootstrap_shm_domain(void);

#endif /* BRAID_BOOTSTRAP_H_ */
