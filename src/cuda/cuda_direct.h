/*
 * The direct algorithm (algorithms/direct.h) on device buffers, for a comm
 * whose ranks all live on this node, as processes or threads. At each
 * call the ranks describe their buffers to each other over Unix-socket
 * links (to another process, a cuMem allocation's fd beside its
 * description, transports/cudaipc; a thread's pointer is used as it is),
 * map the other processes' through the comm's IPC cache, run
 * their one fused task as a kernel on the comm's internal stream, and tell
 * each other they are done: no rank returns while a peer may still read
 * its input or write its output. Each input byte is read once and each
 * output byte written once, device to device.
 *
 * Synchronous: the unit's streams were synchronized first (cuda_unit.c),
 * and the call blocks until every rank's task is done, a peer fails (its
 * link closes), BRAID_TIMEOUT_MS passes, or the comm is aborted.
 */
#ifndef BRAID_CUDA_DIRECT_H_
#define BRAID_CUDA_DIRECT_H_

#include "work.h"

struct cuda_direct;

/* Whether the unit ops[0..n) runs direct: collectives of one comm (each
 * runs in turn, blocking), each on device buffers (not a PreMulSum),
 * 2..DIRECT_MAX_RANKS ranks, all on this host with their devices in reach
 * of each other, and NCCL_ALGO allows Direct; by default only where every
 * rank is a thread of one process (whose calls are synchronous anyway),
 * everywhere when NCCL_ALGO names Direct. Every rank decides alike. Threads
 * each need one comm of their own (as NCCL wants without a group): a
 * direct call blocks its thread until every rank made the call. */
int cuda_direct_wanted(const struct work_op* ops, int n);

/* Run op's collective direct. */
ncclResult_t cuda_direct_run(struct work_op* op);

/* Close the links and unmap what the cache holds (in the comm's context). */
void cuda_direct_free(struct cuda_direct* d);

#endif /* BRAID_CUDA_DIRECT_H_ */
