/*
 * Who goes direct (cuda_direct_policy.c): the same answer on every rank,
 * from the peer table, the node's devices, the call and NCCL_ALGO.
 */
#ifndef BRAID_CUDA_DIRECT_POLICY_H_
#define BRAID_CUDA_DIRECT_POLICY_H_

#include "engine/work_op.h"

struct ncclComm;

/* Whether the unit ops[0..n) runs direct: collectives of one comm (run in
 * turn), each on device buffers (a PreMulSum too), 2..DIRECT_MAX_RANKS
 * ranks, all on this host with their devices in reach of each other
 * (compared by UUID), and NCCL_ALGO allows Direct; where NCCL_ALGO names
 * it, always, else where the tuner's device model says it is faster
 * (tuner_device.c). Every rank decides alike: the inputs are the peer
 * table, the call and NCCL_ALGO. Threads each need one comm of their own
 * (as NCCL wants without a group): their direct calls are synchronous, and
 * block until every rank made the call. */
int cuda_direct_wanted(const struct work_op* ops, int n);

/* How op runs direct (enum work_direct): WORK_DIRECT_NODE as above;
 * WORK_DIRECT_HIER, an all-reduce, reduce-scatter or all-gather on a comm
 * of several nodes of up to DIRECT_MAX_RANKS ranks each (their devices in
 * reach as above; nodes may differ in size and columns need not be evenly
 * spaced: the rows' table, algorithms/direct.h), where the
 * host would run Hier (or NCCL_ALGO names Direct): a kernel moves the
 * node's part into pinned scratch, the ranks holding this rank's index on
 * every node run the collective there on the host (a ring over the
 * network), and a second kernel writes the node's outputs
 * (algorithms/direct.h, direct_plan_hier). Also, whatever the host would
 * run, where the network between the nodes moves device memory (its stage
 * between nodes then runs on the device, cuda_hier_column_on_device): any
 * of those on such nodes, a reduce or broadcast (only so; a broadcast's
 * nodes may differ in size too), and a reduction on nodes of one rank
 * each. */
int cuda_direct_kind(const struct work_op* op);

/* Whether ranks a and b are joined, for host and device memory alike, by
 * a transport that reads and writes device memory itself (a net plugin's
 * NIC taking CUDA memory at both ends). From the peer table: every rank
 * gets the same answer for a pair. */
int cuda_pair_net_direct(const struct ncclComm* comm, int a, int b);

/* Whether Hier's stage between nodes runs on the device for `coll`
 * (algorithms/direct.h, gathered): every pair of every column that the
 * stage joins is joined as above, and the stage then moves data only (on
 * the node counts algorithms/direct.h's direct_hier_gathers names). Alike
 * on every rank. */
int cuda_hier_column_on_device(struct ncclComm* comm, int coll);

/* The comm ranks of `node`, in node order (at most DIRECT_MAX_RANKS
 * written); how many. */
int direct_node_ranks(const struct ncclComm* comm, int node, int* out);

#endif /* BRAID_CUDA_DIRECT_POLICY_H_ */
