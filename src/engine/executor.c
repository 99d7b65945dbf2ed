/*
 * Executor: posts receives up to a window ahead, posts each step's
 * reduction or copy to the backend as a task once its data is in, posts
 * the step's send once that task is done (a plain send of data already
 * final goes when posted), and retires steps whose sends are out.
 * Partials land in staging slots; final data is received straight into
 * the user's output buffer, so all-gather steps copy nothing. A call on
 * device memory runs on the device backend, staged (executor.h: slots
 * carry everything) unless every connection it uses reads and writes
 * device memory itself (exec_piece_direct).
 */
#include "engine/executor.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "engine/exec_step.h"
#include "sched_build.h"

ncclResult_t exec_init(struct exec_ctx* ex, const struct exec_conf* conf) {
  memset(ex, 0, sizeof(*ex));
  ex->conf = *conf;
  /* Rendezvous transports (a send completes once the peer posted the
   * receive) need slack: with one step in flight the ring deadlocks, with
   * two the double tree's leaf-first order does (the fake-transport test
   * finds both); four is the floor. */
  ex->window = MAX(4, MIN(conf->window, EXEC_MAX_WINDOW));
  ex->nslots = ex->window;
  ex->slot_bytes = ALIGN_UP(conf->slot_bytes, 4096);
  ex->slot_mem = aligned_alloc(4096, ex->slot_bytes * (size_t)ex->nslots);
  if (ex->slot_mem == NULL) {
    WARN("Out of memory for %d staging slots of %zu bytes", ex->nslots, ex->slot_bytes);
    return ncclSystemError;
  }
  for (int i = 0; i < ex->nslots; i++) ex->free_slots[i] = i;
  ex->nfree = ex->nslots;
  for (int i = 0; i < SCHED_CARRIES; i++) ex->carry[i] = -1;
  return ncclSuccess;
}

void exec_set_device_backend(struct exec_ctx* ex, const struct exec_backend* backend, void* state) {
  ex->dev_backend = backend;
  ex->dev_state = state;
}

void exec_slots(const struct exec_ctx* ex, void** base, size_t* bytes) {
  *base = ex->slot_mem;
  *bytes = ex->slot_bytes * (size_t)ex->nslots;
}

void exec_free(struct exec_ctx* ex) {
  free(ex->slot_mem);
  ex->slot_mem = NULL;
  sched_cache_free(&ex->cache);
}

/* Post one message of the running call. The staging slots are host memory
 * the comm owns (a transport may keep them registered); anything else is
 * the user's, of the kind the plan found, maybe inside a registration (of
 * the receive buffer, else of the send buffer). */
static ncclResult_t post_msg(struct exec_ctx* ex, struct transport_conn* c, void* ptr,
                             size_t bytes) {
  const char* p = ptr;
  const struct exec_args* a = &ex->args;
  struct transport_buf b;
  if (p >= ex->slot_mem && p < ex->slot_mem + (size_t)ex->nslots * ex->slot_bytes) {
    b = mem_transport_buf(ptr, bytes, MEM_HOST, NULL, c->ops);
    b.owned = 1;
  } else {
    b = mem_transport_buf(ptr, bytes, a->mem, a->recvreg, c->ops);
    if (b.reg == NULL) b = mem_transport_buf(ptr, bytes, a->mem, a->sendreg, c->ops);
  }
  return transport_conn_post(c, &b, &ex->tag);
}

/* Whether step st's received operand R may stay where the transport put
 * it (transport.h, lend_max) until the step's task has read it, saving
 * the copy into a slot: a host call's reductions (exchanges too), where
 * the task reads R once. */
static int step_lends(const struct exec_ctx* ex, const struct sched_step* st) {
  if (ex->lend_bytes == 0 || !(sched_prim_reads_local(st->prim) || st->prim == PRIM_EXCHANGE))
    return 0;
  const struct transport_conn* c = ex->conf.recv_conns[st->recv_peer];
  return c->ops->lend_max && ex->lend_bytes <= c->ops->lend_max(c);
}

/* Post a receive the transport lends (step_lends). */
static ncclResult_t post_lent_recv(struct exec_ctx* ex, struct transport_conn* c, size_t bytes) {
  struct transport_buf b = {.bytes = bytes, .mem = TRANSPORT_CAP_HOST_MEM, .lend = 1};
  return transport_conn_post(c, &b, &ex->tag);
}

/* Post the send its task wrote in place (step_send_in_place). */
static ncclResult_t post_in_place(struct exec_ctx* ex, struct transport_conn* c, void* ptr,
                                  size_t bytes) {
  struct transport_buf b = {
      .ptr = ptr, .bytes = bytes, .mem = TRANSPORT_CAP_HOST_MEM, .in_place = 1};
  return transport_conn_post(c, &b, &ex->tag);
}

/* Receives into a slot when the received data must be combined first
 * (unless it is lent: then only a result that is not Y needs one); a
 * pre-multiplied send stages its scaled copy in a slot too. Staged, every
 * step that moves data has a slot, and an exchange a second one for the
 * copy of Y it sends. */
static int step_slots(const struct exec_ctx* ex, const struct sched_step* st, int lent) {
  switch (st->prim) {
    case PRIM_RECV_REDUCE_SEND:
    case PRIM_RECV_REDUCE_CARRY:
      return 1;
    case PRIM_RECV_REDUCE_COPY_SEND:
    case PRIM_RECV_REDUCE_COPY:
      return !lent;
    case PRIM_EXCHANGE:
      return ex->staged ? 2 : !lent;
    case PRIM_SEND:
      return ex->staged || ((st->flags & SCHED_PRE) && ex->args.pre);
    case PRIM_LOAD_CARRY:
      return (st->flags & SCHED_PRE) && ex->args.pre;
    case PRIM_RECV:
    case PRIM_RECV_COPY_SEND:
    case PRIM_SEND_OUT:
      return ex->staged;
    default:
      return 0;
  }
}

void exec_ctx_key(const struct exec_ctx* ex, const struct exec_args* args, struct sched_key* key) {
  const struct sched_topo* t = ex->conf.topo;
  memset(key, 0, sizeof(*key));
  key->topo = t && t->nranks > 0 ? t : NULL;
  key->coll = args->coll;
  key->algo = args->algo;
  key->rank = args->group_ranks ? args->group_rank : ex->conf.rank;
  key->nranks = args->group_ranks ? args->group_size : ex->conf.nranks;
  key->ranks = args->group_ranks;
  if (args->group_ranks) key->topo = NULL; /* the group's ranks in its order */
  key->root = args->root;
  key->count = args->count;
  key->stride = args->stride;
  key->elem_size = kern_type_size(args->type);
  key->chunk_bytes = MIN(args->chunk_bytes, ex->slot_bytes);
  key->slices_per_step = MAX(1, ex->window / 2);
}

/* Elements of each block per piece: EXEC_PIECE_CHUNKS chunks of all the
 * blocks together, but a chunk of each at least: past EXEC_PIECE_CHUNKS
 * ranks a smaller block's piece made every ring step carry scraps, and
 * each piece's ring paid its N-1 hops again (braid-sim: a 1 MiB-per-rank
 * all-gather at 24,576 ranks took 3.7x the line rate's time). Every rank
 * derives the same from the same call. */
size_t exec_piece_count(const struct exec_ctx* ex, const struct exec_args* a) {
  size_t chunk = MAX(MIN(a->chunk_bytes, ex->slot_bytes), (size_t)1), es = kern_type_size(a->type);
  int blocked = a->coll == COLL_ALLGATHER || a->coll == COLL_REDUCESCATTER;
  size_t per = es * (blocked ? (size_t)(a->group_ranks ? a->group_size : ex->conf.nranks) : 1);
  return MAX(MAX((size_t)1, chunk / es), chunk * EXEC_PIECE_CHUNKS / per);
}

static const void* exec_shift(const void* p, size_t bytes) {
  return p ? (const char*)p + bytes : NULL; /* a rank's unused buffer may be NULL */
}

/* Whether every connection the running piece uses reads and writes
 * device memory itself (transport_conn.device_direct: a NIC that takes
 * CUDA memory at both ends). Then a call on device buffers posts them to
 * it as they are: sends from the input, final data straight into the
 * output, only partials through the slots, which the device backend's
 * kernels reach where they are mapped. Elsewhere it is staged. A rank
 * decides alone: the messages are the same either way. */
static int exec_piece_direct(const struct exec_ctx* ex) {
  const struct schedule* s = ex->sched;
  for (size_t i = 0; i < s->nsteps; i++) {
    const struct sched_step* st = &s->steps[i];
    if (st->recv_peer >= 0 && !ex->conf.recv_conns[st->recv_peer]->device_direct) return 0;
    if (st->send_peer >= 0 && !ex->conf.send_conns[st->send_peer]->device_direct) return 0;
  }
  return 1;
}

/* Set up the piece of the call that starts at ex->piece_off: the same
 * elements of every block, so all-gather and reduce-scatter keep the
 * whole call's block stride. */
static ncclResult_t exec_start_piece(struct exec_ctx* ex) {
  ncclResult_t res = ncclSuccess;
  struct exec_args a = ex->call;
  struct sched_key key;
  size_t shift = ex->piece_off * kern_type_size(a.type);
  a.count = MIN(ex->piece, ex->call.count - ex->piece_off);
  a.sendbuff = exec_shift(a.sendbuff, shift);
  a.recvbuff = (void*)exec_shift(a.recvbuff, shift);
  if (a.coll == COLL_ALLGATHER || a.coll == COLL_REDUCESCATTER)
    a.stride = ex->call.stride ? ex->call.stride : ex->call.count;
  exec_ctx_key(ex, &a, &key);
  CHECK(sched_cache_get(&ex->cache, &key, &ex->sched));
  ex->staged = a.mem != MEM_HOST && !exec_piece_direct(ex);
  if (ex->staged && a.no_tasks)
    FAIL(ncclInternalError,
         "Rank %d: %s on device memory, gated: a peer's connection no longer takes device "
         "memory, and the call may launch nothing",
         ex->conf.rank, sched_coll_name(a.coll));
  ex->args = a;
  ex->es = kern_type_size(a.type);
  ex->next_post = ex->next_compute = ex->next_finish = ex->retired = 0;
  chains_reset(ex);
  /* transport.h, lend_max: no message of the piece longer than the lent
   * ones, and no more of them posted than the window */
  ex->lend_bytes =
      a.mem != MEM_HOST || ex->window > TRANSPORT_LEND_SPAN ? 0 : ex->sched->max_count * ex->es;
fail:
  return res;
}

/* The backend of a call that may run no task (exec_args.no_tasks): one
 * it would post is a bug of whoever promised it, reported, never run. */
static ncclResult_t no_task_post(void* state, const struct kern_task* t, uint64_t* ticket,
                                 int* done) {
  (void)state, (void)ticket, (void)done;
  WARN("A device call that may launch nothing needed a %s task", t->nsrcs > 1 ? "reduce" : "copy");
  return ncclInternalError;
}

static ncclResult_t no_task_test(void* state, uint64_t ticket, int* done) {
  (void)state, (void)ticket;
  *done = 1;
  return ncclSuccess;
}

static const struct exec_backend exec_backend_no_tasks = {"none", no_task_post, no_task_test};

ncclResult_t exec_start(struct exec_ctx* ex, const struct exec_args* args,
                        const struct transport_tag* tag) {
  ncclResult_t res = ncclSuccess;
  int on_device = args->mem != MEM_HOST;
  ex->backend = on_device ? ex->dev_backend : ex->conf.backend;
  ex->bstate = on_device ? ex->dev_state : ex->conf.backend_state;
  if (on_device && args->no_tasks) ex->backend = &exec_backend_no_tasks;
  if (ex->backend == NULL)
    FAIL(ncclInvalidArgument, "Rank %d: %s on %s memory, and no backend runs on it", ex->conf.rank,
         sched_coll_name(args->coll), mem_kind_name(args->mem));
  ex->call = *args;
  ex->tag = *tag;
  ex->piece = exec_piece_count(ex, args);
  ex->piece_off = 0;
  CHECK(exec_start_piece(ex));
  ex->last_progress_ns = braid_now_ns();
  ex->busy = 1;
fail:
  return res;
}

/* The running piece is done: start the next, if any; *done when none. */
static ncclResult_t exec_next_piece(struct exec_ctx* ex, int* done) {
  ex->piece_off += ex->args.count;
  *done = ex->piece_off >= ex->call.count;
  return *done ? ncclSuccess : exec_start_piece(ex);
}

/* ---- Hazards between steps in flight ---- */

static int spans_overlap(const void* a, size_t na, const void* b, size_t nb) {
  const char *pa = a, *pb = b;
  return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
}

/* Whether an access to [p, p + bytes) conflicts with the pending task `t`:
 * t writes those bytes, or the access is a write (`write`) and t reads them. */
static int task_touches(const struct kern_task* t, size_t es, const void* p, size_t bytes,
                        int write) {
  for (int j = 0; j < t->ndsts; j++)
    if (spans_overlap(t->dsts[j], t->n * es, p, bytes)) return 1;
  for (int k = 0; write && k < t->nsrcs; k++)
    if (spans_overlap(t->srcs[k], t->n * es, p, bytes)) return 1;
  return 0;
}

/* Whether reading (or with `write`, writing) [p, p + bytes) now could race
 * a computed step that has not finished: its task still in flight, or its
 * send, which reads what it sends when posted, not yet posted. */
static int exec_hazard(const struct exec_ctx* ex, const void* p, size_t bytes, int write) {
  size_t es = ex->es;
  for (size_t i = ex->next_finish; i < ex->next_compute; i++) {
    const struct exec_rec* u = &ex->recs[i % (size_t)ex->window];
    if (u->pending && task_touches(&u->task, es, p, bytes, write)) return 1;
    if (write && u->out && spans_overlap(u->out, ex->sched->steps[i].count * es, p, bytes))
      return 1;
  }
  return 0;
}

static int task_hazard(const struct exec_ctx* ex, const struct kern_task* t) {
  size_t bytes = t->n * ex->es;
  if (ex->next_finish == ex->next_compute) return 0; /* nothing unfinished: the usual case */
  for (int k = 0; k < t->nsrcs; k++)
    if (exec_hazard(ex, t->srcs[k], bytes, 0)) return 1;
  for (int j = 0; j < t->ndsts; j++)
    if (exec_hazard(ex, t->dsts[j], bytes, 1)) return 1;
  return 0;
}

/* Whether an uncomputed step before `end` writes the bytes [p, p + bytes)
 * of the output, or with `reads` also reads them from Y. A receive straight
 * into them must wait for both (a node's first rank may hand the value
 * over while this rank's exchange with it is still to combine into the
 * same bytes); a send of them, for the writes. */
static int uncomputed_touch_y(const struct exec_ctx* ex, size_t end, const void* p, size_t bytes,
                              int reads) {
  for (size_t i = ex->next_compute; i < end; i++) {
    const struct sched_step* si = &ex->sched->steps[i];
    int reads_y = si->prim == PRIM_SEND_OUT || (si->flags & SCHED_LOCAL_OUT);
    if ((sched_prim_writes_y(si->prim) || (reads && reads_y)) &&
        spans_overlap((const char*)ex->args.recvbuff + si->yoff * ex->es, si->count * ex->es, p,
                      bytes))
      return 1;
  }
  return 0;
}

/* ---- Posting ---- */

ncclResult_t exec_backend_run(const struct exec_backend* b, void* state,
                              const struct kern_task* t) {
  ncclResult_t res = ncclSuccess;
  uint64_t ticket;
  int done = 0;
  CHECK(b->post(state, t, &ticket, &done));
  while (!done) {
    CHECK(b->test(state, ticket, &done));
    if (!done) sched_yield();
  }
fail:
  return res;
}

/* A staged exchange sends a copy of Y, made now: every earlier step has
 * finished (post_steps waits for that), and the copy needs nothing but the
 * backend, so waiting for it here is short and cannot deadlock. */
static ncclResult_t exchange_stage_y(struct exec_ctx* ex, const void* y, void* slot,
                                     const struct sched_step* st) {
  struct kern_task t;
  exec_task_unary(&t, &ex->args, 0, slot, y, st->count);
  return exec_backend_run(ex->backend, ex->bstate, &t);
}

/* Post receives (and an exchange's send) up to the window ahead. An
 * exchange sends Y, which earlier steps write, so it waits until they have
 * finished; a receive straight into Y waits for unfinished steps that
 * touch the same bytes. */
static ncclResult_t post_steps(struct exec_ctx* ex, int* progressed) {
  ncclResult_t res = ncclSuccess;
  const struct schedule* s = ex->sched;
  size_t es = ex->es;
  while (ex->next_post < s->nsteps && ex->next_post - ex->retired < (size_t)ex->window) {
    const struct sched_step* st = &s->steps[ex->next_post];
    struct exec_rec* rec = &ex->recs[ex->next_post % (size_t)ex->window];
    char* y = (char*)ex->args.recvbuff + st->yoff * es;
    int recvs = sched_prim_recvs(st->prim);
    int lend = recvs && step_lends(ex, st), slots = step_slots(ex, st, lend);
    if (st->prim == PRIM_EXCHANGE && ex->next_finish != ex->next_post) break;
    if (recvs && !slots && !lend &&
        (exec_hazard(ex, y, st->count * es, 1) ||
         uncomputed_touch_y(ex, ex->next_post, y, st->count * es, 1)))
      break;
    if (ex->nfree < slots) break;
    if (recvs && held_span_full(ex, st->recv_peer)) break; /* a chain holds an older receive */
    if (slots && st->count * es > ex->slot_bytes)
      FAIL(ncclInternalError, "Rank %d: a step of %zu bytes does not fit a %zu-byte slot",
           ex->conf.rank, st->count * es, ex->slot_bytes);
    rec->slot = slots ? ex->free_slots[--ex->nfree] : -1;
    rec->out_slot = slots > 1 ? ex->free_slots[--ex->nfree] : -1;
    rec->carry_in = -1;
    rec->held.nslots = rec->held.nlent = 0;
    rec->pending = 0;
    rec->out = NULL;
    rec->sent_early = 0;
    rec->lent = lend;
    rec->in_place = 0;
    if (recvs) {
      struct transport_conn* c = ex->conf.recv_conns[st->recv_peer];
      rec->recv_seq = c->posted;
      if (lend)
        CHECK(post_lent_recv(ex, c, st->count * es));
      else
        CHECK(post_msg(ex, c, slots ? exec_slot_ptr(ex, rec->slot) : y, st->count * es));
    }
    if (st->prim == PRIM_EXCHANGE) {
      struct transport_conn* c = ex->conf.send_conns[st->send_peer];
      void* out = y;
      if (rec->out_slot >= 0)
        CHECK(exchange_stage_y(ex, y, out = exec_slot_ptr(ex, rec->out_slot), st));
      rec->send_seq = c->posted;
      CHECK(post_msg(ex, c, out, st->count * es));
      CHECK(c->ops->progress(c, progressed));
    }
    ex->next_post++;
  }
fail:
  return res;
}

/* ---- Sending ahead: plain sends whose data is ready ---- */

/* What step st sends as it stands, if it is a plain send of the user's
 * data (no slot, no task): X, or Y with SCHED_LOCAL_OUT; NULL otherwise. */
static const char* plain_send_data(const struct exec_ctx* ex, const struct sched_step* st,
                                   const struct exec_rec* rec) {
  const struct exec_args* a = &ex->args;
  if (rec->slot >= 0 || rec->sent_early) return NULL;
  if (st->prim == PRIM_SEND && !(st->flags & SCHED_LOCAL_OUT))
    return (const char*)a->sendbuff + st->xoff * ex->es;
  if (st->prim == PRIM_SEND_OUT || st->prim == PRIM_SEND)
    return (const char*)a->recvbuff + st->yoff * ex->es;
  return NULL;
}

/* Whether step j may send now: no earlier unfinished step still to send
 * on the same connection (the message order is the schedule's), and none
 * that writes the bytes it sends (received, computed or still a task). */
static int send_may_go(const struct exec_ctx* ex, size_t j, const char* p, size_t bytes) {
  int peer = ex->sched->steps[j].send_peer;
  for (size_t i = ex->next_finish; i < j; i++)
    if (ex->sched->steps[i].send_peer == peer && !ex->recs[i % (size_t)ex->window].sent_early)
      return 0;
  return !uncomputed_touch_y(ex, j, p, bytes, 0) && !exec_hazard(ex, p, bytes, 0);
}

/* A step is computed and finished in order, so a send waits behind every
 * receive before it, even one whose data it does not need: a recursive
 * halving then sends each slice only after the previous slice came back,
 * one round trip per slice. A plain send of data already in place goes
 * out as soon as it is posted, keeping each connection's order. */
static ncclResult_t post_early_sends(struct exec_ctx* ex, int* progressed) {
  ncclResult_t res = ncclSuccess;
  /* staged, slots carry everything; without plain sends there is nothing to scan */
  if (ex->staged || !ex->sched->plain_sends) return ncclSuccess;
  for (size_t j = ex->next_compute; j < ex->next_post; j++) {
    const struct sched_step* st = &ex->sched->steps[j];
    struct exec_rec* rec = &ex->recs[j % (size_t)ex->window];
    const char* p = plain_send_data(ex, st, rec);
    size_t bytes = st->count * ex->es;
    if (p == NULL || !send_may_go(ex, j, p, bytes)) continue;
    struct transport_conn* c = ex->conf.send_conns[st->send_peer];
    rec->send_seq = c->posted;
    CHECK(post_msg(ex, c, (void*)p, bytes));
    CHECK(c->ops->progress(c, progressed));
    rec->sent_early = 1;
    *progressed = 1;
  }
fail:
  return res;
}

static void release_slot(struct exec_ctx* ex, int* slot) {
  if (*slot < 0) return;
  ex->free_slots[ex->nfree++] = *slot;
  *slot = -1;
}

/* ---- Finishing: a step's send once its task is done ---- */

/* The step's task is done: free what it read and will not send (a
 * reduce-carry step's slot went on as the carry), and give a lent receive
 * back to its transport. */
static ncclResult_t step_inputs_done(struct exec_ctx* ex, const struct sched_step* st,
                                     struct exec_rec* rec) {
  ncclResult_t res = ncclSuccess;
  release_slot(ex, &rec->carry_in);
  CHECK(held_release(ex, &rec->held));
  if (rec->slot >= 0 && rec->out != exec_slot_ptr(ex, rec->slot)) release_slot(ex, &rec->slot);
  if (!rec->lent) return ncclSuccess;
  rec->lent = 0;
  struct transport_conn* c = ex->conf.recv_conns[st->recv_peer];
  return c->ops->lend_return(c, rec->recv_seq);
fail:
  return res;
}

/* Finish the first unfinished step if its task is done (*finished then):
 * it sends only now, what it sends being that task's output. */
static ncclResult_t finish_step(struct exec_ctx* ex, int* progressed, int* finished) {
  ncclResult_t res = ncclSuccess;
  const struct sched_step* st = &ex->sched->steps[ex->next_finish];
  struct exec_rec* rec = &ex->recs[ex->next_finish % (size_t)ex->window];
  *finished = 0;
  if (rec->pending) {
    int done = 0;
    CHECK(ex->backend->test(ex->bstate, rec->ticket, &done));
    if (!done) return ncclSuccess;
    rec->pending = 0;
  }
  CHECK(step_inputs_done(ex, st, rec));
  if (rec->out) {
    struct transport_conn* c = ex->conf.send_conns[st->send_peer];
    rec->send_seq = c->posted;
    if (rec->in_place)
      CHECK(post_in_place(ex, c, (void*)rec->out, st->count * ex->es));
    else
      CHECK(post_msg(ex, c, (void*)rec->out, st->count * ex->es));
    CHECK(c->ops->progress(c, progressed)); /* start sending now: latency */
    rec->out = NULL;
  }
  ex->next_finish++;
  *progressed = *finished = 1;
fail:
  return res;
}

/* Finish computed steps in order, which is the message order on every
 * connection, as far as their tasks are done. */
static ncclResult_t finish_ready(struct exec_ctx* ex, int* progressed) {
  ncclResult_t res = ncclSuccess;
  int finished = 1;
  while (finished && ex->next_finish < ex->next_compute)
    CHECK(finish_step(ex, progressed, &finished));
fail:
  return res;
}

/* Compute steps in order once their data is in: post their tasks, unless
 * one must wait for an unfinished step it races; a step that is first in
 * line finishes at once if it can (the CPU backend's tasks are done when
 * posted), so it sends before the next step computes. */
static ncclResult_t compute_ready(struct exec_ctx* ex, int* progressed) {
  ncclResult_t res = ncclSuccess;
  const struct schedule* s = ex->sched;
  while (ex->next_compute < ex->next_post) {
    const struct sched_step* st = &s->steps[ex->next_compute];
    struct exec_rec* rec = &ex->recs[ex->next_compute % (size_t)ex->window];
    if (sched_prim_recvs(st->prim) &&
        ex->conf.recv_conns[st->recv_peer]->completed <= rec->recv_seq)
      break;
    if (st->prim == PRIM_EXCHANGE && ex->conf.send_conns[st->send_peer]->completed <= rec->send_seq)
      break; /* Y is still going out: overwrite it only once sent */
    int defer = chain_defers(ex, st);
    int has_task = defer ? 0 : exec_step_plan(ex, st, rec);
    if (defer) rec->out = NULL;
    if (rec->sent_early) rec->out = NULL; /* its data went at post time */
    if (has_task && task_hazard(ex, &rec->task)) break;
    if (has_task) exec_step_send_in_place(ex, st, rec);
    if (defer)
      exec_step_defer(ex, st, rec);
    else
      exec_step_commit_carry(ex, st, rec);
    if (has_task) {
      int done = 0;
      CHECK(ex->backend->post(ex->bstate, &rec->task, &rec->ticket, &done));
      rec->pending = !done;
    }
    ex->next_compute++;
    *progressed = 1;
    if (ex->next_finish + 1 == ex->next_compute) { /* the first unfinished step */
      int finished;
      CHECK(finish_step(ex, progressed, &finished));
    }
  }
fail:
  return res;
}

static void retire_done(struct exec_ctx* ex, int* progressed) {
  const struct schedule* s = ex->sched;
  while (ex->retired < ex->next_finish) {
    const struct sched_step* st = &s->steps[ex->retired];
    struct exec_rec* rec = &ex->recs[ex->retired % (size_t)ex->window];
    if (sched_prim_sends(st->prim) &&
        ex->conf.send_conns[st->send_peer]->completed <= rec->send_seq)
      break;
    release_slot(ex, &rec->slot);
    release_slot(ex, &rec->out_slot);
    ex->retired++;
    *progressed = 1;
  }
}

/* Drive the I/O of every connection the running step window touches. */
static ncclResult_t pump(struct exec_ctx* ex, int* progressed) {
  ncclResult_t res = ncclSuccess;
  const struct schedule* s = ex->sched;
  size_t end = MIN(ex->next_post + 1, s->nsteps);
  int last_r = -1, last_s = -1;
  for (size_t i = ex->retired; i < end; i++) {
    const struct sched_step* st = &s->steps[i];
    if (st->recv_peer >= 0 && st->recv_peer != last_r) {
      struct transport_conn* c = ex->conf.recv_conns[st->recv_peer];
      CHECK(c->ops->progress(c, progressed));
      last_r = st->recv_peer;
    }
    if (st->send_peer >= 0 && st->send_peer != last_s) {
      struct transport_conn* c = ex->conf.send_conns[st->send_peer];
      CHECK(c->ops->progress(c, progressed));
      last_s = st->send_peer;
    }
  }
fail:
  return res;
}

static ncclResult_t check_alive(struct exec_ctx* ex, int progressed) {
  if (atomic_load(ex->conf.aborted)) {
    WARN("Communicator aborted while rank %d was in a collective", ex->conf.rank);
    return ncclSystemError;
  }
  uint64_t now = braid_now_ns();
  if (progressed) {
    ex->last_progress_ns = now;
  } else if (now - ex->last_progress_ns > (uint64_t)ex->conf.timeout_ms * 1000000ull) {
    WARN(
        "Rank %d: collective made no progress for %lld ms (BRAID_TIMEOUT_MS); a peer is gone "
        "or stuck",
        ex->conf.rank, (long long)ex->conf.timeout_ms);
    return ncclSystemError;
  }
  return ncclSuccess;
}

/* A failed call leaves no task running: the slots it writes are reused
 * and the user's buffers are the user's again once the call returns. */
static void exec_drain(struct exec_ctx* ex) {
  for (size_t i = ex->next_finish; ex->sched && i < ex->next_compute; i++) {
    struct exec_rec* rec = &ex->recs[i % (size_t)ex->window];
    int done = 0;
    while (rec->pending && !done)
      if (ex->backend->test(ex->bstate, rec->ticket, &done) != ncclSuccess) break;
    rec->pending = 0;
  }
}

int exec_tasks_pending(const struct exec_ctx* ex) {
  for (size_t i = ex->next_finish; ex->busy && i < ex->next_compute; i++)
    if (ex->recs[i % (size_t)ex->window].pending) return 1;
  return 0;
}

ncclResult_t exec_progress(struct exec_ctx* ex, int* done, int* progressed) {
  ncclResult_t res = ncclSuccess;
  int any = 0, moved;
  *done = 0;
  do {
    moved = 0;
    CHECK(post_steps(ex, &moved));
    CHECK(post_early_sends(ex, &moved));
    CHECK(pump(ex, &moved));
    CHECK(compute_ready(ex, &moved));
    if (ex->next_finish < ex->next_compute) CHECK(finish_ready(ex, &moved));
    retire_done(ex, &moved);
    any |= moved;
    if (ex->retired == ex->sched->nsteps) {
      CHECK(exec_next_piece(ex, done));
      moved = !*done;
    }
  } while (moved && !*done);
  *progressed = any;
  if (*done) {
    ex->busy = 0;
    return ncclSuccess;
  }
  CHECK(check_alive(ex, any));
  return ncclSuccess;
fail:
  exec_drain(ex);
  ex->busy = 0;
  return res;
}
