/*
 * The peer table: what every rank tells every other rank about itself at
 * init (the bootstrap carries it; transports read their slice of it).
 */
#ifndef BRAID_PEER_H_
#define BRAID_PEER_H_

#include <stdint.h>

#include "socket.h"

/* What every rank tells every other rank at init. The transports' blobs
 * take 112 bytes today (transport_blobs_make's records: an 8-byte header
 * each, the bytes padded to 8; a transport a comm does not use leaves its
 * blob zeros); the rest is room for another's. */
#define PEER_BLOB_BYTES 128

struct peer_info {
  int32_t rank;
  int32_t pid;
  uint64_t host_hash; /* hostname + boot id, or NCCL_HOSTID */
  int32_t cuda_dev;
  int32_t ncpus;                /* online cores of its host (topology) */
  uint64_t cuda_uuid;           /* its device's UUID, hashed (0: none) */
  uint64_t cuda_view;           /* the UUIDs its process sees, in order, hashed */
  uint32_t nic_mbps;            /* speed of the NIC its sockets use, 0 if unknown */
  uint32_t mem_mbps;            /* its host's measured memcpy bandwidth, MB/s */
  int16_t bound_l2, bound_l3;   /* the L2 and L3 it is bound inside (topo_bind.h), -1: none */
  int32_t bell_fd;              /* its progress engine's bell pipe, in its process */
  uint64_t bell_ino;            /* that pipe's inode, 0 if none */
  struct socket_wire_addr ctrl; /* its comm's control listener (comm_ctrl.h) */
  /* What each transport publishes about this rank (where it listens, what
   * names its segments), opaque here: a record per transport of the rank's
   * build (transports/transport_table.c), carried by the root's exchange. */
  uint8_t blobs[PEER_BLOB_BYTES];
};

#endif /* BRAID_PEER_H_ */
