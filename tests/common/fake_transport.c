/*
 * The fake rendezvous transport and the world of executor contexts it
 * wires (fake_transport.h).
 */
#include "fake_transport.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "layout.h"
#include "engine/redop.h"

/* A lending connection's memory, made at its first need (most of a
 * world's connections carry nothing), poisoned: a receive, a buffer per
 * message; a send, the room for one. NULL if the world does not lend. */
static unsigned char* fake_lend_mem(struct fake_conn* f) {
  size_t n = f->base.is_send ? 1 : TRANSPORT_MAX_INFLIGHT;
  if (f->lend_mem == NULL && f->lend_bytes > 0 && (f->lend_mem = malloc(n * f->lend_bytes)))
    memset(f->lend_mem, 0xA5, n * f->lend_bytes);
  return f->lend_mem;
}

/* Refuses what a real host transport refuses: a buffer of another kind. */
static ncclResult_t fake_post(struct transport_conn* c, const struct transport_buf* b,
                              const struct transport_tag* tag) {
  (void)tag;
  struct fake_conn* f = (struct fake_conn*)c;
  size_t k = c->posted % TRANSPORT_MAX_INFLIGHT;
  void* ptr = b->ptr;
  if (!transport_moves(c, b)) return ncclInternalError;
  if ((b->lend || b->in_place) && fake_lend_mem(f) == NULL) return ncclInternalError;
  if (b->lend) { /* a message of its own, free again */
    if (c->is_send || b->bytes > f->lend_bytes || f->lent[k]) return ncclInternalError;
    ptr = f->lend_mem + k * f->lend_bytes;
    f->lent[k] = 1;
    f->nlent++;
  }
  if (b->in_place && (!c->is_send || c->completed != c->posted || ptr != f->lend_mem))
    return ncclInternalError; /* not the room send_space gave, or something posted since */
  f->nin_place += (uint64_t)b->in_place;
  f->in_place[k] = b->in_place;
  f->bufs[k] = ptr;
  f->lens[k] = b->bytes;
  f->regs[k] = b->reg;
  c->posted++;
  return ncclSuccess;
}

/* The copy happens here, not at post: what a send posted too early points
 * at is read only when the receiver is there too. */
static ncclResult_t fake_progress(struct transport_conn* c, int* progressed) {
  struct fake_conn* s = (struct fake_conn*)c;
  struct fake_conn* r = s->other;
  if (!c->is_send) {
    r = s;
    s = s->other;
  }
  while (s->base.completed < s->base.posted && r->base.completed < r->base.posted) {
    size_t k = s->base.completed % TRANSPORT_MAX_INFLIGHT;
    if (s->lens[k] != r->lens[k]) s->mismatches++;
    memcpy(r->bufs[k], s->bufs[k], s->lens[k] < r->lens[k] ? s->lens[k] : r->lens[k]);
    if (s->in_place[k]) memset(s->lend_mem, 0x5A, s->lend_bytes); /* sent: the room is free */
    s->base.completed++;
    r->base.completed++;
    *progressed = 1;
  }
  return ncclSuccess;
}

static void fake_nop(struct transport_conn* c) {
  (void)c;
}

static size_t fake_lend_max(const struct transport_conn* c) {
  return c->is_send ? 0 : ((const struct fake_conn*)c)->lend_bytes;
}

static const void* fake_lent(const struct transport_conn* c, uint64_t seq) {
  const struct fake_conn* f = (const struct fake_conn*)c;
  size_t k = seq % TRANSPORT_MAX_INFLIGHT;
  assert_true(seq < c->completed && f->lent[k]);
  return f->bufs[k];
}

static ncclResult_t fake_lend_return(struct transport_conn* c, uint64_t seq) {
  struct fake_conn* f = (struct fake_conn*)c;
  size_t k = seq % TRANSPORT_MAX_INFLIGHT;
  if (seq >= c->completed || !f->lent[k]) return ncclInternalError;
  memset(f->bufs[k], 0xA5, f->lend_bytes);
  f->lent[k] = 0;
  return ncclSuccess;
}

/* A rendezvous send is queued until its receive came: room only then. */
static void* fake_send_space(struct transport_conn* c, size_t bytes) {
  struct fake_conn* f = (struct fake_conn*)c;
  if (!c->is_send || c->completed != c->posted || bytes > f->lend_bytes) return NULL;
  return fake_lend_mem(f);
}

const struct transport fake_transport = {.name = "fake",
                                         .caps = TRANSPORT_CAP_HOST_MEM,
                                         .post = fake_post,
                                         .progress = fake_progress,
                                         .shutdown = fake_nop,
                                         .close = fake_nop};

const struct transport fake_lending_transport = {.name = "fake-lending",
                                                 .caps = TRANSPORT_CAP_HOST_MEM,
                                                 .post = fake_post,
                                                 .progress = fake_progress,
                                                 .lend_max = fake_lend_max,
                                                 .lent = fake_lent,
                                                 .lend_return = fake_lend_return,
                                                 .send_space = fake_send_space,
                                                 .shutdown = fake_nop,
                                                 .close = fake_nop};

static void fake_wire(struct fake_world* w) {
  for (int a = 0; a < w->n; a++)
    for (int b = 0; b < w->n; b++) {
      struct fake_conn* s = &w->conns[a][b][0];
      struct fake_conn* r = &w->conns[a][b][1];
      s->base = (struct transport_conn){.ops = &fake_transport, .peer = b, .is_send = 1};
      r->base = (struct transport_conn){.ops = &fake_transport, .peer = a, .is_send = 0};
      s->other = r;
      r->other = s;
      w->send[a][b] = &s->base;
      w->recv[b][a] = &r->base;
    }
}

void fake_world_init(struct fake_world* w, int n, size_t slot_bytes, int window,
                     const uint64_t* hosts, const struct exec_backend* backend,
                     void* const* states) {
  memset(w, 0, sizeof(*w));
  w->n = n;
  fake_wire(w);
  if (hosts) assert_int_equal(sched_topo_init(&w->topo, n, hosts), ncclSuccess);
  for (int r = 0; r < n; r++) {
    struct exec_conf conf = {.rank = r,
                             .nranks = n,
                             .topo = &w->topo,
                             .send_conns = w->send[r],
                             .recv_conns = w->recv[r],
                             .backend = backend,
                             .backend_state = states ? states[r] : NULL,
                             .aborted = &w->aborted,
                             .timeout_ms = 60000,
                             .window = window,
                             .slot_bytes = slot_bytes};
    assert_int_equal(exec_init(&w->ex[r], &conf), ncclSuccess);
  }
}

void fake_world_place(struct fake_world* w, const int* cache) {
  if (w->topo.nranks == 0) {
    uint64_t hosts[FAKE_MAXR] = {0};
    assert_int_equal(sched_topo_init(&w->topo, w->n, hosts), ncclSuccess);
  }
  sched_topo_place(&w->topo, cache, NULL);
}

void fake_world_lend(struct fake_world* w, size_t bytes) {
  for (int a = 0; a < w->n; a++)
    for (int b = 0; b < w->n; b++)
      for (int d = 0; d < 2; d++) {
        w->conns[a][b][d].base.ops = &fake_lending_transport;
        w->conns[a][b][d].lend_bytes = bytes;
      }
}

void fake_world_lend_counts(const struct fake_world* w, uint64_t* lent, uint64_t* in_place) {
  *lent = *in_place = 0;
  for (int a = 0; a < w->n; a++)
    for (int b = 0; b < w->n; b++) {
      *lent += w->conns[a][b][1].nlent;
      *in_place += w->conns[a][b][0].nin_place;
    }
}

void fake_world_free(struct fake_world* w) {
  for (int a = 0; a < w->n; a++)
    for (int b = 0; b < w->n; b++)
      for (int d = 0; d < 2; d++) {
        struct fake_conn* f = &w->conns[a][b][d];
        for (int k = 0; k < TRANSPORT_MAX_INFLIGHT; k++)
          assert_false(f->lent[k]); /* every lent message given back */
        free(f->lend_mem);
      }
  for (int r = 0; r < w->n; r++) exec_free(&w->ex[r]);
  sched_topo_free(&w->topo);
}

void fake_world_run(struct fake_world* w, const struct exec_args* args) {
  int done[FAKE_MAXR] = {0}, left = w->n;
  struct transport_tag tag;
  memset(&tag, 0, sizeof(tag));
  for (int r = 0; r < w->n; r++) assert_int_equal(exec_start(&w->ex[r], &args[r], &tag), 0);
  for (int spins = 0; left > 0; spins++) {
    assert_true(spins < 10000000);
    for (int r = 0; r < w->n; r++) {
      int progressed = 0;
      if (done[r]) continue;
      assert_int_equal(exec_progress(&w->ex[r], &done[r], &progressed), ncclSuccess);
      if (done[r]) left--;
    }
  }
  for (int a = 0; a < w->n; a++)
    for (int b = 0; b < w->n; b++) {
      if (w->conns[a][b][0].mismatches) /* which call's schedules disagree, and where */
        fprintf(stderr,
                "message order differs: %s, algorithm %d, %d ranks, count %zu, root %d, "
                "chunk %zu bytes, from rank %d to %d\n",
                sched_coll_name(args[0].coll), args[0].algo, w->n, args[0].count, args[0].root,
                args[0].chunk_bytes, a, b);
      assert_int_equal(w->conns[a][b][0].mismatches, 0);
    }
}

void fake_args(struct exec_args* a, int n, int coll, int algo, int root, const void* send,
               void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, size_t chunk) {
  memset(a, 0, sizeof(*a));
  redop_builtin(op, type, n, a);
  a->coll = coll;
  a->algo = algo;
  a->root = root;
  a->sendbuff = send;
  a->recvbuff = recv;
  a->count = count;
  a->type = type;
  a->mem = MEM_HOST;
  a->chunk_bytes = chunk;
}
