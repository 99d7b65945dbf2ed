/*
 * Who goes direct (cuda_direct.h: cuda_direct_wanted, cuda_direct_kind).
 */
#include "cuda_direct_policy.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core.h"
#include "cuda_comm.h"
#include "direct.h"
#include "layout.h"
#include "transport_table.h"
#include "tune/tuner.h"
#include "tune/tuner_device.h"

/* ---- Who goes direct ---- */

/* Every rank must decide alike, or some would wait for links the others
 * never use: so the decision rests on the peer table, the node's devices,
 * the call and NCCL_ALGO only, never on this rank's gates or streams. */

static int peer_device(const struct ncclComm* comm, int p) {
  return comm->peers[p].cuda_dev < 0 ? 0 : comm->peers[p].cuda_dev;
}

/* Whether each of the n ranks' devices can read every other's (peer
 * access). */
static int devices_reach(const struct ncclComm* comm, const int* ranks, int n) {
  const struct cuda_api* cu = cuda_driver();
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      CUdevice x, y;
      int can = 0, da = peer_device(comm, ranks[i]), db = peer_device(comm, ranks[j]);
      if (da == db) continue;
      if (cu->cuDeviceGet(&x, da) != CUDA_SUCCESS || cu->cuDeviceGet(&y, db) != CUDA_SUCCESS ||
          cu->cuDeviceCanAccessPeer(&can, x, y) != CUDA_SUCCESS || !can)
        return 0;
    }
  return 1;
}

/* The n ranks (2..DIRECT_MAX_RANKS) are on one host, their devices in
 * reach; *per_device gets the most of them sharing one device. Devices
 * are told apart by UUID; ordinals (for the reach check) mean the same
 * device in every rank only where their processes see the same devices in
 * the same order: else direct needs the ranks on one device. */
static int ranks_direct_shape(const struct ncclComm* comm, const int* ranks, int n,
                              int* per_device) {
  const struct peer_info* first = &comm->peers[ranks[0]];
  int one_view = 1, one_device = 1;
  if (n < 2 || n > DIRECT_MAX_RANKS) return 0;
  *per_device = 1;
  for (int i = 0; i < n; i++) {
    const struct peer_info* q = &comm->peers[ranks[i]];
    int same = 0;
    if (q->host_hash != first->host_hash || q->cuda_uuid == 0) return 0;
    one_view &= q->cuda_view == first->cuda_view;
    one_device &= q->cuda_uuid == first->cuda_uuid;
    for (int j = 0; j < n; j++) same += comm->peers[ranks[j]].cuda_uuid == q->cuda_uuid;
    *per_device = MAX(*per_device, same);
  }
  return one_device || (one_view && devices_reach(comm, ranks, n));
}

/* The comm's ranks on `node`, in node order (at most DIRECT_MAX_RANKS
 * written); returns how many it has. */
int direct_node_ranks(const struct ncclComm* comm, int node, int* out) {
  const struct sched_topo* t = &comm->layout;
  int n = sched_topo_node_size(t, node);
  for (int j = 0; j < n && j < DIRECT_MAX_RANKS; j++) out[j] = t->order[t->node_start[node] + j];
  return n;
}

/* Every rank of the comm on this host, their devices in reach. */
static int comm_direct_shape(const struct ncclComm* comm, int* per_device) {
  int ranks[DIRECT_MAX_RANKS];
  if (comm->nranks > DIRECT_MAX_RANKS || cuda_comm_shares_process(comm) < 0)
    return 0; /* too many, or the peers are not known yet: a non-blocking init still running */
  for (int r = 0; r < comm->nranks; r++) ranks[r] = r;
  return ranks_direct_shape(comm, ranks, comm->nranks, per_device);
}

/* A node's ranks fit for direct: one rank on a device, or several whose
 * devices reach each other. */
static int node_direct_shape(const struct ncclComm* comm, int node) {
  int ranks[DIRECT_MAX_RANKS], per_device, n = direct_node_ranks(comm, node, ranks);
  if (n == 1) return comm->peers[ranks[0]].cuda_uuid != 0;
  return ranks_direct_shape(comm, ranks, n, &per_device);
}

/* Several nodes, one with two ranks or more and none with more than
 * DIRECT_MAX_RANKS, each one's ranks fit for direct. Nodes may differ in
 * size (the columns are the smallest node's indexes, a reduce-scatter's
 * and all-gather's with rows to spare: algorithms/direct.h). */
static int comm_hier_shape(const struct ncclComm* comm) {
  const struct sched_topo* t = &comm->layout;
  int* known = &comm->device->hier_shape;
  if (*known != 0) return *known > 0;
  if (cuda_comm_shares_process(comm) < 0) return 0; /* the peers not known yet: ask again */
  *known = -1;
  if (t->nnodes < 2 || t->max_ppn < 2 || t->max_ppn > DIRECT_MAX_RANKS) return 0;
  for (int node = 0; node < t->nnodes; node++)
    if (!node_direct_shape(comm, node)) return 0;
  *known = 1;
  return 1;
}

/* The buffer size the tuner models (the larger of the two, as for host
 * calls). */
static size_t op_bytes(const struct work_op* op) {
  const struct exec_args* a = &op->args;
  size_t bytes = a->count * kern_type_size(a->type);
  if (a->coll == COLL_ALLGATHER || a->coll == COLL_REDUCESCATTER) bytes *= (size_t)op->comm->nranks;
  return bytes;
}

int cuda_pair_net_direct(const struct ncclComm* comm, int a, int b) {
  const struct transport* t = transport_select(&comm->tctx, a, b, TRANSPORT_CAP_DEVICE_MEM);
  return t != NULL && !(t->caps & TRANSPORT_CAP_DEVICE_COPY) &&
         transport_select(&comm->tctx, a, b, TRANSPORT_CAP_HOST_MEM) == t;
}

/* Whether the ranks of index `local` on nodes i and j are joined by such
 * a network. */
static int column_pair_direct(const struct ncclComm* comm, int local, int i, int j) {
  const struct sched_topo* t = &comm->layout;
  return cuda_pair_net_direct(comm, t->order[t->node_start[i] + local],
                              t->order[t->node_start[j] + local]);
}

/* Whether every pair of every column that a gathered stage of `coll`
 * joins (algorithms/direct.h, direct_stage_partners: what
 * src/engine/connect.c connects) is joined by such a network: about
 * columns x nnodes log2(nnodes) questions to the transport table, asked
 * once per comm for the ring's partners (all-gather, broadcast) and once
 * for the reductions' (the peer table does not change; the callers ask
 * only once it is known). Every column, not only this rank's: the answer
 * decides whether the node's ranks run the call together, so every rank
 * must get the same one (each pair's answer comes from the peer table),
 * even where the ranks of a node reach the network through different
 * NICs. */
static int column_net_direct(struct ncclComm* comm, int coll) {
  const struct sched_topo* t = &comm->layout;
  int n = t->nnodes, ok = 1, nodes[DIRECT_MAX_PARTNERS];
  int ring = coll == COLL_ALLGATHER || coll == COLL_BROADCAST; /* the same partners */
  int* known = ring ? &comm->device->column_direct : &comm->device->stages_direct;
  if (*known != 0) return *known > 0;
  for (int i = 0; i < n && ok; i++) {
    int k = direct_stage_partners(coll, n, i, nodes);
    for (int local = 0; local < t->min_ppn && ok; local++)
      for (int j = 0; j < k && ok; j++) ok = column_pair_direct(comm, local, i, nodes[j]);
  }
  *known = ok ? 1 : -1;
  return ok;
}

int cuda_hier_column_on_device(struct ncclComm* comm, int coll) {
  return direct_hier_gathers(coll, comm->layout.nnodes) && column_net_direct(comm, coll);
}

static int hier_fits(const struct work_op* op) {
  switch (op->args.coll) {
    case COLL_ALLREDUCE:
      return comm_hier_shape(op->comm);
    case COLL_REDUCE: /* only with the stage between nodes on the device */
      return comm_hier_shape(op->comm) && cuda_hier_column_on_device(op->comm, COLL_REDUCE);
    case COLL_BROADCAST: /* only with the stage between nodes on the device */
      return comm_hier_shape(op->comm) && cuda_hier_column_on_device(op->comm, COLL_BROADCAST);
    case COLL_REDUCESCATTER: /* rows named by the comm's table, any layout */
    case COLL_ALLGATHER:
      return comm_hier_shape(op->comm) && op->comm->device->hier_rows != NULL;
    default:
      return 0;
  }
}

/* Whether NCCL_ALGO lets Hier with direct node stages run: it names
 * Direct (whose form across nodes it is), or leaves Hier to the tuner
 * (not "^Hier"). */
static int hier_allowed(void) {
  return tuner_forces_direct() || (tuner_allowed() & (1u << ALGO_HIER)) != 0;
}

/* One rank a node on nodes that a network moving device memory joins
 * (direct_hier_gathers): Hier's node stages are a
 * copy in and a reduction out, the stage between them swaps of device
 * memory (gathered), which beats staging the call through host memory
 * whatever the host would run. */
static int hier_one_per_node(const struct work_op* op) {
  const struct sched_topo* t = &op->comm->layout;
  int coll = op->args.coll;
  return sched_coll_reduces(coll) && hier_allowed() && t->nnodes >= 2 && t->max_ppn == 1 &&
         cuda_comm_shares_process(op->comm) >= 0 && cuda_hier_column_on_device(op->comm, coll);
}

/* Where the host would run Hier (or NCCL_ALGO names Direct): the node's
 * stages then run on the devices instead of through host memory. A call
 * whose stage between nodes moves device memory over the network takes
 * Hier whatever the host would run, as a reduction on one rank a node
 * does (hier_one_per_node; there an all-gather or broadcast goes to the
 * network as it is, cuda_unit.c's op_net_direct). Ordered on
 * its stream, anything else copies the whole call through host memory (a
 * reduction's kernel the proxy launched could wait behind the stream, and
 * a node's other ranks take their copies from the proxy too), and the
 * plugin would carry host memory. */
static int hier_wanted(const struct work_op* op) {
  int algo = ALGO_RING, coll = op->args.coll;
  if (hier_one_per_node(op)) return 1;
  if (!hier_allowed() || !hier_fits(op)) return 0;
  if (coll == COLL_REDUCE || coll == COLL_BROADCAST)
    return 1; /* the host has no Hier reduce or broadcast to weigh it with */
  if (tuner_forces_direct()) return 1;
  if (cuda_hier_column_on_device(op->comm, coll)) return 1;
  tuner_host_best(op->comm, coll, op_bytes(op), &algo);
  return algo == ALGO_HIER;
}

/* Whether the nodes cut the canonical tree over the ranks into subtrees:
 * a power of two of nodes, each of the same power of two of ranks, node j
 * holding ranks j k .. j k + k - 1 in its order. */
static int layout_cuts_tree(const struct sched_topo* t, int nranks) {
  int k = t->max_ppn;
  if (t->min_ppn != k || !braid_pow2(k) || !braid_pow2(t->nnodes) || t->nnodes < 2) return 0;
  for (int r = 0; r < nranks; r++)
    if (t->node_of[r] != r / k || t->local_of[r] != r % k) return 0;
  return 1;
}

/* Whether Hier's direct plan computes the deterministic mode's tree here
 * (algorithms/direct.h, `canonical`): the layout cuts the tree, and the
 * stage between nodes moves device memory (gathered: it only moves data,
 * and its halving is relabelled into the tree's order). The layout and
 * the peer table are the same on every rank, so every rank decides
 * alike. */
static int comm_hier_canonical(struct ncclComm* comm, int coll) {
  int* known = &comm->device->hier_canonical; /* the layout is fixed: asked once */
  if (*known == 0 && cuda_comm_shares_process(comm) < 0) return 0; /* not known yet: ask again */
  if (*known == 0) *known = layout_cuts_tree(&comm->layout, comm->nranks) ? 1 : -1;
  return *known > 0 && cuda_hier_column_on_device(comm, coll);
}

/* Device buffers where this rank uses them. */
static int op_on_devices(const struct work_op* op) {
  const struct exec_args* a = &op->args;
  int reads = sched_coll_reads_send(a->coll, op->comm->rank, a->root);
  int writes = sched_coll_writes_recv(a->coll, op->comm->rank, a->root);
  return (!reads || mem_query(a->sendbuff) == MEM_DEVICE) &&
         (!writes || mem_query(a->recvbuff) == MEM_DEVICE);
}

int cuda_direct_kind(const struct work_op* op) {
  const struct exec_args* a = &op->args;
  int per_device = 1;
  if (op->kind != WORK_COLL || a->mem != MEM_DEVICE || !tuner_allows_direct() || !op_on_devices(op))
    return WORK_DIRECT_NONE;
  /* on one node the task's sources are the ranks in rank order, which it
   * combines in the deterministic mode's tree where asked (direct.h) */
  if (comm_direct_shape(op->comm, &per_device))
    return tuner_forces_direct() ||
                   tuner_prefers_direct(op->comm, a->coll, op_bytes(op), per_device)
               ? WORK_DIRECT_NODE
               : WORK_DIRECT_NONE;
  if (a->canonical && sched_coll_reduces(a->coll) && !comm_hier_canonical(op->comm, a->coll))
    return WORK_DIRECT_NONE; /* the nodes do not cut the canonical tree: staged, Pairwise */
  return hier_wanted(op) ? WORK_DIRECT_HIER : WORK_DIRECT_NONE;
}

int cuda_direct_wanted(const struct work_op* ops, int n) {
  for (int i = 0; i < n; i++)
    if (ops[i].comm != ops[0].comm || cuda_direct_kind(&ops[i]) == WORK_DIRECT_NONE) return 0;
  return n > 0;
}
