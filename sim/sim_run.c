/*
 * Building and playing one call (sim_run.h).
 */
#include "sim_run.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "layout.h"
#include "sched_build.h"
#include "sim_engine.h"
#include "sim_symmetry.h"
#include "sim_tune.h"
#include "tune/tuner.h"
#include "sched_algos.h"

#define SIM_ELEM 4 /* floats */

ncclResult_t sim_context_init(struct sim_context* s, const struct sim_cluster* c) {
  ncclResult_t res = ncclSuccess;
  memset(s, 0, sizeof(*s));
  s->c = c;
  s->step_budget = SIM_STEP_BUDGET;
  CHECK(sim_cluster_layout(c, &s->topo));
  sim_tune_model(c, &s->topo, &s->model);
  struct exec_conf conf = {
      .nranks = c->nranks, .topo = &s->topo, .window = c->window, .slot_bytes = c->slot_bytes};
  CHECK(exec_init(&s->ex, &conf));
fail:
  return res;
}

void sim_context_free(struct sim_context* s) {
  exec_free(&s->ex);
  sched_free(&s->sched);
  sched_topo_free(&s->topo);
}

/* Elements per rank's block (all-gather, reduce-scatter) or of the buffer. */
static size_t call_count(const struct sim_context* s, int coll, size_t bytes) {
  size_t elems = bytes / SIM_ELEM;
  if (coll == COLL_ALLGATHER || coll == COLL_REDUCESCATTER) return elems / (size_t)s->c->nranks;
  return elems;
}

/* How far back the latest step within `window` (the engine's, floor
 * included) is that writes output bytes step i sends (0: none, or i sends
 * no output); a step further back is retired, so computed, before i is
 * posted. */
static uint16_t y_wait_of(const struct schedule* sc, size_t i, int window) {
  const struct sched_step* st = &sc->steps[i];
  if (!sched_step_sends_y(st)) return 0;
  for (size_t back = 1; back <= i && back <= (size_t)MIN(window, UINT16_MAX); back++) {
    const struct sched_step* w = &sc->steps[i - back];
    if (sched_prim_writes_y(w->prim) && w->yoff < st->yoff + st->count &&
        st->yoff < w->yoff + w->count)
      return (uint16_t)back;
  }
  return 0;
}

static ncclResult_t append_steps(const struct schedule* sc, int piece_first, int window,
                                 struct sim_step** out, size_t* n, size_t* cap) {
  ncclResult_t res = ncclSuccess;
  if (*n + sc->nsteps > *cap) {
    size_t want = MAX(*n + sc->nsteps, 2 * *cap);
    CHECK(braid_realloc(out, want, sizeof(**out)));
    *cap = want;
  }
  for (size_t i = 0; i < sc->nsteps; i++) {
    const struct sched_step* st = &sc->steps[i];
    (*out)[(*n)++] = (struct sim_step){.recv = st->recv_peer,
                                       .send = st->send_peer,
                                       .bytes = (uint32_t)(st->count * SIM_ELEM),
                                       .prim = st->prim,
                                       .piece_first = (uint8_t)(piece_first && i == 0),
                                       .y_wait = y_wait_of(sc, i, window)};
  }
fail:
  return res;
}

/* Rank `rank`'s steps for the call, piece after piece, as the executor
 * cuts it (exec_piece_count, exec_ctx_key). */
static ncclResult_t rank_steps(struct sim_context* s, const struct sim_call* call, size_t count,
                               size_t chunk, int rank, struct sim_step** out, size_t* n) {
  ncclResult_t res = ncclSuccess;
  size_t cap = 0;
  struct exec_args a = {.coll = call->coll,
                        .root = call->root,
                        .count = count,
                        .type = ncclFloat,
                        .algo = call->algo,
                        .chunk_bytes = chunk};
  *out = NULL, *n = 0;
  s->ex.conf.rank = rank;
  size_t piece = exec_piece_count(&s->ex, &a);
  for (int again = 0; again < MAX(1, call->repeat); again++)
    for (size_t off = 0; off < count; off += piece) {
      struct exec_args p = a;
      struct sched_key key;
      p.count = MIN(piece, count - off);
      if (call->coll == COLL_ALLGATHER || call->coll == COLL_REDUCESCATTER) p.stride = count;
      exec_ctx_key(&s->ex, &p, &key);
      CHECK(sched_build(&s->sched, &key));
      CHECK(append_steps(&s->sched, off > 0 || again > 0, MAX(4, s->c->window), out, n, &cap));
    }
  return ncclSuccess;
fail:
  free(*out);
  *out = NULL;
  return res;
}

static void plan_free(struct sim_plan* p) {
  for (int r = 0; p->steps && r < p->nsim; r++) free(p->steps[r]);
  free(p->steps);
  free(p->nsteps);
  memset(p, 0, sizeof(*p));
}

static ncclResult_t plan_alloc(struct sim_plan* p, const struct sim_cluster* c, int nsim) {
  ncclResult_t res = ncclSuccess;
  memset(p, 0, sizeof(*p));
  p->c = c, p->nsim = nsim;
  CHECK(braid_calloc(&p->steps, (size_t)nsim, sizeof(*p->steps)));
  CHECK(braid_calloc(&p->nsteps, (size_t)nsim, sizeof(*p->nsteps)));
fail:
  return res;
}

/* Whether every probed node's schedules are node 0's moved by `kind`. */
static ncclResult_t probe_map(struct sim_context* s, const struct sim_call* call, size_t count,
                              size_t chunk, const struct sim_plan* p, enum sim_map_kind kind,
                              int* ok) {
  ncclResult_t res = ncclSuccess;
  const struct sim_cluster* c = s->c;
  int probes[3] = {1, c->nnodes / 2, c->nnodes - 1};
  *ok = 0;
  if (kind == SIM_MAP_XOR && (c->nnodes & (c->nnodes - 1)) != 0) return ncclSuccess;
  for (int l = 0; l < c->per_node; l++)
    for (int i = 0; i < 3; i++) {
      struct sim_step* other = NULL;
      size_t n = 0;
      if (probes[i] <= 0 || (i > 0 && probes[i] == probes[i - 1])) continue;
      CHECK(rank_steps(s, call, count, chunk, probes[i] * c->per_node + l, &other, &n));
      int same = sim_is_map(c, kind, p->steps[l], p->nsteps[l], other, n, probes[i], SIM_ELEM);
      free(other);
      if (!same) return ncclSuccess;
    }
  *ok = 1;
fail:
  return res;
}

/* Node 0's schedules in p, and the map of nodes under which they stand
 * for every node's (SIM_MAP_NONE: none, checked on three nodes). */
static ncclResult_t plan_symmetric(struct sim_context* s, const struct sim_call* call, size_t count,
                                   size_t chunk, struct sim_plan* p) {
  ncclResult_t res = ncclSuccess;
  const struct sim_cluster* c = s->c;
  int ok = 0;
  CHECK(plan_alloc(p, c, c->per_node));
  for (int l = 0; l < c->per_node; l++)
    CHECK(rank_steps(s, call, count, chunk, l, &p->steps[l], &p->nsteps[l]));
  for (enum sim_map_kind kind = SIM_MAP_SHIFT; kind <= SIM_MAP_XOR && !ok; kind++) {
    CHECK(probe_map(s, call, count, chunk, p, kind, &ok));
    if (ok) p->symmetric = kind;
  }
fail:
  return res;
}

static ncclResult_t plan_full(struct sim_context* s, const struct sim_call* call, size_t count,
                              size_t chunk, struct sim_plan* p) {
  ncclResult_t res = ncclSuccess;
  CHECK(plan_alloc(p, s->c, s->c->nranks));
  for (int r = 0; r < s->c->nranks; r++)
    CHECK(rank_steps(s, call, count, chunk, r, &p->steps[r], &p->nsteps[r]));
fail:
  return res;
}

static void take_stats(struct sim_result* out, const struct sim_plan* p,
                       const struct sim_stats* st) {
  out->us = st->end_us;
  out->symmetric = p->symmetric != SIM_MAP_NONE;
  out->messages = st->messages;
  out->steps = st->steps;
}

/* Every rank in full, unless more steps than the budget: then nothing is
 * played and *steps0 holds rank 0's count (0 when played). */
static ncclResult_t play_full(struct sim_context* s, const struct sim_call* call, size_t count,
                              size_t chunk, unsigned flags, struct sim_result* out,
                              size_t* steps0) {
  ncclResult_t res = ncclSuccess;
  struct sim_plan p = {0};
  struct sim_stats st;
  struct sim_step* first = NULL;
  size_t n0 = 0;
  *steps0 = 0;
  CHECK(rank_steps(s, call, count, chunk, 0, &first, &n0));
  free(first);
  if (!(flags & SIM_EXACT) && n0 * (size_t)s->c->nranks > s->step_budget) {
    *steps0 = n0;
    return ncclSuccess;
  }
  CHECK(plan_full(s, call, count, chunk, &p));
  CHECK(sim_play(&p, &st));
  take_stats(out, &p, &st);
fail:
  plan_free(&p);
  return res;
}

static ncclResult_t play_at(struct sim_context* s, const struct sim_call* call, size_t chunk,
                            unsigned flags, struct sim_result* out);

/* T(B) = T(B2) + (B - B2) (T(B2) - T(B1)) / (B2 - B1), B1 = B2 / 2, B2
 * sized to half the budget (from rank 0's `steps0` at B): both past the
 * fill, where time is linear. That is checked, not assumed: the slope from
 * B0 = B1 / 2 to B1 must be within SIM_LINEAR_TOL of B1's to B2, or the
 * small calls are latency, not a line through B's (at 24,576 ranks such a
 * line gave a pairwise all-reduce ten times the line rate), and there is
 * no answer. */
#define SIM_LINEAR_TOL 0.1

/* The least time a byte of the call can take across the network: every
 * node's NICs carry, per direction, at least 2(m-1)/m of an all-reduce's
 * buffer over m nodes, (m-1)/m of an all-gather's or reduce-scatter's, a
 * broadcast's or reduce's whole buffer (some node receives or sends it
 * all). A line through smaller calls that is faster is not the call's
 * (at 2,048 ranks, 2 a node, the line through Hier's smaller calls put a
 * 16 MiB all-reduce at 1.7 times the line rate). 0 on one node. */
static double wire_floor_us_per_byte(const struct sim_cluster* c, int coll) {
  double m = c->nnodes, share = coll == COLL_ALLREDUCE ? 2 * (m - 1) / m
                                : coll == COLL_ALLGATHER || coll == COLL_REDUCESCATTER ? (m - 1) / m
                                                                                       : 1.0;
  return c->nnodes > 1 ? share / (c->nics * c->nic_gbps * 1000.0 / 8.0) : 0;
}

static ncclResult_t no_line(struct sim_result* out) {
  out->us = -1;
  out->too_big = 1;
  return ncclSuccess;
}

/* Rank 0's steps for a call, built and counted, not played. */
static ncclResult_t rank0_steps(struct sim_context* s, const struct sim_call* call, size_t chunk,
                                size_t* n) {
  struct sim_step* steps = NULL;
  ncclResult_t res =
      rank_steps(s, call, call_count(s, call->coll, call->bytes), chunk, 0, &steps, n);
  free(steps);
  return res;
}

/* Whether the line through the smaller calls' step counts reaches the
 * call's own (`steps0`, rank 0's) within SIM_SHAPE_TOL: a schedule whose
 * shape changes past them is not on their line (Hier over 512 nodes runs
 * a 16 MiB call in four rounds, each paying its rings' hops: the line
 * through calls of one round gave 1,603 steps for its 4,604, and a third
 * of its time). Calls of one shape stay close: recursive doubling's rounds
 * of at least one message put a 1 GiB call over 1,536 ranks 10% off. */
#define SIM_SHAPE_TOL 0.25

static ncclResult_t same_shape(struct sim_context* s, const struct sim_call* c1,
                               const struct sim_call* c2, size_t chunk, size_t bytes, size_t steps0,
                               int* same) {
  ncclResult_t res = ncclSuccess;
  size_t n1, n2;
  CHECK(rank0_steps(s, c1, chunk, &n1));
  CHECK(rank0_steps(s, c2, chunk, &n2));
  double line = (double)n2 + ((double)bytes - (double)c2->bytes) * ((double)n2 - (double)n1) /
                                 (double)(c2->bytes - c1->bytes);
  *same = fabs(line - (double)steps0) <= SIM_SHAPE_TOL * (double)steps0;
fail:
  return res;
}

static ncclResult_t extrapolate(struct sim_context* s, const struct sim_call* call, size_t chunk,
                                unsigned flags, size_t steps0, struct sim_result* out) {
  ncclResult_t res = ncclSuccess;
  struct sim_result r0, r1, r2;
  struct sim_call c0 = *call, c1 = *call, c2 = *call;
  size_t unit = (size_t)SIM_ELEM * (size_t)s->c->nranks;
  double scale = (double)s->step_budget / 2.0 / ((double)steps0 * s->c->nranks);
  c2.bytes = MAX(2 * unit, (size_t)((double)call->bytes * scale) / (2 * unit) * (2 * unit));
  c1.bytes = c2.bytes / 2;
  c0.bytes = c1.bytes / 2;
  if (c2.bytes >= call->bytes || c0.bytes < unit) return no_line(out);
  int same;
  CHECK(same_shape(s, &c1, &c2, chunk, call->bytes, steps0, &same));
  if (!same) return no_line(out);
  CHECK(play_at(s, &c2, chunk, flags | SIM_EXACT, &r2));
  CHECK(play_at(s, &c1, chunk, flags | SIM_EXACT, &r1));
  CHECK(play_at(s, &c0, chunk, flags | SIM_EXACT, &r0));
  double slope = (r2.us - r1.us) / (double)(c2.bytes - c1.bytes);
  double slope0 = (r1.us - r0.us) / (double)(c1.bytes - c0.bytes);
  if (slope <= 0 || fabs(slope - slope0) > SIM_LINEAR_TOL * slope ||
      slope < wire_floor_us_per_byte(s->c, call->coll))
    return no_line(out);
  *out = r2;
  out->us =
      r2.us + (double)(call->bytes - c2.bytes) * (r2.us - r1.us) / (double)(c2.bytes - c1.bytes);
  out->extrapolated = 1;
fail:
  return res;
}

/* Node 0's ranks for all, if the schedules allow it (*played). */
static ncclResult_t play_symmetric(struct sim_context* s, const struct sim_call* call, size_t count,
                                   size_t chunk, struct sim_result* out, int* played) {
  ncclResult_t res = ncclSuccess;
  struct sim_plan p = {0};
  struct sim_stats st;
  *played = 0;
  CHECK(plan_symmetric(s, call, count, chunk, &p));
  if (p.symmetric != SIM_MAP_NONE) {
    CHECK(sim_play(&p, &st));
    take_stats(out, &p, &st);
    *played = 1;
  }
fail:
  plan_free(&p);
  return res;
}

static ncclResult_t play_at(struct sim_context* s, const struct sim_call* call, size_t chunk,
                            unsigned flags, struct sim_result* out) {
  ncclResult_t res = ncclSuccess;
  size_t count = call_count(s, call->coll, call->bytes);
  int played = 0;
  size_t over_budget = 0; /* rank 0's steps, where full play would exceed the budget */
  memset(out, 0, sizeof(*out));
  out->chunk = chunk;
  if (count == 0) return ncclSuccess; /* nothing moves */
  /* shared cores couple every node's ranks: node 0's cannot stand for all */
  if (!(flags & SIM_FULL) && s->c->nnodes > 1 && s->c->host_cores == 0)
    CHECK(play_symmetric(s, call, count, chunk, out, &played));
  if (!played) CHECK(play_full(s, call, count, chunk, flags, out, &over_budget));
  if (over_budget) CHECK(extrapolate(s, call, chunk, flags, over_budget, out));
  out->chunk = chunk;
fail:
  return res;
}

ncclResult_t sim_collective(struct sim_context* s, const struct sim_call* call, unsigned flags,
                            struct sim_result* out) {
  if (call->coll < 0 || call->coll >= COLL_COUNT || call->algo < 0 || call->algo >= ALGO_COUNT ||
      !sched_supports_on(&s->topo, call->coll, call->algo)) {
    WARN("braid-sim: %s does not implement %s on this layout", sched_algo_name(call->algo),
         sched_coll_name(call->coll));
    return ncclInvalidArgument;
  }
  size_t chunk = tuner_chunk(&s->model, call->coll, call->algo, call->bytes);
  if (call->repeat <= 1) return play_at(s, call, chunk, flags, out);
  /* one call in a loop: (T(k calls) - T(1 call)) / (k - 1) */
  ncclResult_t res = ncclSuccess;
  struct sim_call once = *call;
  struct sim_result first;
  once.repeat = 1;
  CHECK(play_at(s, &once, chunk, flags, &first));
  CHECK(play_at(s, call, chunk, flags, out));
  out->us = (out->us - first.us) / (call->repeat - 1);
fail:
  return res;
}

int sim_tuner_pick(struct sim_context* s, int coll, size_t bytes) {
  int algo;
  size_t chunk;
  tuner_pick(&s->model, &s->topo, coll, bytes, 0, &algo, &chunk);
  return algo;
}

double sim_busbw_factor(int coll, int nranks) {
  double n = nranks;
  if (coll == COLL_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (coll == COLL_ALLGATHER || coll == COLL_REDUCESCATTER) return (n - 1) / n;
  return 1.0;
}
