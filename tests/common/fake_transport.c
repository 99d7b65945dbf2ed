/*
 * The fake rendezvous transport and the world of executor contexts it
 * wires (fake_transport.h).
 */
#include "fake_transport.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <string.h>

#include "comm.h"
#include "layout.h"
#include "redop.h"

/* Refuses what a real host transport refuses: a buffer of another kind. */
static ncclResult_t fake_post(struct transport_conn* c, const struct transport_buf* b,
                              const struct transport_tag* tag) {
  (void)tag;
  struct fake_conn* f = (struct fake_conn*)c;
  if (!transport_moves(c, b)) return ncclInternalError;
  f->bufs[c->posted % TRANSPORT_MAX_INFLIGHT] = b->ptr;
  f->lens[c->posted % TRANSPORT_MAX_INFLIGHT] = b->bytes;
  f->regs[c->posted % TRANSPORT_MAX_INFLIGHT] = b->reg;
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
    s->base.completed++;
    r->base.completed++;
    *progressed = 1;
  }
  return ncclSuccess;
}

static void fake_nop(struct transport_conn* c) {
  (void)c;
}

const struct transport fake_transport = {.name = "fake",
                                         .caps = TRANSPORT_CAP_HOST_MEM,
                                         .post = fake_post,
                                         .progress = fake_progress,
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

void fake_world_free(struct fake_world* w) {
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
    for (int b = 0; b < w->n; b++) assert_int_equal(w->conns[a][b][0].mismatches, 0);
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
