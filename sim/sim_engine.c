/*
 * The engine (sim_engine.h): per rank, the executor's three cursors
 * (posted, computed, retired) over a window of records; per connection, a
 * queue of arrival times; a heap of sends in the order they are offered.
 */
#include "sim_engine.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "schedule.h"
#include "sim_net.h"

/* ---- arrival queues, by peer ---- */

struct sim_conn {
  int peer;    /* -1: an empty slot of the map */
  double last; /* outgoing: when its last send was offered */
  double* t;   /* incoming: arrival times not yet taken */
  uint32_t head, n, cap;
};

/* Open addressing over peers: ring and chain ranks have 2, trees 6,
 * recursive doubling 2 log n. */
struct sim_map {
  struct sim_conn* slots;
  uint32_t cap, n;
};

static void map_free(struct sim_map* m) {
  for (uint32_t i = 0; i < m->cap; i++) free(m->slots[i].t);
  free(m->slots);
  memset(m, 0, sizeof(*m));
}

static ncclResult_t map_grow(struct sim_map* m) {
  ncclResult_t res = ncclSuccess;
  struct sim_map g = {NULL, m->cap ? 2 * m->cap : 8, 0};
  CHECK(braid_calloc(&g.slots, g.cap, sizeof(*g.slots)));
  for (uint32_t i = 0; i < g.cap; i++) g.slots[i].peer = -1;
  for (uint32_t i = 0; i < m->cap; i++) {
    if (m->slots[i].peer < 0) continue;
    uint32_t j = (uint32_t)m->slots[i].peer * 2654435761u & (g.cap - 1);
    while (g.slots[j].peer >= 0) j = (j + 1) & (g.cap - 1);
    g.slots[j] = m->slots[i];
    g.n++;
  }
  free(m->slots);
  *m = g;
fail:
  return res;
}

static ncclResult_t map_get(struct sim_map* m, int peer, struct sim_conn** out) {
  ncclResult_t res = ncclSuccess;
  if (2 * (m->n + 1) > m->cap) CHECK(map_grow(m));
  uint32_t j = (uint32_t)peer * 2654435761u & (m->cap - 1);
  while (m->slots[j].peer >= 0 && m->slots[j].peer != peer) j = (j + 1) & (m->cap - 1);
  if (m->slots[j].peer < 0) {
    memset(&m->slots[j], 0, sizeof(m->slots[j]));
    m->slots[j].peer = peer;
    m->n++;
  }
  *out = &m->slots[j];
fail:
  return res;
}

static ncclResult_t queue_push(struct sim_conn* q, double t) {
  ncclResult_t res = ncclSuccess;
  if (q->n == q->cap) {
    uint32_t cap = q->cap ? 2 * q->cap : 16;
    double* nt = NULL;
    CHECK(braid_calloc(&nt, cap, sizeof(double)));
    for (uint32_t i = 0; i < q->n; i++) nt[i] = q->t[(q->head + i) % q->cap];
    free(q->t);
    q->t = nt, q->head = 0, q->cap = cap;
  }
  q->t[(q->head + q->n++) % q->cap] = t;
fail:
  return res;
}

/* ---- the heap of offered sends ---- */

struct sim_event {
  double t;
  int rank;
  uint32_t step;
};

struct sim_heap {
  struct sim_event* e;
  size_t n, cap;
};

static int event_before(const struct sim_event* a, const struct sim_event* b) {
  if (a->t != b->t) return a->t < b->t;
  if (a->rank != b->rank) return a->rank < b->rank;
  return a->step < b->step;
}

static ncclResult_t heap_push(struct sim_heap* h, struct sim_event ev) {
  ncclResult_t res = ncclSuccess;
  if (h->n == h->cap) {
    CHECK(braid_realloc(&h->e, h->cap ? 2 * h->cap : 1024, sizeof(*h->e)));
    h->cap = h->cap ? 2 * h->cap : 1024;
  }
  size_t i = h->n++;
  while (i > 0 && event_before(&ev, &h->e[(i - 1) / 2])) {
    h->e[i] = h->e[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->e[i] = ev;
fail:
  return res;
}

static struct sim_event heap_pop(struct sim_heap* h) {
  struct sim_event top = h->e[0], last = h->e[--h->n];
  size_t i = 0;
  for (;;) {
    size_t k = 2 * i + 1;
    if (k >= h->n) break;
    if (k + 1 < h->n && event_before(&h->e[k + 1], &h->e[k])) k++;
    if (!event_before(&h->e[k], &last)) break;
    h->e[i] = h->e[k];
    i = k;
  }
  if (h->n) h->e[i] = last;
  return top;
}

/* ---- ranks ---- */

#define REC_SEND_MADE 1u /* its send is offered (or on the heap) */
#define REC_SENT 2u      /* and has left the sender's port */

struct sim_rec {
  double post, end, sent, retire;
  unsigned flags;
};

struct sim_rank {
  const struct sim_step* steps;
  size_t nsteps, next_post, next_compute, retired;
  double cpu, last_retire;
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
  uint64_t messages;
};

static int step_sends(const struct sim_step* s) {
  return s->send >= 0;
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

/* Offer step i's send at `t` at the earliest: the CPU pays for the
 * message, and a connection's messages leave in the schedule's order. */
static ncclResult_t make_send(struct sim_engine* e, int r, size_t i, double t) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  struct sim_conn* out;
  CHECK(map_get(&k->out, k->steps[i].send, &out));
  t = MAX(t, k->cpu) + e->c->msg_us;
  k->cpu = t;
  t = MAX(t, out->last);
  out->last = t;
  k->recs[i % e->window].flags |= REC_SEND_MADE;
  CHECK(heap_push(&e->heap, (struct sim_event){t, r, (uint32_t)i}));
fail:
  return res;
}

/* Whether posted plain send i may go before the steps ahead of it are
 * computed: none of them still has to send on the same connection. */
static int may_send_early(const struct sim_engine* e, const struct sim_rank* k, size_t i) {
  for (size_t j = k->next_compute; j < i; j++)
    if (k->steps[j].send == k->steps[i].send && !(k->recs[j % e->window].flags & REC_SEND_MADE))
      return 0;
  return 1;
}

static int retire_steps(struct sim_engine* e, struct sim_rank* k) {
  int moved = 0;
  while (k->retired < k->next_compute) {
    struct sim_rec* rec = &k->recs[k->retired % e->window];
    int sends = step_sends(&k->steps[k->retired]);
    if (sends && !(rec->flags & REC_SENT)) break;
    k->last_retire = MAX(k->last_retire, MAX(rec->end, sends ? rec->sent : 0));
    rec->retire = k->last_retire;
    k->retired++;
    moved = 1;
  }
  return moved;
}

static ncclResult_t post_steps(struct sim_engine* e, int r, int* moved) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  while (k->next_post < k->nsteps && k->next_post - k->retired < e->window) {
    size_t i = k->next_post;
    const struct sim_step* st = &k->steps[i];
    if (st->piece_first && k->retired < i) break; /* a piece starts on a drained window */
    struct sim_rec* rec = &k->recs[i % e->window];
    double post = i >= e->window ? rec->retire : 0; /* step i - window's slot */
    if (st->piece_first) post = MAX(post, k->last_retire);
    memset(rec, 0, sizeof(*rec));
    rec->post = post;
    k->next_post++;
    *moved = 1;
    if (plain_send(st) && may_send_early(e, k, i)) CHECK(make_send(e, r, i, post));
  }
fail:
  return res;
}

/* Compute step i if its message is in; 0 if it must wait. */
static ncclResult_t compute_step(struct sim_engine* e, int r, size_t i, int* done) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  const struct sim_step* st = &k->steps[i];
  struct sim_rec* rec = &k->recs[i % e->window];
  double start = MAX(rec->post, k->cpu);
  *done = 0;
  if (st->prim == PRIM_EXCHANGE && !(rec->flags & REC_SEND_MADE))
    CHECK(make_send(e, r, i, start)); /* it sends Y once the steps before are done */
  if (sched_prim_recvs(st->prim)) {
    struct sim_conn* in;
    CHECK(map_get(&k->in, st->recv, &in));
    if (in->n == 0) return ncclSuccess;
    start = MAX(MAX(start, k->cpu), in->t[in->head]) + e->c->msg_us;
    in->head = (in->head + 1) % in->cap;
    in->n--;
  }
  rec->end = start + step_cost(e, st);
  if (rec->end > k->cpu) k->cpu = rec->end;
  if (step_sends(st) && !(rec->flags & REC_SEND_MADE)) CHECK(make_send(e, r, i, rec->end));
  *done = 1;
fail:
  return res;
}

/* Move rank r as far as what it knows allows. */
static ncclResult_t advance(struct sim_engine* e, int r) {
  ncclResult_t res = ncclSuccess;
  struct sim_rank* k = &e->ranks[r];
  int moved = 1;
  while (moved) {
    moved = retire_steps(e, k);
    CHECK(post_steps(e, r, &moved));
    while (k->next_compute < k->next_post) {
      int done;
      CHECK(compute_step(e, r, k->next_compute, &done));
      if (!done) break;
      k->next_compute++;
      moved = 1;
    }
  }
fail:
  return res;
}

/* ---- playing ---- */

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

static ncclResult_t deliver(struct sim_engine* e, struct sim_event ev) {
  ncclResult_t res = ncclSuccess;
  const struct sim_cluster* c = e->c;
  struct sim_rank* k = &e->ranks[ev.rank];
  const struct sim_step* st = &k->steps[ev.step];
  struct sim_rec* rec = &k->recs[ev.step % e->window];
  int to = st->send, rank, label;
  double arrived;
  struct sim_conn* in;
  landing(e, ev.rank, to, &rank, &label);
  int snode = e->p->symmetric ? 0 : ev.rank / c->per_node;
  int dnode = e->p->symmetric ? 0 : to / c->per_node;
  sim_net_send(&e->net, ev.rank, to, snode, ev.rank, dnode, rank, st->bytes, ev.t, &rec->sent,
               &arrived);
  rec->flags |= REC_SENT;
  CHECK(map_get(&e->ranks[rank].in, label, &in));
  CHECK(queue_push(in, arrived));
  e->messages++;
  CHECK(advance(e, rank));
  CHECK(advance(e, ev.rank));
fail:
  return res;
}

static ncclResult_t stuck(const struct sim_engine* e) {
  for (int r = 0; r < e->p->nsim; r++) {
    const struct sim_rank* k = &e->ranks[r];
    if (k->retired == k->nsteps) continue;
    const struct sim_step* st = &k->steps[k->next_compute < k->nsteps ? k->next_compute : 0];
    WARN(
        "braid-sim: rank %d stopped at step %zu of %zu (%s from rank %d): the schedules do not "
        "match",
        r, k->next_compute, k->nsteps, sched_prim_name(st->prim), st->recv);
    return ncclInternalError;
  }
  return ncclSuccess;
}

static void engine_free(struct sim_engine* e) {
  for (int r = 0; e->ranks && r < e->p->nsim; r++) {
    free(e->ranks[r].recs);
    map_free(&e->ranks[r].in);
    map_free(&e->ranks[r].out);
  }
  free(e->ranks);
  free(e->heap.e);
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
  for (int r = 0; r < p->nsim; r++) CHECK(advance(&e, r));
  while (e.heap.n) CHECK(deliver(&e, heap_pop(&e.heap)));
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
