/*
 * A tuner model for a simulated cluster (sim_tune.h), filled as
 * tuner_model_init fills a comm's from its peer table.
 */
#include "sim_tune.h"

#include <string.h>

#include "core.h"
#include "engine/executor.h"
#include "hier.h"
#include "layout.h"
#include "transport.h"
#include "tree.h"
#include "tune/tuner_model.h"

/* Whether a large Hier all-reduce would pipeline on this layout: asked of
 * the key a 64 MiB call builds, as tuner_model.c asks it. */
static int hier_would_pipeline(const struct sim_cluster* c, const struct sched_topo* t) {
  struct sched_key k = {.topo = t,
                        .coll = COLL_ALLREDUCE,
                        .algo = ALGO_HIER,
                        .nranks = c->nranks,
                        .count = (size_t)16 << 20,
                        .elem_size = 4,
                        .chunk_bytes = c->slot_bytes,
                        .slices_per_step = MAX(1, MAX(4, c->window) / 2)};
  return hier_allreduce_pipelines(&k);
}

/* Every algorithm's link lines from the cluster's figures - what a
 * BRAID_TUNE_FILE's "link" lines written for it would say: a hop's latency
 * and the message cost of both its ends (the sender's CPU, then the
 * receiver's: sim_engine.c charges each), a KB at the link's rate (the
 * NIC's across nodes). */
static void tune_links_from_figures(const struct sim_cluster* c, struct tuner_model* m) {
  for (int a = 0; a < ALGO_COUNT; a++) {
    m->net.alpha_us[a] = c->net_lat_us + 2 * c->msg_us;
    m->net.beta_us_per_kb[a] = 8.192 / c->nic_gbps;
    m->intra.alpha_us[a] = c->intra_lat_us + 2 * c->intra_msg_us;
    m->intra.beta_us_per_kb[a] = 8.192 / c->intra_gbps;
  }
  m->reduce_us_per_kb = 8.192 / c->reduce_gbps;
}

void sim_tune_model(const struct sim_cluster* c, const struct sched_topo* t,
                    struct tuner_model* m) {
  memset(m, 0, sizeof(*m));
  m->nranks = c->nranks, m->nnodes = c->nnodes;
  m->min_ppn = m->max_ppn = c->per_node;
  m->tree_depth = tree_depth(c->nranks);
  m->slot_bytes = c->slot_bytes;
  m->slices_per_step = MAX(1, MAX(4, c->window) / 2);
  m->hier_pipelined = hier_would_pipeline(c, t);
  m->tree_sharers = tuner_tree_sharers(t);
  m->intra_transport = c->per_node > 1 ? &shm_transport : &tcp_transport;
  m->net_transport = &tcp_transport;
  m->oversub = 1;
  m->nic_mbps = (uint32_t)(c->nic_gbps * 1000.0);
  m->mem_mbps = (uint32_t)(c->copy_gbps * 1000.0 / 8.0);
  tuner_model_price(m);
  if (c->tune_links) tune_links_from_figures(c, m);
  m->net_alone = m->net; /* the cluster's figures give every rank a core */
}
