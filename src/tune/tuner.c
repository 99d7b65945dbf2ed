/*
 * Tuner: picks the algorithm and pipeline chunk per call from a cost model
 * of this comm's topology,
 *   time = sum over phases of hops * alpha(link) + bytes(link) * beta(link),
 * where a link is shared memory inside a node or the network between
 * nodes (or loopback TCP when shared memory is off). Every input is agreed
 * by all ranks (it comes from the peer table), so all ranks choose alike.
 * NCCL_ALGO restricts the choice with NCCL's syntax ("Ring,Hier",
 * "^Tree"; Pairwise only where it is named). In the deterministic mode a
 * reduction always runs Pairwise, the one algorithm whose order of
 * combining is the canonical one, whatever NCCL_ALGO says. BRAID_TUNE_FILE overrides model
 * parameters and forces choices for size ranges (format in tuner_file.c). NCCL_DEBUG_SUBSYS=TUNING
 * prints the table at init and every choice.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "comm/comm.h"
#include "core.h"
#include "hier.h"
#include "pairwise.h"
#include "param.h"
#include "recursive_doubling.h"
#include "sched_build.h"
#include "tune/tuner.h"
#include "tune/tuner_file.h"
#include "sched_algos.h"

static int algo_named(const char* list, const char* name) {
  size_t len = strlen(name);
  for (const char* p = list; *p;) {
    size_t n = strcspn(p, ",");
    if (n == len && strncasecmp(p, name, len) == 0) return 1;
    p += n + (p[n] == ',');
  }
  return 0;
}

unsigned tuner_parse_algos(const char* s) {
  unsigned all = (1u << sched_algo_count()) - 1, named = 0;
  if (s == NULL || *s == '\0') return all;
  int exclude = s[0] == '^';
  for (int a = 0; a < sched_algo_count(); a++)
    if (algo_named(s + exclude, sched_algo_name(a))) named |= 1u << a;
  return exclude ? all & ~named : named;
}

int tuner_allows_direct(void) {
  const char* s = param_algo();
  if (s == NULL || *s == '\0') return 1;
  return (s[0] == '^') != algo_named(s + (s[0] == '^'), "Direct");
}

int tuner_forces_direct(void) {
  const char* s = param_algo();
  return s && *s && s[0] != '^' && algo_named(s, "Direct");
}

/* Bit mask of algorithms NCCL_ALGO allows (the library's own but Pairwise
 * when unset: outside the deterministic mode it runs only where it is
 * named, as does a test's row). */
unsigned tuner_allowed(void) {
  static _Atomic int cached = -1;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v >= 0) return (unsigned)v;
  const char* s = param_algo();
  unsigned mask = tuner_parse_algos(s), classic = ((1u << ALGO_COUNT) - 1) & ~(1u << ALGO_PAIRWISE);
  if (s == NULL || *s == '\0' || s[0] == '^') mask &= classic;
  if (mask == 0 && !tuner_allows_direct()) {
    char names[128];
    int at = 0;
    for (int a = 0; a < sched_algo_count() && at < (int)sizeof(names); a++) /* the table */
      at += snprintf(names + at, sizeof(names) - (size_t)at, "%s, ", sched_algo_name(a));
    WARN("NCCL_ALGO=%s names no algorithm (%sDirect); using all", s, names);
    mask = classic;
  }
  atomic_store_explicit(&cached, (int)mask, memory_order_relaxed);
  return mask;
}

/* --- the model --- */

static double link_time(const struct tuner_link* l, int algo, double hops, double kb) {
  return hops * l->alpha_us[algo] + kb * l->beta_us_per_kb[algo];
}

/* The link a flat algorithm's slowest step crosses. */
static const struct tuner_link* flat_link(const struct tuner_model* m) {
  return m->nnodes > 1 ? &m->net : &m->intra;
}

static int log2_ceil(int n) {
  int r = 0;
  while ((1 << r) < n) r++;
  return r;
}

/* Rounds of recursive doubling's power-of-two core over n ranks: log2 of
 * the power of two below n. */
static int rd_core_rounds(int n) {
  int r = 0;
  while ((2 << r) <= n) r++;
  return r;
}

/* All its rounds: the core's plus the fold-in and hand-back when n is not
 * a power of two. */
static int rd_rounds(int n) {
  int core = rd_core_rounds(n);
  return core + ((1 << core) != n ? 2 : 0);
}

/* The ring visits ranks node by node: of every max_ppn hops one crosses
 * the network and the rest stay in a node, where a hop costs the intra
 * link's (braid-sim: all hops at the network's priced an 8 B all-reduce
 * over 8 nodes of 8 ranks at 2.8x its time). The time is the longer of
 * two: a block's journey round the ring, its first slice at each hop's
 * own link and the slices behind it at the network's pace, and the time
 * the rank feeding the NIC takes to push its bytes (braid-sim: the
 * network's rate on every hop priced 2 MiB over 1,024 nodes of 2 at
 * 1.3x its time; the journey alone, 2 MiB over 8 nodes of 8 at 0.2x).
 * `step_kb`: what one step moves. */
static double ring_time(const struct tuner_model* m, double hops, double kb, double step_kb,
                        double slot_kb) {
  const struct tuner_link *l = flat_link(m), *in = &m->intra;
  if (m->nnodes < 2) return link_time(l, ALGO_RING, hops, kb);
  double net_hops = hops / MAX(1, m->max_ppn), in_hops = hops - net_hops;
  double slice = MIN(step_kb, slot_kb), net_beta = l->beta_us_per_kb[ALGO_RING];
  double journey = net_hops * (l->alpha_us[ALGO_RING] + slice * net_beta) +
                   in_hops * (in->alpha_us[ALGO_RING] + slice * in->beta_us_per_kb[ALGO_RING]) +
                   MAX(0.0, kb - hops * slice) * net_beta;
  return MAX(journey, link_time(l, ALGO_RING, net_hops, kb));
}

/* What a rank spends reducing `kb` beside moving it, where the model
 * prices that apart from its links (tuner_types.h). */
static double reduce_time(const struct tuner_model* m, double kb) {
  return kb * m->reduce_us_per_kb;
}

/* A ring's reductions beside its transfers, over `steps` steps of
 * `step_kb` each on a link of `beta` per KB: a step's slices go through
 * the link and then the reduction, a pipeline of two stages, so the slower
 * sets the pace and one slice of the faster is not hidden; a step of one
 * slice reduces once it has all come (braid-sim: adding every reduction
 * to the transfers priced a 16 MiB ring over 8 nodes of 8 at 1.16x its
 * time, hiding all of them a 2 MiB one at 0.8x). */
static double ring_reduce_time(const struct tuner_model* m, double steps, double step_kb,
                               double slot_kb, double beta) {
  double red = m->reduce_us_per_kb;
  return steps * (step_kb * (MAX(beta, red) - beta) + MIN(step_kb, slot_kb) * MIN(beta, red));
}

/* An all-reduce reduces in its reduce-scatter half only. */
static double ring_cost(const struct tuner_model* m, int coll, double kb, double slot_kb) {
  int n = m->nranks;
  double frac = (double)(n - 1) / n, beta = flat_link(m)->beta_us_per_kb[ALGO_RING];
  double red = ring_reduce_time(m, n - 1, kb / n, slot_kb, beta), block = kb / n;
  if (coll == COLL_ALLREDUCE)
    return ring_time(m, 2.0 * (n - 1), 2 * frac * kb, block, slot_kb) + red;
  if (coll == COLL_ALLGATHER) return ring_time(m, n - 1, frac * kb, block, slot_kb);
  if (coll == COLL_REDUCESCATTER) return ring_time(m, n - 1, frac * kb, block, slot_kb) + red;
  if (coll == COLL_REDUCE) /* a chain: every step the whole buffer */
    return ring_time(m, n - 1, kb, kb, slot_kb) + ring_reduce_time(m, n - 1, kb, slot_kb, beta);
  return ring_time(m, n - 1, kb, kb, slot_kb); /* chain broadcast */
}

/* The double tree's all-reduce keeps its NIC busy less of the time the
 * deeper it is: braid-sim's slope per KB, one rank a node over 1 Gbit/s
 * (docs/sim/tree-slopes.txt), is twice the line rate's at depth 3 and
 * grows by 0.26 of that a level (an interior rank's send to its second
 * child waits until the slice is in, and the executor's in-order window
 * couples the levels); its reduce and broadcast stay at the line's. A
 * constant loss (3.3, fitted at depth 11) priced the tree at 0.7x its
 * time at depth 13 and over it below. */
#define TREE_LOSS_PER_LEVEL 0.26

static double tree_loss(const struct tuner_model* m, int coll) {
  return coll == COLL_ALLREDUCE ? 1.0 + TREE_LOSS_PER_LEVEL * MAX(0, m->tree_depth - 3) : 1.0;
}

/* What a tree's rank spends reducing: an all-reduce's levels reduce one
 * after another on the way up, and braid-sim's slope grows by about half
 * a reduction of the buffer a level (100 Gbit/s, reducing at 60 Gbit/s:
 * 1.5, 2.5, 3.7 and 5.4 reductions at depths 3, 5, 7 and 9); a reduce's
 * interior rank reduces its two children's data. */
static double tree_reduce_time(const struct tuner_model* m, int coll, double kb) {
  if (coll == COLL_ALLREDUCE) return reduce_time(m, kb * m->tree_depth / 2.0);
  return coll == COLL_REDUCE ? reduce_time(m, 2 * kb) : 0;
}

/* Per KB, a flat algorithm across nodes is never faster than its share
 * of the NIC: the ring visits ranks node by node, so one flow leaves each
 * node; a tree's links leaving a node carry what tuner_tree_sharers
 * counts (braid-sim: it took twice the line rate's figure at 2 ranks a
 * node), at the tree's loss; recursive doubling's rounds are priced in
 * rd_time. */
static double flat_beta(const struct tuner_model* m, int algo, int coll) {
  double beta = flat_link(m)->beta_us_per_kb[algo];
  if (algo == ALGO_TREE)
    beta = MAX(beta, m->wire_us_per_kb * MAX(1.0, m->tree_sharers) * tree_loss(m, coll));
  return beta;
}

/* Up then down; an interior rank moves the data of two children. Slices
 * pipeline through the levels, but across nodes each level forwards a
 * whole slice: a call of few slices pays a slice's time per level at the
 * line rate (braid-sim: a 4 KiB tree over 128 nodes took three times the
 * pipelined figure). Inside a node the fitted lines hold that fill. */
static double tree_cost(const struct tuner_model* m, int coll, double kb, double slot_kb) {
  const struct tuner_link* l = flat_link(m);
  double hops = (coll == COLL_ALLREDUCE ? 2.0 : 1.0) * (m->tree_depth - 1);
  double alpha = l->alpha_us[ALGO_TREE], beta = flat_beta(m, ALGO_TREE, coll);
  double red = tree_reduce_time(m, coll, kb);
  if (m->nnodes == 1) return hops * alpha + 2 * kb * beta + red;
  double line = MAX(l->beta_us_per_kb[ALGO_TREE], m->wire_us_per_kb);
  return hops * alpha + 2 * kb * beta + MAX(0.0, hops - 1) * MIN(kb, slot_kb) * line + red;
}

/* Recursive doubling over n ranks: whole-buffer exchanges, or from
 * RD_HALVING_MIN_BYTES on (4+ ranks in the power-of-two core) halving
 * then doubling: twice the core's rounds, each rank moving 2(p2-1)/p2 of
 * the buffer; folded ranks add two whole rounds. Halving round k sends
 * a 2^k-th of the buffer, so its messages are that share of the slices
 * (at least one), not all of them (braid-sim: a slice's hop in every
 * round priced a 16 MiB call at 2,048 ranks at 2.6x its time). Partners
 * go from farthest to nearest, so the last `local` rounds of the core
 * stay in a node, at alpha_in a hop and beta_in a KB (braid-sim: all at
 * the network's put an 8 B call over 32 nodes of 2 above Hier's, which
 * took 1.1x its time; a 64 B one over 16 nodes of 8 took 1.4x). A round
 * across nodes is never faster than the NIC carrying every rank of the
 * node at once (`nic`: halving with the farthest partner first, they all
 * cross together; braid-sim: twice the line rate's figure at 2 ranks a
 * node), but a round of small messages is not slower for it: the NIC has
 * drained before the next round's messages are ready (braid-sim: pricing
 * every round at the node's load put a 64 B call over 64 nodes of 8
 * ranks above Hier's, 1.3x its time). */
struct rd_hop {
  double alpha, alpha_in, beta, beta_in, nic, reduce; /* us per hop, per KB */
  int local;
};

/* One round across nodes: its hops and its own bytes, or the node's bytes
 * through the NIC, whichever takes longer. */
static double rd_net_round(const struct rd_hop* h, double hops, double kb) {
  return MAX(hops * h->alpha + kb * h->beta, kb * h->nic);
}

static double rd_time(int n, double kb, double slot_kb, const struct rd_hop* h) {
  double slices = kb > slot_kb ? kb / slot_kb : 1.0, t = 0, red = 0;
  int r = rd_rounds(n), core = rd_core_rounds(n), fold = r - core;
  int halving = rd_uses_halving((size_t)(kb * 1024.0), 1, n);
  for (int k = 1; k <= core; k++) {
    double hops = halving ? 2.0 * MAX(1.0, slices / (double)(1 << k)) : slices;
    double round_kb = halving ? 2.0 * kb / (double)(1 << k) : kb;
    t += k > core - h->local ? hops * h->alpha_in + round_kb * h->beta_in
                             : rd_net_round(h, hops, round_kb);
    red += halving ? kb / (double)(1 << k) : kb; /* what the round receives, reduced */
  }
  t += fold * rd_net_round(h, slices, kb);
  red += fold ? kb : 0; /* the fold-in reduces, the hand-back copies */
  return t + red * h->reduce;
}

/* The core rounds that stay in a node: log2 of its ranks, where every node
 * holds the same power of two of them (aligned blocks, as launchers place
 * ranks and the tuner assumes for Pairwise too). */
static int rd_local_rounds(const struct tuner_model* m) {
  int p = m->max_ppn, local = 0;
  if (m->nnodes < 2 || m->min_ppn != p || (p & (p - 1)) != 0) return 0;
  while ((2 << local) <= p) local++;
  return local;
}

static double rd_cost(const struct tuner_model* m, double kb, double slot_kb) {
  struct rd_hop h = {.alpha = flat_link(m)->alpha_us[ALGO_RD],
                     .alpha_in = m->intra.alpha_us[ALGO_RD],
                     .beta = flat_beta(m, ALGO_RD, COLL_ALLREDUCE),
                     .beta_in = m->intra.beta_us_per_kb[ALGO_RD],
                     .nic = m->wire_us_per_kb * m->max_ppn,
                     .reduce = m->reduce_us_per_kb,
                     .local = rd_local_rounds(m)};
  return rd_time(m->nranks, kb, slot_kb, &h);
}

/* Hier's leader all-reduce: a tree in each node up to its leader and back
 * down, the leaders' recursive doubling between. The node tree forwards a
 * whole slice a level, as the flat tree does across nodes (braid-sim: a
 * 32 KiB call over 8 nodes of 8 took 1.6x the price without that fill),
 * and its interior ranks reduce two children's data on the way up. A
 * leader crosses the network alone, so its hop is a lone rank's, not one
 * of a crowded node's (on 2 emulated hosts of 4 ranks sharing 2 cores,
 * priced as crowded, recursive doubling was picked up to 1 KiB and took
 * 1.8x Hier's time). */
static double hier_leaders_cost(const struct tuner_model* m, double kb, double slot_kb) {
  double levels = log2_ceil(m->max_ppn), slice = MIN(kb, slot_kb);
  double node =
      link_time(&m->intra, ALGO_TREE, 2 * levels, 2 * kb + MAX(0.0, 2 * levels - 1) * slice) +
      reduce_time(m, 2 * kb + MAX(0.0, levels - 1) * slice);
  return node + rd_time(m->nnodes, kb, slot_kb,
                        &(struct rd_hop){.alpha = m->net_alone.alpha_us[ALGO_RD],
                                         .beta = m->net_alone.beta_us_per_kb[ALGO_RD],
                                         .reduce = m->reduce_us_per_kb});
}

/* Hier's reduce-scatter rings' reductions, as ring_reduce_time prices
 * them: the node ring's steps on the intra link, then the network ring's
 * on the rank's share, whose link is the rank's share of its NIC. */
static double hier_reduce_time(const struct tuner_model* m, double kb, double slot_kb,
                               double rounds) {
  int p = m->max_ppn, nn = m->nnodes;
  double node_kb = kb / (p * rounds), net_kb = node_kb / nn;
  double net_beta = MAX(m->net.beta_us_per_kb[ALGO_RING], m->wire_us_per_kb * p);
  return ring_reduce_time(m, (p - 1) * rounds, node_kb, slot_kb,
                          m->intra.beta_us_per_kb[ALGO_RING]) +
         ring_reduce_time(m, (nn - 1) * rounds, net_kb, slot_kb, net_beta);
}

/* Hier's network phase: the node's ppn rings, one a rank, share its NIC.
 * The longer of two: a block's journey round its ring (each hop's first
 * slice at the line rate, the slices behind it at the rank's share of
 * the NIC), and the NIC carrying the node's bytes while each ring's hops
 * hide behind the others' transfers (braid-sim: every hop paid on top of
 * the NIC's time priced 256 KiB over 128 nodes of 2 at 1.4x its time).
 * `node_kb`: what the node's ranks together move. */
static double hier_net_time(const struct tuner_model* m, const struct tuner_link* shared,
                            double hops, double node_kb, double slice) {
  int p = m->max_ppn;
  double alpha = shared->alpha_us[ALGO_RING], beta = shared->beta_us_per_kb[ALGO_RING];
  double wire = MAX(m->wire_us_per_kb, beta), rank_kb = node_kb / p;
  double journey = hops * (alpha + slice * wire) + MAX(0.0, rank_kb - hops * slice) * beta * p;
  return MAX(journey, hops * alpha / p + node_kb * beta);
}

/* Hierarchical: node phases on the intra link (each rank's share), the
 * inter-node phase on the network, where the node's ppn ranks together
 * move what one rank would in a flat algorithm over nnodes: the NIC
 * carries all of it, each rank's CPU a ppn-th (braid-sim: a rank's CPU
 * priced for the whole node's bytes put a 16 MiB call at 256 ranks at
 * 1.8x its time). */
static double hier_cost(const struct tuner_model* m, int coll, double kb, double slot_kb) {
  int p = m->max_ppn, nn = m->nnodes;
  double pf = (double)(p - 1) / p, mf = (double)(nn - 1) / nn;
  struct tuner_link shared = m->net;
  const struct tuner_link *in = &m->intra, *net = &shared;
  for (int a = 0; a < sched_algo_count(); a++)
    shared.beta_us_per_kb[a] = MAX(m->net.beta_us_per_kb[a] / p, m->wire_us_per_kb);
  if (coll == COLL_ALLREDUCE && hier_allreduce_uses_leaders((size_t)(kb * 1024.0), m->slot_bytes))
    return hier_leaders_cost(m, kb, slot_kb);
  if (coll == COLL_ALLREDUCE) {
    /* A rank's one CPU serves its node ring and its network ring, so their
     * bytes add up even when the rounds pipeline (braid-sim: at 8 nodes of
     * 8 ranks a pipelined 1 GiB call took their sum, not their maximum).
     * Pipelined, the hops are paid once; unpipelined, each round of a
     * window's slices per rank pays them (braid-sim: at 4096 ranks on 2048
     * nodes Hier took 3.3x the ring, priced below it with one round's). */
    double round_kb = (double)m->min_ppn * slot_kb;
    double rounds = m->hier_pipelined && kb > round_kb
                        ? 1.0
                        : ceil(kb / (round_kb * MAX(1, m->slices_per_step)));
    double red = hier_reduce_time(m, kb, slot_kb, rounds);
    double slice = MIN(kb / (p * nn * rounds), slot_kb);
    return link_time(in, ALGO_RING, 2.0 * (p - 1) * rounds, 2 * pf * kb) +
           hier_net_time(m, net, 2.0 * (nn - 1) * rounds, 2 * mf * kb, slice) + red;
  }
  /* all-gather / reduce-scatter: kb is the whole gathered buffer */
  return link_time(in, ALGO_RING, (double)(p - 1) * nn, pf * kb) +
         link_time(net, ALGO_RING, nn - 1, mf * kb) +
         (coll == COLL_REDUCESCATTER ? hier_reduce_time(m, kb, slot_kb, 1) : 0);
}

/* Whether Pairwise's node-aware all-reduce applies: several nodes of the
 * same power of two of ranks, assumed to hold aligned blocks of ranks (as
 * launchers place them; algorithms/pairwise.c checks the real layout). */
static int pairwise_blocked_nodes(const struct tuner_model* m) {
  int p = m->max_ppn;
  return m->nnodes > 1 && m->min_ppn == p && p >= 2 && (p & (p - 1)) == 0;
}

/* Across such nodes the first log2(ppn) levels stay in the node and the
 * rest cross the network, where a node's ranks together move what one
 * rank would over nnodes. Small buffers: node exchanges, the leaders'
 * network exchanges, the hand-over. Large ones: segments pipeline the node
 * levels against the network levels, hiding the faster side. */
static double pairwise_nodes_cost(const struct tuner_model* m, double kb, double slot_kb) {
  int p = m->max_ppn, nn = m->nnodes, node_lv = pairwise_levels(p), net_lv = pairwise_levels(nn);
  double pf = (double)(p - 1) / p, mf = (double)(nn - 1) / nn;
  double slices = kb > slot_kb ? kb / slot_kb : 1.0;
  const struct tuner_link *in = &m->intra, *net = &m->net;
  if (pairwise_uses_doubling((size_t)(kb * 1024.0), 1, m->nranks))
    return link_time(in, ALGO_PAIRWISE, (node_lv + 1) * slices, (node_lv + 1) * kb) +
           link_time(net, ALGO_PAIRWISE, net_lv * slices, net_lv * kb);
  double node = link_time(in, ALGO_PAIRWISE, 2.0 * node_lv + slices, 2 * pf * kb);
  double wire = link_time(net, ALGO_PAIRWISE, 2.0 * net_lv + slices, 2 * mf * kb);
  double seg_kb = (double)pairwise_segment_bytes(m->slot_bytes, m->slices_per_step) / 1024.0;
  if (kb > seg_kb) return MAX(node, wire) + MIN(node, wire) * seg_kb / kb;
  return node + wire;
}

/* Pairwise: small all-reduces over 2^L ranks exchange whole buffers in L
 * rounds; otherwise L rounds of combining (an all-reduce's halving, the
 * others' per-block trees), each rank sending (n-1)/n of the buffer, and
 * for an all-reduce the all-gather's L rounds and (n-1)/n again; a
 * reduce's blocks then travel to the root. */
static double pairwise_cost(const struct tuner_model* m, int coll, double kb, double slot_kb) {
  const struct tuner_link* l = flat_link(m);
  int n = m->nranks, levels = pairwise_levels(n);
  double frac = (double)(n - 1) / n, slices = kb > slot_kb ? kb / slot_kb : 1.0;
  if (coll == COLL_ALLREDUCE && pairwise_blocked_nodes(m))
    return pairwise_nodes_cost(m, kb, slot_kb);
  if (coll == COLL_ALLREDUCE && pairwise_uses_doubling((size_t)(kb * 1024.0), 1, n))
    return link_time(l, ALGO_PAIRWISE, levels * slices, levels * kb);
  if (coll == COLL_ALLREDUCE)
    return link_time(l, ALGO_PAIRWISE, 2.0 * levels + slices, 2 * frac * kb);
  if (coll == COLL_REDUCE) return link_time(l, ALGO_PAIRWISE, levels + 1 + slices, 2 * frac * kb);
  return link_time(l, ALGO_PAIRWISE, levels + slices, frac * kb); /* reduce-scatter */
}

/* What a Pairwise rank reduces: the whole buffer each level when it
 * exchanges whole buffers, (n-1)/n of it when it halves. */
static double pairwise_reduced_kb(const struct tuner_model* m, int coll, double kb) {
  int n = m->nranks;
  if (!sched_coll_reduces(coll)) return 0;
  if (coll == COLL_ALLREDUCE && pairwise_uses_doubling((size_t)(kb * 1024.0), 1, n))
    return pairwise_levels(n) * kb;
  return (double)(n - 1) / n * kb;
}

/* All-reduce is recursive doubling's only collective. */
static double rd_coll_cost(const struct tuner_model* m, int coll, double kb, double slot_kb) {
  (void)coll;
  return rd_cost(m, kb, slot_kb);
}

static double pairwise_full_cost(const struct tuner_model* m, int coll, double kb, double slot_kb) {
  return pairwise_cost(m, coll, kb, slot_kb) + reduce_time(m, pairwise_reduced_kb(m, coll, kb));
}

/* The library's algorithms' costs (a row of algorithms/sched_algos.c is
 * an algorithm's schedule; this is its price, from the whole model), for a
 * call of kb KiB in slots of slot_kb. */
typedef double (*algo_cost_fn)(const struct tuner_model* m, int coll, double kb, double slot_kb);
static const algo_cost_fn k_costs[ALGO_COUNT] = {
    [ALGO_RING] = ring_cost,
    [ALGO_TREE] = tree_cost,
    [ALGO_RD] = rd_coll_cost,
    [ALGO_HIER] = hier_cost,
    [ALGO_PAIRWISE] = pairwise_full_cost,
};

/* A row the tuner has no model of prices itself by its shape, on the
 * flat link with its (or the ring's) fitted costs. */
static double shape_cost(const struct tuner_model* m, int coll, int algo, double bytes) {
  const struct sched_algorithm* a = sched_algorithm(algo);
  struct sched_shape sh = {0};
  if (a == NULL || a->shape == NULL) return 1e30;
  a->shape(coll, m->nranks, bytes, &sh);
  return link_time(flat_link(m), algo, sh.hops, sh.moved_bytes / 1024.0) +
         reduce_time(m, sh.reduced_bytes / 1024.0);
}

double tuner_cost(const struct tuner_model* m, int coll, int algo, double bytes) {
  double kb = bytes / 1024.0, slot_kb = (double)m->slot_bytes / 1024.0;
  if (algo < 0 || algo >= sched_algo_count()) return 1e30;
  if (algo >= ALGO_COUNT || k_costs[algo] == NULL) return shape_cost(m, coll, algo, bytes);
  return k_costs[algo](m, coll, kb, slot_kb);
}

/* --- choosing --- */

/* The choice for a call on a model and layout, silently; returns 1 when a
 * tune file forced it. */
int tuner_pick(const struct tuner_model* m, const struct sched_topo* layout, int coll, size_t bytes,
               int canonical, int* algo, size_t* chunk_bytes) {
  unsigned allowed = tuner_allowed();
  *algo = -1;
  double best = 0;
  *chunk_bytes = m->slot_bytes;
  if (canonical && sched_coll_reduces(coll)) { /* nothing else yields the canonical order */
    *algo = ALGO_PAIRWISE;
    *chunk_bytes = tuner_chunk(m, coll, *algo, bytes);
    return 0;
  }
  if (m->nforced && tuner_file_choice(m, coll, bytes, allowed, algo, chunk_bytes)) {
    if (*chunk_bytes == 0) *chunk_bytes = tuner_chunk(m, coll, *algo, bytes);
    return 1;
  }
  for (int a = 0; a < sched_algo_count(); a++) {
    if (!(allowed & (1u << a)) || !sched_supports_on(layout, coll, a)) continue;
    double t = tuner_cost(m, coll, a, (double)bytes);
    if (*algo < 0 || t < best) *algo = a, best = t;
  }
  if (*algo < 0) *algo = ALGO_RING; /* every collective has a ring */
  *chunk_bytes = tuner_chunk(m, coll, *algo, bytes);
  return 0;
}

static int tuner_decide(const struct ncclComm* comm, int coll, size_t bytes, int canonical,
                        int* algo, size_t* chunk_bytes) {
  return tuner_pick(&comm->tune, &comm->layout, coll, bytes, canonical, algo, chunk_bytes);
}

/* Whole slots by default: over TCP per-message costs outweigh a deeper
 * pipeline (docs/performance.md, "Measurements behind the defaults"). Shared memory's
 * per-message cost is small, so there a block smaller than a few slots is
 * cut into 4 slices to keep every rank busy. */
size_t tuner_chunk(const struct tuner_model* m, int coll, int algo, size_t bytes) {
  size_t slot = m->slot_bytes, per_rank = bytes / (size_t)MAX(1, m->nranks);
  /* the leader variant, as the model assumes, needs whole slots */
  if (coll == COLL_ALLREDUCE && algo == ALGO_HIER && hier_allreduce_uses_leaders(bytes, slot))
    return slot;
  /* Across nodes every message pays the network's per-message cost: whole
   * slots, for Hier too (docs/performance.md, "Measurements behind the defaults"). */
  if (m->nnodes > 1) return slot;
  if (m->intra_transport->link != TRANSPORT_LINK_MEMORY || per_rank >= 4 * slot) return slot;
  return MAX((size_t)4096, MIN(slot, ALIGN_UP(per_rank / 4, 4096)));
}

double tuner_host_best(const struct ncclComm* comm, int coll, size_t bytes, int* algo) {
  size_t chunk;
  tuner_decide(comm, coll, bytes, atomic_load(&comm->deterministic), algo, &chunk);
  return tuner_cost(&comm->tune, coll, *algo, (double)bytes);
}

void tuner_choose(const struct ncclComm* comm, int coll, size_t bytes, int canonical, int* algo,
                  size_t* chunk_bytes) {
  int forced = tuner_decide(comm, coll, bytes, canonical, algo, chunk_bytes);
  INFO(SUB_TUNING, "%s %zu bytes nranks %d: %s chunk %zu (%s %.1f us)", sched_coll_name(coll),
       bytes, comm->nranks, sched_algo_name(*algo), *chunk_bytes,
       forced                                  ? "BRAID_TUNE_FILE, model"
       : canonical && sched_coll_reduces(coll) ? "deterministic, model"
                                               : "modelled",
       tuner_cost(&comm->tune, coll, *algo, (double)bytes));
}

void tuner_log_table(const struct ncclComm* comm) {
  static const size_t sizes[] = {8,       1 << 10, 64 << 10, 256 << 10,
                                 1 << 20, 4 << 20, 16 << 20, 256 << 20};
  const struct tuner_model* m = &comm->tune;
  if (comm->rank != 0 || !debug_enabled(DEBUG_INFO, SUB_TUNING)) return;
  INFO(SUB_TUNING,
       "Tuner model: %d nodes, %d-%d ranks/node, %.2f ranks/core; intra %s ring alpha %.1f us "
       "beta %.4f us/KB; net %s (%u Mb/s) ring alpha %.1f us beta %.4f us/KB",
       m->nnodes, m->min_ppn, m->max_ppn, m->oversub, m->intra_transport->name,
       m->intra.alpha_us[ALGO_RING], m->intra.beta_us_per_kb[ALGO_RING], m->net_transport->name,
       m->nic_mbps, m->net.alpha_us[ALGO_RING], m->net.beta_us_per_kb[ALGO_RING]);
  for (int c = 0; c < COLL_COUNT; c++)
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
      char line[320];
      int o = snprintf(line, sizeof(line), "%-13s %10zu B:", sched_coll_name(c), sizes[i]);
      int algo;
      size_t chunk;
      for (int a = 0; a < sched_algo_count() && o < (int)sizeof(line); a++)
        if (sched_supports_on(&comm->layout, c, a))
          o += snprintf(line + o, sizeof(line) - (size_t)o, " %s %.1f us", sched_algo_name(a),
                        tuner_cost(m, c, a, (double)sizes[i]));
      tuner_decide(comm, c, sizes[i], atomic_load(&comm->deterministic), &algo, &chunk);
      INFO(SUB_TUNING, "Tuner table: %s -> %s chunk %zu", line, sched_algo_name(algo), chunk);
    }
}
