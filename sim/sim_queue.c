/*
 * Connections, arrival queues and the event heap (sim_queue.h).
 */
#include "sim_queue.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

void sim_map_free(struct sim_map* m) {
  for (uint32_t i = 0; i < m->cap; i++) free(m->slots[i].t);
  free(m->slots);
  memset(m, 0, sizeof(*m));
}

static uint32_t slot_of(int peer, uint32_t cap) {
  return (uint32_t)peer * 2654435761u & (cap - 1);
}

static ncclResult_t map_grow(struct sim_map* m) {
  ncclResult_t res = ncclSuccess;
  struct sim_map g = {NULL, m->cap ? 2 * m->cap : 8, 0};
  CHECK(braid_calloc(&g.slots, g.cap, sizeof(*g.slots)));
  for (uint32_t i = 0; i < g.cap; i++) g.slots[i].peer = -1;
  for (uint32_t i = 0; i < m->cap; i++) {
    if (m->slots[i].peer < 0) continue;
    uint32_t j = slot_of(m->slots[i].peer, g.cap);
    while (g.slots[j].peer >= 0) j = (j + 1) & (g.cap - 1);
    g.slots[j] = m->slots[i];
    g.n++;
  }
  free(m->slots);
  *m = g;
fail:
  return res;
}

ncclResult_t sim_map_get(struct sim_map* m, int peer, struct sim_conn** out) {
  ncclResult_t res = ncclSuccess;
  if (2 * (m->n + 1) > m->cap) CHECK(map_grow(m));
  uint32_t j = slot_of(peer, m->cap);
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

ncclResult_t sim_conn_push(struct sim_conn* q, double t) {
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

double sim_conn_pop(struct sim_conn* q) {
  double t = q->t[q->head];
  q->head = (q->head + 1) % q->cap;
  q->n--;
  return t;
}

static int event_before(const struct sim_event* a, const struct sim_event* b) {
  if (a->t != b->t) return a->t < b->t;
  if (a->local != b->local) return a->local < b->local;
  if (a->step != b->step) return a->step < b->step;
  if (a->kind != b->kind) return a->kind < b->kind;
  return a->rank < b->rank;
}

ncclResult_t sim_heap_push(struct sim_heap* h, struct sim_event ev) {
  ncclResult_t res = ncclSuccess;
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 1024;
    CHECK(braid_realloc(&h->e, cap, sizeof(*h->e)));
    h->cap = cap;
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

struct sim_event sim_heap_pop(struct sim_heap* h) {
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

void sim_heap_free(struct sim_heap* h) {
  free(h->e);
  memset(h, 0, sizeof(*h));
}
