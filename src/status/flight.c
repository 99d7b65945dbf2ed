/*
 * The flight recorder (flight.h): a ring of entries per comm and the
 * snapshot a rank gives of it. Recording costs a few stores per call and,
 * once a millisecond while it moves, a few loads per link; the clock is the
 * coarse one unless per-call times are logged.
 */
#include "status/flight.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "status/flight_oplog.h"
#include "param.h"
#include "siphash.h"
#include "transport.h"

#define FLIGHT_LOOK_NS 1000000u /* a moving call's links are counted once a ms */

ncclResult_t flight_init(struct flight* f) {
  memset(f, 0, sizeof(*f));
  f->cap = (uint32_t)param_flight_entries();
  pthread_mutex_init(&f->lock, NULL);
  f->inited = 1;
  f->precise = param_op_log() != NULL;
  return f->cap ? braid_calloc(&f->ring, f->cap, sizeof(*f->ring)) : ncclSuccess;
}

void flight_set_comm(struct flight* f, int rank, int nranks, uint64_t secret) {
  static const char what[] = "braid status: comm id";
  f->rank = rank;
  f->nranks = nranks;
  f->comm_id = siphash24(secret, ~secret, what, sizeof(what));
}

void flight_free(struct flight* f) {
  if (!f->inited) return; /* never made */
  flight_oplog_close(f);
  free(f->ring);
  pthread_mutex_destroy(&f->lock);
  memset(f, 0, sizeof(*f));
}

/* The recorder's clock: the coarse one (a few ns, ms-accurate: ages are
 * shown in tenths of seconds) unless per-call times are logged. */
static uint64_t flight_now(const struct flight* f) {
  struct timespec ts;
  if (f->precise) return braid_now_ns();
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The entry a call writes, while nobody took it over. */
static struct flight_entry* mine(struct flight_mark m) {
  if (m.entry == NULL || atomic_load_explicit(&m.entry->seq, memory_order_relaxed) != m.seq)
    return NULL;
  return m.entry;
}

/* The numbers have one writer at a time (who holds the comm's turn lock:
 * work_issue, lane_post): a load and a store, no locked instruction. */
static uint64_t bump(_Atomic uint64_t* counter, uint64_t by) {
  uint64_t v = atomic_load_explicit(counter, memory_order_relaxed) + by;
  atomic_store_explicit(counter, v, memory_order_relaxed);
  return v;
}

struct flight_mark flight_enqueue(struct flight* f, const struct flight_call* c) {
  struct flight_mark m = {NULL, 0};
  if (f->ring == NULL) return m; /* BRAID_FLIGHT_ENTRIES=0 */
  m.seq = bump(&f->next_seq, 1);
  struct flight_entry* e = m.entry = &f->ring[m.seq % f->cap];
  atomic_store_explicit(&e->seq, 0, memory_order_relaxed); /* readers skip it while written */
  atomic_thread_fence(memory_order_release);
  e->coll_seq = c->kind == FLIGHT_COLL ? bump(&f->next_coll, 1) : 0;
  e->kind = c->kind, e->coll = c->coll, e->type = c->type, e->op = c->op;
  e->root = c->root, e->peer = c->peer, e->tag = c->tag, e->algo = -1;
  e->count = c->count, e->bytes = c->bytes;
  e->enq_ns = flight_now(f);
  atomic_store_explicit(&e->start_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&e->end_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&e->state, FLIGHT_QUEUED, memory_order_relaxed);
  atomic_store_explicit(&e->status, ncclSuccess, memory_order_relaxed);
  atomic_store_explicit(&e->nlinks, 0, memory_order_relaxed);
  atomic_store_explicit(&e->seq, m.seq, memory_order_release);
  return m;
}

static void link_init(struct flight_link* l, const struct flight_link_src* s, uint64_t now) {
  struct transport_conn* c = s->conn;
  l->peer = s->peer;
  l->dir = (uint8_t)s->dir;
  l->transport = (uint8_t)c->ops->id;
  l->conn = c;
  l->base_posted = c->posted_bytes;
  l->base_done = transport_conn_done_bytes(c);
  atomic_store_explicit(&l->posted, 0, memory_order_relaxed);
  atomic_store_explicit(&l->done, 0, memory_order_relaxed);
  atomic_store_explicit(&l->moved_ns, now, memory_order_relaxed);
}

void flight_start(struct flight* f, struct flight_mark m, int algo,
                  const struct flight_link_src* links, int n) {
  struct flight_entry* e = mine(m);
  if (e == NULL) return;
  uint64_t now = flight_now(f);
  uint32_t k = 0;
  for (int i = 0; i < n && k < FLIGHT_LINKS; i++)
    if (links[i].conn != NULL) link_init(&e->links[k++], &links[i], now);
  e->algo = algo;
  e->looked_ns = now;
  atomic_store_explicit(&e->nlinks, k, memory_order_release);
  atomic_store_explicit(&e->start_ns, now, memory_order_relaxed);
  atomic_store_explicit(&e->state, FLIGHT_RUNNING, memory_order_relaxed);
}

void flight_progress(struct flight* f, struct flight_mark m, int now_idle) {
  struct flight_entry* e = mine(m);
  if (e == NULL) return;
  uint64_t now = flight_now(f);
  if (!now_idle && now - e->looked_ns < FLIGHT_LOOK_NS) return;
  e->looked_ns = now;
  uint32_t n = atomic_load_explicit(&e->nlinks, memory_order_relaxed);
  for (uint32_t i = 0; i < n; i++) {
    struct flight_link* l = &e->links[i];
    uint64_t d = transport_conn_done_bytes(l->conn) - l->base_done;
    atomic_store_explicit(&l->posted, l->conn->posted_bytes - l->base_posted, memory_order_relaxed);
    if (d == atomic_load_explicit(&l->done, memory_order_relaxed)) continue;
    atomic_store_explicit(&l->done, d, memory_order_relaxed);
    atomic_store_explicit(&l->moved_ns, now, memory_order_relaxed);
  }
}

void flight_end(struct flight* f, struct flight_mark m, ncclResult_t status) {
  struct flight_entry* e = mine(m);
  if (e == NULL) return;
  int state = atomic_load_explicit(&e->state, memory_order_relaxed);
  if (state != FLIGHT_QUEUED && state != FLIGHT_RUNNING) return; /* ended already */
  uint64_t now = flight_now(f), start = atomic_load_explicit(&e->start_ns, memory_order_relaxed);
  atomic_store_explicit(&e->end_ns, now, memory_order_relaxed);
  atomic_store_explicit(&e->status, status, memory_order_relaxed);
  atomic_store_explicit(&e->state, status == ncclSuccess ? FLIGHT_DONE : FLIGHT_FAILED,
                        memory_order_release);
  /* the comm's engine and its tagged lane end calls on two threads */
  atomic_fetch_add_explicit(status == ncclSuccess ? &f->ops_done : &f->ops_failed, 1,
                            memory_order_relaxed);
  if (status == ncclSuccess)
    atomic_fetch_add_explicit(&f->bytes_done, e->bytes, memory_order_relaxed);
  if (f->precise) flight_oplog_write(f, e, now - (start ? start : now), status);
}

void flight_note_error(struct flight* f, ncclResult_t code, const char* what) {
  if (!f->inited) return;
  pthread_mutex_lock(&f->lock);
  if (f->last_error_code == ncclSuccess) { /* the first: what the rest follow from */
    snprintf(f->last_error, sizeof(f->last_error), "%s", what && *what ? what : "");
    f->last_error_code = code;
    f->last_error_wall_ms = wall_ms();
  }
  pthread_mutex_unlock(&f->lock);
}

/* ---- the snapshot ---- */

static int64_t age_ms(uint64_t now, uint64_t then) {
  return then == 0 ? -1 : (int64_t)((now - MIN(now, then)) / 1000000u);
}

/* A consistent copy of entry e into w, false when it is unused or was
 * being rewritten meanwhile. */
static int entry_copy(const struct flight_entry* e, uint64_t now, struct flight_wire_entry* w) {
  uint64_t seq = atomic_load_explicit(&e->seq, memory_order_acquire);
  if (seq == 0) return 0;
  memset(w, 0, sizeof(*w));
  w->seq = seq;
  w->coll_seq = e->coll_seq;
  w->kind = e->kind, w->coll = e->coll, w->type = e->type, w->op = e->op;
  w->algo = e->algo, w->root = e->root, w->peer = e->peer, w->tag = e->tag;
  w->count = e->count, w->bytes = e->bytes;
  w->state = atomic_load_explicit(&e->state, memory_order_acquire);
  w->status = atomic_load_explicit(&e->status, memory_order_relaxed);
  w->enq_age_ms = age_ms(now, e->enq_ns);
  w->start_age_ms = age_ms(now, atomic_load_explicit(&e->start_ns, memory_order_relaxed));
  w->end_age_ms = age_ms(now, atomic_load_explicit(&e->end_ns, memory_order_relaxed));
  w->nlinks = MIN(atomic_load_explicit(&e->nlinks, memory_order_acquire), FLIGHT_LINKS);
  for (uint32_t i = 0; i < w->nlinks; i++) {
    const struct flight_link* l = &e->links[i];
    w->links[i] = (struct flight_wire_link){
        .peer = l->peer,
        .dir = l->dir,
        .transport = l->transport,
        .posted = atomic_load_explicit(&l->posted, memory_order_relaxed),
        .done = atomic_load_explicit(&l->done, memory_order_relaxed),
        .idle_ms = age_ms(now, atomic_load_explicit(&l->moved_ns, memory_order_relaxed))};
  }
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&e->seq, memory_order_relaxed) == seq;
}

static int by_seq(const void* a, const void* b) {
  const struct flight_wire_entry *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* The newest entries first: every unfinished one, then finished ones
 * while there is room; in call order. */
static void snapshot_entries(struct flight* f, uint64_t now, struct flight_wire* w) {
  for (int pass = 0; pass < 2; pass++)
    for (uint64_t k = 0; k < f->cap && w->nentries < FLIGHT_WIRE_ENTRIES; k++) {
      if (w->next_seq < k + 1) break;
      struct flight_wire_entry x;
      if (!entry_copy(&f->ring[(w->next_seq - k) % f->cap], now, &x)) continue;
      int open = x.state == FLIGHT_QUEUED || x.state == FLIGHT_RUNNING;
      if (open == (pass == 0)) w->entries[w->nentries++] = x;
    }
  qsort(w->entries, w->nentries, sizeof(w->entries[0]), by_seq);
}

void flight_snapshot(struct flight* f, struct flight_wire* w) {
  uint64_t now = flight_now(f);
  memset(w, 0, sizeof(*w));
  w->magic = FLIGHT_WIRE_MAGIC;
  w->version = FLIGHT_WIRE_VERSION;
  w->rank = f->rank;
  w->nranks = f->nranks;
  w->pid = (int32_t)getpid();
  w->comm_id = f->comm_id;
  w->next_seq = atomic_load(&f->next_seq);
  w->next_coll = atomic_load(&f->next_coll);
  w->ops_done = atomic_load(&f->ops_done);
  w->ops_failed = atomic_load(&f->ops_failed);
  w->bytes_done = atomic_load(&f->bytes_done);
  w->now_wall_ms = wall_ms();
  gethostname(w->host, sizeof(w->host) - 1);
  pthread_mutex_lock(&f->lock);
  w->last_error_code = f->last_error_code;
  w->last_error_wall_ms = f->last_error_wall_ms;
  memcpy(w->last_error, f->last_error, sizeof(w->last_error));
  pthread_mutex_unlock(&f->lock);
  if (f->ring) snapshot_entries(f, now, w);
}
