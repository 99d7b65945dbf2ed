/*
 * The engine (sim_engine.h). Every use of a resource - a rank's CPU, a
 * port - happens while handling an event, and events are handled in time
 * order: a rank's state machine (advance) only finds what may happen next
 * and queues it. So the outcome does not depend on the order in which
 * ranks happen to learn things, and symmetric play matches full play.
 */
#include "sim_engine.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "schedule.h"
#include "sim_net.h"
#include "sim_queue.h"

#define REC_SEND_QUEUED 1u /* its send's CPU work is queued or done */
#define REC_OFFERED 2u     /* its send is offered to the network */
#define REC_SENT 4u        /* and has left the sender's port */

/* A posted step: when it was posted, its message's arrival (taken when
 * its compute was queued), when it was computed, sent and retired. */
struct sim_rec {
  double post, arrival, end, sent, retire;
  unsigned flags;
};

/* The executor's cursors: posted, queued for compute, computed, retired. */
struct sim_rank {
  const struct sim_step* steps;
  size_t nsteps, next_post, next_queue, computed, retired;
  int computing;        /* a compute is queued and not done */
  double cpu;           /* the CPU is free from */
  double last_end;      /* the last computed step's end */
  double last_retire;   /* and the last retired one's */
  struct sim_rec* recs; /* [window]: step i in i % window */
  struct sim_map in, out;
};

struct sim_engine {
  const struct sim_plan* p;
  const struct sim_cluster* c;
  struct sim_rank* ranks;
  struct sim_heap heap;
  struct sim_net net;
  size_t window;
  double us_reduce, us_copy; /* per byte */
  double us_sock;            /* per byte of a network message, each end (sock_gbps) */
  double* core_free;         /* [host_cores]: when each shared core is free, or NULL */
  uint64_t messages;
};

static struct sim_rec* rec_of(const struct sim_engine* e, struct sim_rank* k, size_t i) {
  return &k->recs[i % e->window];
}

static int plain_send(const struct sim_step* s) {
  return s->prim == PRIM_SEND || s->prim == PRIM_SEND_OUT;
}

/* A rank's own work on a step's bytes. */
static double step_cost(const struct sim_engine* e, const struct sim_step* s) {
  switch (s->prim) {
    case PRIM_RECV_REDUCE_SEND:
    case PRIM_RECV_REDUCE_COPY_SEND:
    case PRIM_RECV_REDUCE_COPY:
    case PRIM_RECV_REDUCE_CARRY:
    case PRIM_EXCHANGE:
      return s->bytes * e->us_reduce;
    case PRIM_COPY:
    case PRIM_LOAD_CARRY:
      return s->bytes * e->us_copy;
    default: /* received straight into place, or sent as it is */
      return 0;
  }
}

/* A rank's CPU time for one message of `bytes` to or from `peer`: the
 * call, and across the network the kernel's copy of its bytes. */
static double msg_cost(const struct sim_engine* e, int r, int peer, size_t bytes) {
  const struct sim_cluster* c = e->c;
  if (r / c->per_node == peer / c->per_node) return c->intra_msg_us;
  return c->msg_us + (double)bytes * e->us_sock;
}

/* With shared cores, an event whose rank's CPU is still busy comes back
 * when it is free (1): work then books a core in the order it became
 * ready, first come first served, as a run queue serves it, and never
 * holds a core ahead of work that was ready sooner. */
static ncclResult_t cpu_defer(struct sim_engine* e, struct sim_event ev, int* deferred) {
  const struct sim_rank* k = &e->ranks[ev.rank];
  *deferred = e->core_free && k->cpu > ev.t;
  if (!*deferred) return ncclSuccess;
  ev.t = k->cpu;
  return sim_heap_push(&e->heap, ev);
}

/* Rank r's CPU runs `us` of work from `t` on; returns when it starts. With
 * shared cores the work also waits for the earliest free one. */
static double cpu_run(struct sim_engine* e, struct sim_rank* k, double t, double us) {
  double start = MAX(t, k->cpu);
  if (e->core_free) {
    int best = 0;
    for (int i = 1; i < e->c->host_cores; i++)
      if (e->core_free[i] < e->core_free[best]) best = i;
    start = MAX(start, e->core_free[best]);
    e->core_free[best] = start + us;
  }
  k->cpu = start + us;
  return start;
}

static ncclResult_t push(struct sim_engine* e, double t, int r, size_t i, int kind) {
  struct sim_event ev = {t, r % e->c->per_node, r, (uint32_t)i, (uint8_t)kind};
  return sim_heap_push(&e->heap, ev);
}

static ncclResult_t queue_send(struct sim_engine* e, int r, size_t i, double t) {
  rec_of(e, &e->ranks[r], i)->flags |= REC_SEND_QUEUED;
  return push(e, t, r, i, SIM_EV_SEND);
}

/* When posted plain send i may go before the steps ahead of it are
 * computed, or -1 if not yet: every earlier step on the same connection
 * has offered its send (the executor keeps a connection's order), and the
 * step that writes the output bytes it sends, if any, has been computed
 * (send_may_go's rule: a halving's next round sends what this one
 * reduces): from that compute's end on. */
static double may_send_early(const struct sim_engine* e, struct sim_rank* k, size_t i) {
  const struct sim_step* s = &k->steps[i];
  for (size_t j = k->retired; j < i; j++)
    if (k->steps[j].send == s->send && !(rec_of(e, k, j)->flags & REC_OFFERED)) return -1;
  if (s->y_wait == 0 || i - s->y_wait < k->retired) return 0;
  if (i - s->y_wait >= k->computed) return -1;
  return rec_of(e, k, i - s->y_wait)->end;
}

static int retire_steps(struct sim_engine* e, struct sim_rank* k) {
  int moved = 0;
  while (k->retired < k->computed) {
    struct sim_rec* rec = rec_of(e, k, k->retired);
    int sends = k->steps[k->retired].send >= 0;
    if (sends && !(rec->flags & REC_SENT)) break;
    k->last_retire = MAX(k->last_retire, MAX(rec->end, sends ? rec->sent : 0));
    rec->retire = k->last_retire;
    k->retired++;
    moved = 1;
  }
  return moved;
}

static int post_steps(struct sim_engine* e, struct sim_rank* k) {
  int moved = 0;
  while (k->next_post < k->nsteps && k->next_post - k->retired < e->window) {
    size_t i = k->next_post;
    if (k->steps[i].piece_first && k->retired < i) break; /* a piece starts on a drained window */
    struct sim_rec* rec = rec_of(e, k, i);
    double post = i >= e->window ? rec->retire : 0; /* step i - window's slot */
    if (k->steps[i].piece_first) post = MAX(post, k->last_retire);
    memset(rec, 0, sizeof(*rec));
    rec->post = post;
    k->next_post++;
    moved = 1;
  }
  return moved;
}

/* Plain sends of posted steps whose connection is free of earlier sends. */
static ncclResult_t send_early(struct sim_engine* e, int r, double now) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  for (size_t i = k->next_queue; i < k->next_post; i++) {
    struct sim_rec* rec = rec_of(e, k, i);
    double from;
    if (!plain_send(&k->steps[i]) || (rec->flags & REC_SEND_QUEUED) ||
        (from = may_send_early(e, k, i)) < 0)
      continue;
    CHECK(queue_send(e, r, i, MAX(MAX(rec->post, now), from)));
  }
fail:
  return res;
}

/* Queue the next step's compute once the one before is done and its
 * message is in; a plain send computes nothing and passes at once.
 * *moved when a step went on. */
static ncclResult_t queue_compute(struct sim_engine* e, int r, int* moved) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  while (!k->computing && k->next_queue < k->next_post) {
    size_t i = k->next_queue;
    const struct sim_step* st = &k->steps[i];
    struct sim_rec* rec = rec_of(e, k, i);
    double ready = MAX(rec->post, k->last_end);
    if (st->prim == PRIM_EXCHANGE && !(rec->flags & REC_SEND_QUEUED))
      CHECK(queue_send(e, r, i, ready)); /* it sends Y once the steps before are done */
    if (plain_send(st)) {
      if (!(rec->flags & REC_SEND_QUEUED)) CHECK(queue_send(e, r, i, ready));
      rec->end = k->last_end = ready;
      k->next_queue++, k->computed++;
      *moved = 1;
      continue;
    }
    if (sched_prim_recvs(st->prim)) {
      struct sim_conn* in;
      CHECK(sim_map_get(&k->in, st->recv, &in));
      if (in->n == 0) break; /* its message has not come */
      rec->arrival = sim_conn_pop(in);
      ready = MAX(ready, rec->arrival);
    }
    CHECK(push(e, ready, r, i, SIM_EV_COMPUTE));
    k->computing = 1;
    k->next_queue++;
    *moved = 1;
  }
fail:
  return res;
}

/* Move rank r as far as what is known at `now` allows. */
static ncclResult_t advance(struct sim_engine* e, int r, double now) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  int moved = 1;
  while (moved) {
    moved = retire_steps(e, k);
    moved |= post_steps(e, k);
    CHECK(queue_compute(e, r, &moved));
  }
  CHECK(send_early(e, r, now));
fail:
  return res;
}

/* ---- events ---- */

/* The send's CPU work from `t` on, then its offer, in the connection's order. */
static ncclResult_t offer_send(struct sim_engine* e, int r, size_t i, double t) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  struct sim_conn* out;
  CHECK(sim_map_get(&k->out, k->steps[i].send, &out));
  cpu_run(e, k, t, msg_cost(e, r, k->steps[i].send, k->steps[i].bytes));
  out->last = MAX(out->last, k->cpu);
  rec_of(e, k, i)->flags |= REC_OFFERED;
  CHECK(push(e, out->last, r, i, SIM_EV_NET));
fail:
  return res;
}

static ncclResult_t on_compute(struct sim_engine* e, struct sim_event ev) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[ev.rank];
  const struct sim_step* st = &k->steps[ev.step];
  struct sim_rec* rec = rec_of(e, k, ev.step);
  int deferred;
  CHECK(cpu_defer(e, ev, &deferred));
  if (deferred) return ncclSuccess;
  double us = step_cost(e, st);
  if (sched_prim_recvs(st->prim)) us += msg_cost(e, ev.rank, st->recv, st->bytes);
  cpu_run(e, k, ev.t, us);
  rec->end = k->last_end = k->cpu;
  k->computing = 0;
  k->computed++;
  if (st->send >= 0 && !(rec->flags & REC_SEND_QUEUED)) { /* its result goes on */
    if (e->core_free)
      CHECK(queue_send(e, ev.rank, ev.step, rec->end)); /* books its core when ready */
    else {
      rec->flags |= REC_SEND_QUEUED;
      CHECK(offer_send(e, ev.rank, ev.step, rec->end));
    }
  }
  CHECK(advance(e, ev.rank, ev.t));
fail:
  return res;
}

/* Where a message from played rank r to rank `to` lands: the played rank
 * that receives it, and the sender as that rank's schedule names it. */
static void landing(const struct sim_engine* e, int r, int to, int* rank, int* label) {
  const struct sim_cluster* c = e->c;
  if (!e->p->symmetric) {
    *rank = to, *label = r;
    return;
  }
  int home = sim_map_home(c, e->p->symmetric, to / c->per_node); /* the receiver to node 0 */
  *rank = to % c->per_node;
  *label = sim_map_rank(c, e->p->symmetric, r, home);
}

static ncclResult_t on_net(struct sim_engine* e, struct sim_event ev) {
  ncclResult_t res = ncclSuccess;
  const struct sim_cluster* c = e->c;
  struct sim_rank* k = &e->ranks[ev.rank];
  const struct sim_step* st = &k->steps[ev.step];
  struct sim_rec* rec = rec_of(e, k, ev.step);
  int to = st->send, rank, label;
  double arrived;
  struct sim_conn* in;
  landing(e, ev.rank, to, &rank, &label);
  int snode = e->p->symmetric ? 0 : ev.rank / c->per_node;
  int dnode = e->p->symmetric ? 0 : to / c->per_node;
  sim_net_send(&e->net, ev.rank, to, snode, ev.rank, dnode, rank, st->bytes, ev.t, &rec->sent,
               &arrived);
  rec->flags |= REC_SENT;
  CHECK(sim_map_get(&e->ranks[rank].in, label, &in));
  CHECK(sim_conn_push(in, arrived));
  e->messages++;
  CHECK(advance(e, rank, ev.t));
  CHECK(advance(e, ev.rank, ev.t));
fail:
  return res;
}

static ncclResult_t on_send(struct sim_engine* e, struct sim_event ev) {
  ncclResult_t res = ncclSuccess;
  int deferred;
  CHECK(cpu_defer(e, ev, &deferred));
  if (deferred) return ncclSuccess;
  CHECK(offer_send(e, ev.rank, ev.step, ev.t));
  if (e->core_free) CHECK(advance(e, ev.rank, ev.t)); /* later sends on its connection may go */
fail:
  return res;
}

static ncclResult_t handle(struct sim_engine* e, struct sim_event ev) {
  switch (ev.kind) {
    case SIM_EV_COMPUTE:
      return on_compute(e, ev);
    case SIM_EV_SEND:
      return on_send(e, ev);
    default:
      return on_net(e, ev);
  }
}

/* ---- playing ---- */

static ncclResult_t stuck(const struct sim_engine* e) {
  for (int r = 0; r < e->p->nsim; r++) {
    const struct sim_rank* k = &e->ranks[r];
    if (k->retired == k->nsteps) continue;
    size_t at = k->next_queue < k->nsteps ? k->next_queue : k->nsteps - 1;
    WARN(
        "braid-sim: rank %d stopped at step %zu of %zu (%s from rank %d): the schedules do not "
        "match",
        r, at, k->nsteps, sched_prim_name(k->steps[at].prim), k->steps[at].recv);
    return ncclInternalError;
  }
  return ncclSuccess;
}

static void engine_free(struct sim_engine* e) {
  for (int r = 0; e->ranks && r < e->p->nsim; r++) {
    free(e->ranks[r].recs);
    sim_map_free(&e->ranks[r].in);
    sim_map_free(&e->ranks[r].out);
  }
  free(e->ranks);
  free(e->core_free);
  sim_heap_free(&e->heap);
  sim_net_free(&e->net);
}

static ncclResult_t engine_init(struct sim_engine* e, const struct sim_plan* p) {
  ncclResult_t res = ncclSuccess;
  const struct sim_cluster* c = p->c;
  memset(e, 0, sizeof(*e));
  e->p = p, e->c = c;
  e->window = (size_t)MAX(4, c->window); /* the executor's floor (executor.c) */
  e->us_reduce = 8.0 / (c->reduce_gbps * 1000.0);
  e->us_copy = 8.0 / (c->copy_gbps * 1000.0);
  e->us_sock = c->sock_gbps > 0 ? 8.0 / (c->sock_gbps * 1000.0) : 0;
  if (c->host_cores > 0) CHECK(braid_calloc(&e->core_free, (size_t)c->host_cores, sizeof(double)));
  CHECK(sim_net_init(&e->net, c, p->symmetric ? 1 : c->nnodes, p->nsim));
  CHECK(braid_calloc(&e->ranks, (size_t)p->nsim, sizeof(*e->ranks)));
  for (int r = 0; r < p->nsim; r++) {
    e->ranks[r].steps = p->steps[r];
    e->ranks[r].nsteps = p->nsteps[r];
    CHECK(braid_calloc(&e->ranks[r].recs, e->window, sizeof(struct sim_rec)));
  }
fail:
  return res;
}

ncclResult_t sim_play(const struct sim_plan* p, struct sim_stats* out) {
  ncclResult_t res = ncclSuccess;
  struct sim_engine e;
  memset(out, 0, sizeof(*out));
  CHECK(engine_init(&e, p));
  for (int r = 0; r < p->nsim; r++) CHECK(advance(&e, r, 0));
  while (e.heap.n) CHECK(handle(&e, sim_heap_pop(&e.heap)));
  CHECK(stuck(&e));
  for (int r = 0; r < p->nsim; r++) {
    out->end_us = MAX(out->end_us, e.ranks[r].last_retire);
    out->steps += e.ranks[r].nsteps;
  }
  out->messages = e.messages;
fail:
  engine_free(&e);
  return res;
}
