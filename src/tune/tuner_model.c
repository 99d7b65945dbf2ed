/*
 * Building a comm's cost model from its peer table: the layout, the
 * slowest NIC and memory, how crowded the cores are, and the per-link
 * alpha/beta lines below. Every input is the same on every rank.
 */
#include "tune/tuner_model.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "hier.h"
#include "layout.h"
#include "param.h"
#include "sched_algos.h"
#include "transport_table.h"
#include "tree.h"
#include "tune/tuner_file.h"

/* alpha (us per hop) and beta (us per KB moved) as lines in f, the ranks
 * per core: ranks sharing a core wait for each other's time slices. */
struct link_line {
  double alpha0, alpha_f, beta0, beta_f;
};

/* Loopback TCP: lines fitted to perf/algo_compare.sh's medians at 4 and 8
 * ranks (f = 2, 4), clamped at f = 1 (docs/performance.md, "Measurements
 * behind the defaults", has the figures). */
static const struct link_line k_tcp[ALGO_COUNT] = {
    [ALGO_RING] = {-1.0, 9.0, -0.274, 0.466},
    [ALGO_TREE] = {7.0, 2.5, -0.44, 0.695},
    [ALGO_RD] = {-4.0, 10.75, -0.07, 0.45},
    [ALGO_HIER] = {-1.0, 9.0, -0.274, 0.466},
    /* not fitted: recursive doubling's line, whose halving it resembles */
    [ALGO_PAIRWISE] = {-4.0, 10.75, -0.07, 0.45},
};

/* Shared memory: a hop's cost and one memcpy per KB moved (the copies in
 * and out of the FIFO overlap), both growing with f; fitted to
 * perf/algo_compare.sh at 4 ranks and to make bench-shm at 2
 * (docs/performance.md, "Measurements behind the defaults"). */
static const struct link_line k_shm = {0.5, 0.6, 0.0, 0.0};
#define SHM_COPIES_PER_BYTE 1.0
/* Per KB, the tree and recursive doubling cost more than the ring over
 * shared memory (their steps wait for whole sends): measured ratios. */
static const double k_shm_beta_scale[ALGO_COUNT] = {
    [ALGO_RING] = 1.0,
    [ALGO_TREE] = 2.0,
    [ALGO_RD] = 2.5,
    [ALGO_HIER] = 1.0,
    [ALGO_PAIRWISE] = 2.5 /* not fitted: recursive doubling's */};

/* A row past the library's own (a test's) has no fitted line: it gets
 * the ring's, the plainest pattern of messages. */
static int fitted_row(int algo) {
  return algo < ALGO_COUNT ? algo : ALGO_RING;
}

static void link_from_lines(struct tuner_link* l, const struct link_line* lines, double f) {
  for (int a = 0; a < sched_algo_count(); a++) {
    const struct link_line* ln = &lines[fitted_row(a)];
    l->alpha_us[a] = MAX(0.5, ln->alpha0 + ln->alpha_f * f);
    l->beta_us_per_kb[a] = MAX(0.01, ln->beta0 + ln->beta_f * f);
  }
}

/* Shared memory: the same for every algorithm, a copy at the host's
 * measured memcpy speed per byte. */
static void link_shm(struct tuner_link* l, const struct tuner_model* m, double f, int across) {
  (void)across; /* shared memory never joins two nodes */
  double copy_us_per_kb = 1024.0 / (double)(m->mem_mbps ? m->mem_mbps : 5000); /* MB/s = B/us */
  for (int a = 0; a < sched_algo_count(); a++) {
    l->alpha_us[a] = k_shm.alpha0 + k_shm.alpha_f * f;
    l->beta_us_per_kb[a] =
        SHM_COPIES_PER_BYTE * copy_us_per_kb * f * k_shm_beta_scale[fitted_row(a)];
  }
}

/* Sockets: loopback TCP's costs; across nodes never faster than the NIC
 * (for verbs, the HCA port's rate: transport link_mbps), nor a hop quicker
 * than the network's latency where it says (a net plugin's device). */
static void link_socket(struct tuner_link* l, const struct tuner_model* m, double f, int across) {
  link_from_lines(l, k_tcp, f);
  if (!across) return;
  for (int a = 0; a < sched_algo_count(); a++) {
    l->beta_us_per_kb[a] = MAX(l->beta_us_per_kb[a], m->wire_us_per_kb);
    l->alpha_us[a] = MAX(l->alpha_us[a], m->wire_latency_us);
  }
}

/* The link costs of each kind of link a transport moves host memory over
 * (its descriptor's `link`), from the topology (ranks per core, NIC
 * speed) and measurement (memcpy). Device-only transports (cudaipc) are
 * priced by the device model (tuner_device.c): never intra_transport.
 * Verbs are priced as sockets (the NIC's rate bounds both) until measured
 * on RDMA hardware, which no machine here has. */
typedef void (*link_fill_fn)(struct tuner_link* l, const struct tuner_model* m, double f,
                             int across_nodes);
static const link_fill_fn k_link_fill[] = {
    [TRANSPORT_LINK_DEVICE] = link_socket, /* never asked: the table stages device buffers */
    [TRANSPORT_LINK_MEMORY] = link_shm,
    [TRANSPORT_LINK_NETWORK] = link_socket,
};

/* The transport that joins the ranks of every node: what each rank pairs
 * with its node's first rank through (itself included, so that a rank
 * without shared memory counts); the network when they differ. */
static const struct transport* intra_transport(const struct ncclComm* comm) {
  const struct sched_topo* t = &comm->layout;
  const struct transport* common = NULL;
  for (int r = 0; r < comm->nranks; r++) {
    int first = t->order[t->node_start[t->node_of[r]]];
    const struct transport* x = transport_select(&comm->tctx, first, r, TRANSPORT_CAP_HOST_MEM);
    if (x == NULL || (common != NULL && x != common)) return transport_network(&comm->tctx);
    common = x;
  }
  return common ? common : transport_network(&comm->tctx);
}

/* How many of position p's links in tree `which` leave its node. */
static int tree_crossings(const struct sched_topo* t, int p, int which) {
  int parent, child[2], node = t->node_of[t->order[p]], n = 0;
  tree_links(p, t->nranks, which, &parent, child);
  int links[3] = {parent, child[0], child[1]};
  for (int i = 0; i < 3; i++) n += links[i] >= 0 && t->node_of[t->order[links[i]]] != node;
  return n;
}

/* Each link leaving a node carries the buffer once each way, halved
 * between the two trees. At 8 ranks a node the levels near the leaves
 * stay inside it: the NIC carries 1.5 ranks' share, not 8. */
double tuner_tree_sharers(const struct sched_topo* t) {
  double most = 1, *per = NULL;
  if (t == NULL || t->nnodes < 2 || braid_calloc(&per, (size_t)t->nnodes, sizeof(*per)))
    return t && t->nnodes > 1 ? (double)t->max_ppn : 1; /* no memory: the bound */
  for (int p = 0; p < t->nranks; p++)
    for (int which = 0; which < 2; which++)
      per[t->node_of[t->order[p]]] += 0.5 * tree_crossings(t, p, which) / 2.0;
  for (int i = 0; i < t->nnodes; i++) most = MAX(most, per[i]);
  free(per);
  return most;
}

/* Whether a large Hier all-reduce on this comm pipelines its rounds: asked
 * of the very key the executor would build for one. */
static int hier_pipelines(const struct ncclComm* comm) {
  struct exec_args a = {.coll = COLL_ALLREDUCE,
                        .algo = ALGO_HIER,
                        .count = (size_t)64 << 20,
                        .type = ncclFloat,
                        .chunk_bytes = comm->exec.slot_bytes};
  struct sched_key k;
  exec_ctx_key(&comm->exec, &a, &k);
  return k.topo != NULL && hier_allreduce_pipelines(&k);
}

void tuner_model_price(struct tuner_model* m) {
  double f = MAX(1.0, m->oversub);
  m->wire_us_per_kb = m->nnodes > 1 && m->nic_mbps ? 8192.0 / (double)m->nic_mbps : 0;
  k_link_fill[m->intra_transport->link](&m->intra, m, f, 0);
  k_link_fill[m->net_transport->link](&m->net, m, f, 1);
  k_link_fill[m->net_transport->link](&m->net_alone, m, 1.0, 1);
}

ncclResult_t tuner_model_init(struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  struct tuner_model* m = &comm->tune;
  const struct sched_topo* t = &comm->layout;
  const char* file = param_tune_file();
  double f = 0;
  memset(m, 0, sizeof(*m));
  m->nranks = comm->nranks, m->nnodes = t->nnodes;
  m->min_ppn = t->min_ppn, m->max_ppn = t->max_ppn;
  m->tree_depth = tree_depth(comm->nranks);
  m->slot_bytes = comm->exec.slot_bytes;
  m->slices_per_step = MAX(1, comm->exec.window / 2);
  m->hier_pipelined = hier_pipelines(comm);
  m->tree_sharers = tuner_tree_sharers(t);
  m->intra_transport = intra_transport(comm);
  m->net_transport = transport_network(&comm->tctx);
  m->nic_mbps = UINT32_MAX, m->mem_mbps = UINT32_MAX;
  m->wire_latency_us = 0;
  for (int r = 0; r < comm->nranks; r++) {
    const struct peer_info* p = &comm->peers[r];
    int ppn = sched_topo_node_size(t, t->node_of[r]);
    f = MAX(f, (double)ppn / (double)MAX(1, p->ncpus));
    uint32_t nic = m->net_transport->link_mbps ? m->net_transport->link_mbps(&comm->tctx, r)
                                               : p->nic_mbps; /* the HCA's, for verbs */
    m->nic_mbps = MIN(m->nic_mbps, nic);
    if (m->net_transport->link_latency_us)
      m->wire_latency_us =
          MAX(m->wire_latency_us, m->net_transport->link_latency_us(&comm->tctx, r));
    m->mem_mbps = MIN(m->mem_mbps, p->mem_mbps);
  }
  m->oversub = f;
  tuner_model_price(m);
  if (file) CHECK(tuner_file_read(file, m));
fail:
  return res;
}
