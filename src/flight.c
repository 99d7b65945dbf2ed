/*
 * The flight recorder (flight.h): a ring of entries per comm, the snapshot
 * a rank gives of it, its JSON, the dump a failing rank writes and the
 * per-operation log. Recording costs a few stores per operation and a few
 * loads per pass of the engine; time comes from the vDSO clock.
 */
#include "flight.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "connect.h"
#include "core.h"
#include "exec_plan.h"
#include "host.h"
#include "kernels.h"
#include "param.h"
#include "siphash.h"
#include "work_op.h"

ncclResult_t flight_init(struct flight* f) {
  memset(f, 0, sizeof(*f));
  f->cap = (uint32_t)param_flight_entries();
  pthread_mutex_init(&f->lock, NULL);
  f->inited = 1;
  f->precise = param_op_log() != NULL;
  return f->cap ? braid_calloc(&f->ring, f->cap, sizeof(*f->ring)) : ncclSuccess;
}

void flight_free(struct flight* f) {
  if (!f->inited) return; /* never made */
  if (f->oplog) fclose(f->oplog);
  free(f->ring);
  pthread_mutex_destroy(&f->lock);
  memset(f, 0, sizeof(*f));
}

#define FLIGHT_LOOK_NS 1000000u /* a moving call's links are counted once a ms */

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

/* The entry an operation writes, while nobody took it over (the ring
 * wrapped around a long-running one: it then records nothing more). */
static struct flight_entry* mine(const struct work_op* op) {
  struct flight_entry* e = op->flight;
  if (e == NULL || atomic_load_explicit(&e->seq, memory_order_relaxed) != op->flight_seq)
    return NULL;
  return e;
}

/* The comm's counters have one writer at a time (the thread whose unit
 * has the comm's turn): a load and a store, no locked instruction. */
static uint64_t bump(_Atomic uint64_t* counter, uint64_t by) {
  uint64_t v = atomic_load_explicit(counter, memory_order_relaxed) + by;
  atomic_store_explicit(counter, v, memory_order_relaxed);
  return v;
}

void flight_enqueue(struct flight* f, struct work_op* op) {
  op->flight = NULL;
  if (f->ring == NULL) return; /* BRAID_FLIGHT_ENTRIES=0 */
  uint64_t seq = bump(&f->next_seq, 1);
  struct flight_entry* e = &f->ring[seq % f->cap];
  atomic_store_explicit(&e->seq, 0, memory_order_relaxed); /* readers skip it while written */
  atomic_thread_fence(memory_order_release);
  e->kind = op->kind == WORK_COLL ? FLIGHT_COLL : op->kind == WORK_SEND ? FLIGHT_SEND : FLIGHT_RECV;
  e->coll_seq = op->kind == WORK_COLL ? bump(&f->next_coll, 1) : 0;
  e->coll = op->kind == WORK_COLL ? op->args.coll : -1;
  e->type = op->kind == WORK_COLL ? (int32_t)op->args.type : (int32_t)ncclUint8;
  e->op = op->kind == WORK_COLL ? (int32_t)op->args.redop.op : -1;
  e->algo = -1;
  e->root = op->kind == WORK_COLL ? op->args.root : -1;
  e->peer = op->kind == WORK_COLL ? -1 : op->peer;
  e->count = op->kind == WORK_COLL ? op->args.count : op->bytes;
  if (op->kind == WORK_COLL) {
    size_t send, recv;
    exec_extents(&op->args, op->comm->nranks, &send, &recv);
    e->bytes = MAX(send, recv);
  } else {
    e->bytes = op->bytes;
  }
  e->enq_ns = flight_now(f);
  atomic_store_explicit(&e->start_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&e->end_ns, 0, memory_order_relaxed);
  atomic_store_explicit(&e->state, FLIGHT_QUEUED, memory_order_relaxed);
  atomic_store_explicit(&e->status, ncclSuccess, memory_order_relaxed);
  atomic_store_explicit(&e->nlinks, 0, memory_order_relaxed);
  atomic_store_explicit(&e->seq, seq, memory_order_release);
  op->flight = e;
  op->flight_seq = seq;
}

static void link_add(struct flight_entry* e, uint32_t* n, int peer, int dir,
                     struct transport_conn* c, uint64_t now) {
  if (c == NULL || *n == FLIGHT_LINKS) return;
  struct flight_link* l = &e->links[(*n)++];
  l->peer = peer;
  l->dir = (uint8_t)dir;
  l->transport = (uint8_t)c->ops->id;
  l->conn = c;
  l->base_posted = c->posted_bytes;
  l->base_done = transport_conn_done_bytes(c);
  atomic_store_explicit(&l->posted, 0, memory_order_relaxed);
  atomic_store_explicit(&l->done, 0, memory_order_relaxed);
  atomic_store_explicit(&l->moved_ns, now, memory_order_relaxed);
}

void flight_start(struct work_op* op) {
  struct flight_entry* e = mine(op);
  if (e == NULL) return;
  struct ncclComm* comm = op->comm;
  uint64_t now = flight_now(&comm->flight);
  uint32_t n = 0;
  if (op->kind != WORK_COLL) {
    link_add(e, &n, op->peer, op->kind == WORK_SEND,
             *work_conn_slot(op, op->peer, op->kind == WORK_SEND), now);
  } else if (op->direct) {
    e->algo = FLIGHT_ALGO_DIRECT;
  } else {
    int peers[FLIGHT_LINKS];
    int m = sched_peers(&op->key, peers, FLIGHT_LINKS);
    for (int i = 0; i < m; i++) {
      if (peers[i] == comm->rank) continue;
      link_add(e, &n, peers[i], 0, comm->recv_conns[peers[i]], now);
      link_add(e, &n, peers[i], 1, comm->send_conns[peers[i]], now);
    }
    e->algo = op->args.algo;
  }
  e->looked_ns = now;
  atomic_store_explicit(&e->nlinks, n, memory_order_release);
  atomic_store_explicit(&e->start_ns, now, memory_order_relaxed);
  atomic_store_explicit(&e->state, FLIGHT_RUNNING, memory_order_relaxed);
}

void flight_progress(struct work_op* op, int now_idle) {
  struct flight_entry* e = mine(op);
  if (e == NULL) return;
  uint64_t now = flight_now(&op->comm->flight);
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

/* nccl-tests' bus bandwidth factor of a collective on n ranks. */
static double bus_factor(int kind, int coll, int n) {
  if (kind != FLIGHT_COLL || n < 2) return 1.0;
  if (coll == COLL_ALLREDUCE) return 2.0 * (n - 1) / n;
  if (coll == COLL_ALLGATHER || coll == COLL_REDUCESCATTER) return (double)(n - 1) / n;
  return 1.0;
}

/* The transports an entry's links use, as JSON strings: "shm","tcp". */
static void transports_used(const struct flight_entry* e, char* out, size_t cap) {
  unsigned seen = 0;
  size_t o = 0;
  out[0] = '\0';
  for (uint32_t i = 0; i < atomic_load_explicit(&e->nlinks, memory_order_relaxed); i++) {
    unsigned t = e->links[i].transport;
    if (t >= 32 || (seen & (1u << t))) continue;
    seen |= 1u << t;
    o += (size_t)snprintf(out + o, cap - MIN(o, cap), "%s\"%s\"", o ? "," : "",
                          flight_transport_name((int)t));
    if (o >= cap) break;
  }
}

/* BRAID_OP_LOG: one JSON line per operation, in a file of this process
 * (%h host, %p pid in its name), opened at the first operation. */
static void oplog_write(struct ncclComm* comm, const struct flight_entry* e, uint64_t ns,
                        ncclResult_t status) {
  struct flight* f = &comm->flight;
  const char* pattern = param_op_log();
  if (pattern == NULL) return;
  pthread_mutex_lock(&f->lock);
  if (!f->oplog_tried) {
    char path[512];
    f->oplog_tried = 1;
    host_expand_path(pattern, path, sizeof(path));
    /* this user's alone: it tells what the job moves */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
    f->oplog = fd >= 0 ? fdopen(fd, "a") : NULL;
    if (f->oplog == NULL) {
      if (fd >= 0) close(fd);
      WARN("BRAID_OP_LOG %s: %s; no per-operation records", path, strerror(errno));
    }
  }
  if (f->oplog) {
    double s = (double)ns / 1e9, algbw = s > 0 ? (double)e->bytes / s / 1e9 : 0;
    char transports[64];
    transports_used(e, transports, sizeof(transports));
    fprintf(f->oplog,
            "{\"rank\":%d,\"nranks\":%d,\"seq\":%" PRIu64
            ",\"op\":\"%s\",\"type\":\"%s\","
            "\"bytes\":%" PRIu64
            ",\"time_us\":%.3f,\"algbw_gbps\":%.4f,\"busbw_gbps\":%.4f,"
            "\"algo\":\"%s\",\"transports\":[%s],\"status\":\"%s\"}\n",
            comm->rank, comm->nranks, atomic_load(&e->seq), flight_op_name(e->kind, e->coll),
            flight_type_name(e->type), e->bytes, s * 1e6, algbw,
            algbw * bus_factor(e->kind, e->coll, comm->nranks), flight_algo_name(e->algo),
            transports, ncclGetErrorString(status));
    fflush(f->oplog);
  }
  pthread_mutex_unlock(&f->lock);
}

void flight_end(struct work_op* op, ncclResult_t status) {
  struct flight_entry* e = mine(op);
  if (e == NULL) return;
  int state = atomic_load_explicit(&e->state, memory_order_relaxed);
  if (state != FLIGHT_QUEUED && state != FLIGHT_RUNNING) return; /* ended already */
  struct flight* f = &op->comm->flight;
  uint64_t now = flight_now(f), start = atomic_load_explicit(&e->start_ns, memory_order_relaxed);
  if (start == 0) start = now;
  atomic_store_explicit(&e->end_ns, now, memory_order_relaxed);
  atomic_store_explicit(&e->status, status, memory_order_relaxed);
  atomic_store_explicit(&e->state, status == ncclSuccess ? FLIGHT_DONE : FLIGHT_FAILED,
                        memory_order_release);
  bump(status == ncclSuccess ? &f->ops_done : &f->ops_failed, 1);
  if (status == ncclSuccess) bump(&f->bytes_done, e->bytes);
  if (f->precise) oplog_write(op->comm, e, now - start, status);
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
  w->algo = e->algo, w->root = e->root, w->peer = e->peer;
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

uint64_t flight_comm_id(const struct ncclComm* comm) {
  static const char what[] = "braid status: comm id";
  return siphash24(comm->tctx.secret, ~comm->tctx.secret, what, sizeof(what));
}

void flight_snapshot(struct ncclComm* comm, struct flight_wire* w) {
  struct flight* f = &comm->flight;
  uint64_t now = flight_now(f);
  memset(w, 0, sizeof(*w));
  w->magic = FLIGHT_WIRE_MAGIC;
  w->version = FLIGHT_WIRE_VERSION;
  w->rank = comm->rank;
  w->nranks = comm->nranks;
  w->pid = (int32_t)getpid();
  w->comm_id = flight_comm_id(comm);
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
  if (f->ring == NULL) return;
  /* the newest first: every unfinished one, then finished ones while room */
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
