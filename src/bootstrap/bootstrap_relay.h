/*
 * The bootstrap's fan-out: who registers with which root, and the tree
 * that carries the peer table from a root to the ranks of its block.
 *
 * Blocks. With nroots roots (ncclCommInitRankScalable's ids), root b
 * registers the contiguous ranks of block b; blocks differ in size by one
 * at most, the larger first (so every rank finds its root from nranks and
 * nroots alone).
 *
 * The tree. Inside a block of `size` ranks, by position j in the block:
 * the root sends the table to positions 0 .. fanout-1, and position j
 * relays it to fanout*(j+1) .. fanout*(j+1)+fanout-1. The depth is
 * log_fanout(size); each rank sends the table at most fanout times.
 *
 * The relay is a header and the table on a fresh connection to the
 * child's control listener. Both carry keyed hashes under the data
 * secret, which the child has straight from its root: a stranger can
 * neither pass a table off as the parent's nor hold the child up with a
 * header it could not have made.
 */
#ifndef BRAID_BOOTSTRAP_RELAY_H_
#define BRAID_BOOTSTRAP_RELAY_H_

#include <stdatomic.h>
#include <stdint.h>

#include "bootstrap/bootstrap.h"
#include "nccl.h"
#include "peer.h"

#define RELAY_MAGIC 0x594c4552u /* "RELY" */

struct relay_header {
  uint32_t magic;
  uint32_t version; /* BOOTSTRAP_VERSION */
  int32_t from;     /* the relaying rank */
  int32_t to;       /* the rank it is for */
  int32_t nranks;
  int32_t reserved;
  uint64_t table_mac; /* keyed hash of the table that follows */
  uint64_t proof;     /* keyed hash of this header, proof taken as 0 */
};

/* ---- blocks ---- */

int bootstrap_block_of(int rank, int nranks, int nroots);
int bootstrap_block_first(int block, int nranks, int nroots);
int bootstrap_block_size(int block, int nranks, int nroots);

/* ---- the tree, by position in a block ---- */

/* j's parent's position, or -1 when the root sends to j. */
int relay_parent(int j, int fanout);
/* j's first child's position (it has up to fanout, below the block size). */
int relay_first_child(int j, int fanout);

/* ---- the relay ---- */

/* Wait on ctrl_fd for `parent`'s relay of the table to `rank`, checked
 * against `secret`; connections that are not it are dropped. */
ncclResult_t bootstrap_relay_recv(int ctrl_fd, int parent, int rank, int nranks, uint64_t secret,
                                  struct peer_info* all, uint64_t deadline_ns, _Atomic int* aborted,
                                  struct bootstrap_counts* counts);

/* Relay the table from `rank` to its children in its block (first rank
 * `first`, `size` ranks). A child that cannot be reached is logged and
 * skipped: its subtree fails its init by its own timeout. */
void bootstrap_relay_send(int rank, int nranks, const struct peer_info* all, uint64_t secret,
                          int first, int size, int fanout, uint64_t deadline_ns,
                          _Atomic int* aborted, struct bootstrap_counts* counts);

#endif /* BRAID_BOOTSTRAP_RELAY_H_ */
