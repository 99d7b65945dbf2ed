/*
 * Host executor: posts receives up to a window ahead, computes steps in
 * order (CPU kernels), posts sends, and retires steps whose sends are out.
 * Partials land in staging slots; final data is received straight into the
 * user's output buffer, so all-gather steps copy nothing.
 */
#include "executor.h"

#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "core.h"
#include "param.h"

ncclResult_t exec_init(struct exec_state* ex, int window, size_t slot_bytes) {
  memset(ex, 0, sizeof(*ex));
  /* Rendezvous transports (a send completes once the peer posted the
   * receive) need slack: with one step in flight the ring deadlocks, with
   * two the double tree's leaf-first order does (the fake-transport test
   * finds both); four is the floor. */
  ex->window = MAX(4, MIN(window, EXEC_MAX_WINDOW));
  ex->nslots = ex->window;
  ex->slot_bytes = ALIGN_UP(slot_bytes, 4096);
  ex->slot_mem = aligned_alloc(4096, ex->slot_bytes * (size_t)ex->nslots);
  if (ex->slot_mem == NULL) {
    WARN("Out of memory for %d staging slots of %zu bytes", ex->nslots, ex->slot_bytes);
    return ncclSystemError;
  }
  for (int i = 0; i < ex->nslots; i++) ex->free_slots[i] = i;
  ex->nfree = ex->nslots;
  return ncclSuccess;
}

void exec_free(struct exec_state* ex) {
  free(ex->slot_mem);
  ex->slot_mem = NULL;
}

static char* slot_ptr(struct exec_state* ex, int slot) {
  return ex->slot_mem + (size_t)slot * ex->slot_bytes;
}

/* Receives into a slot when the received data must be combined first; a
 * pre-multiplied send stages its scaled copy in a slot too. */
static int step_needs_slot(const struct exec_state* ex, const struct sched_step* st) {
  switch (st->prim) {
    case PRIM_RECV_REDUCE_SEND:
    case PRIM_RECV_REDUCE_COPY_SEND:
    case PRIM_RECV_REDUCE_COPY:
    case PRIM_RECV_REDUCE_CARRY:
    case PRIM_EXCHANGE:
      return 1;
    case PRIM_SEND:
      return (st->flags & SCHED_PRE) && ex->args.pre;
    default:
      return 0;
  }
}

void exec_key(const struct ncclComm* comm, const struct exec_args* args, struct sched_key* key) {
  memset(key, 0, sizeof(*key));
  key->topo = comm->layout.nranks > 0 ? &comm->layout : NULL;
  key->coll = args->coll;
  key->algo = args->algo;
  key->rank = comm->rank;
  key->nranks = comm->nranks;
  key->root = args->root;
  key->count = args->count;
  key->stride = args->stride;
  key->elem_size = kern_type_size(args->type);
  key->chunk_bytes = MIN(args->chunk_bytes, comm->exec.slot_bytes);
  key->slices_per_step = MAX(1, comm->exec.window / 2);
}

void exec_plan(struct ncclComm* comm, struct exec_args* args, struct sched_key* key) {
  size_t total = args->count * kern_type_size(args->type);
  if (args->coll == COLL_ALLGATHER || args->coll == COLL_REDUCESCATTER)
    total *= (size_t)comm->nranks;
  tuner_choose(comm, args->coll, total, &args->algo, &args->chunk_bytes);
  exec_key(comm, args, key);
}

/* Elements of each block per piece: EXEC_PIECE_CHUNKS chunks of all the
 * blocks together. Every rank derives the same from the same call. */
static size_t exec_piece_count(const struct ncclComm* comm, const struct exec_args* a) {
  size_t chunk = MIN(a->chunk_bytes, comm->exec.slot_bytes), es = kern_type_size(a->type);
  int blocked = a->coll == COLL_ALLGATHER || a->coll == COLL_REDUCESCATTER;
  size_t per = es * (blocked ? (size_t)comm->nranks : 1);
  return MAX((size_t)1, MAX(chunk, (size_t)1) * EXEC_PIECE_CHUNKS / per);
}

static const void* exec_shift(const void* p, size_t bytes) {
  return p ? (const char*)p + bytes : NULL; /* a rank's unused buffer may be NULL */
}

/* Set up the piece of the call that starts at ex->piece_off: the same
 * elements of every block, so all-gather and reduce-scatter keep the
 * whole call's block stride. */
static ncclResult_t exec_start_piece(struct ncclComm* comm) {
  struct exec_state* ex = &comm->exec;
  struct exec_args a = ex->call;
  struct sched_key key;
  size_t shift = ex->piece_off * kern_type_size(a.type);
  a.count = MIN(ex->piece, ex->call.count - ex->piece_off);
  a.sendbuff = exec_shift(a.sendbuff, shift);
  a.recvbuff = (void*)exec_shift(a.recvbuff, shift);
  if (a.coll == COLL_ALLGATHER || a.coll == COLL_REDUCESCATTER)
    a.stride = ex->call.stride ? ex->call.stride : ex->call.count;
  exec_key(comm, &a, &key);
  ncclResult_t res = sched_build(&comm->sched, &key);
  if (res != ncclSuccess) return res;
  ex->args = a;
  ex->next_post = ex->next_compute = ex->retired = 0;
  ex->carry = -1;
  return ncclSuccess;
}

ncclResult_t exec_start(struct ncclComm* comm, const struct exec_args* args) {
  ncclResult_t res = ncclSuccess;
  struct exec_state* ex = &comm->exec;
  int err = atomic_load(&comm->error);
  if (err != ncclSuccess) {
    WARN("Rank %d: communicator has failed earlier (%s); abort it", comm->rank,
         ncclGetErrorString((ncclResult_t)err));
    return (ncclResult_t)err;
  }
  ex->call = *args;
  exec_tag_make(comm, args, &ex->tag);
  ex->piece = exec_piece_count(comm, args);
  ex->piece_off = 0;
  CHECK(exec_start_piece(comm));
  ex->last_progress_ns = braid_now_ns();
  ex->busy = 1;
fail:
  return res;
}

/* The running piece is done: start the next, if any; *done when none. */
static ncclResult_t exec_next_piece(struct ncclComm* comm, int* done) {
  struct exec_state* ex = &comm->exec;
  ex->piece_off += ex->args.count;
  *done = ex->piece_off >= ex->call.count;
  return *done ? ncclSuccess : exec_start_piece(comm);
}

/* Post receives (and an exchange's send) up to the window ahead. An
 * exchange sends Y, which earlier steps write, so it waits its turn. */
static ncclResult_t post_steps(struct ncclComm* comm, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct exec_state* ex = &comm->exec;
  const struct schedule* s = &comm->sched;
  size_t es = kern_type_size(ex->args.type);
  while (ex->next_post < s->nsteps && ex->next_post - ex->retired < (size_t)ex->window) {
    const struct sched_step* st = &s->steps[ex->next_post];
    struct exec_rec* rec = &ex->recs[ex->next_post % (size_t)ex->window];
    char* y = (char*)ex->args.recvbuff + st->yoff * es;
    if (st->prim == PRIM_EXCHANGE && ex->next_compute != ex->next_post) break;
    rec->slot = -1;
    if (step_needs_slot(ex, st)) {
      if (ex->nfree == 0) break;
      rec->slot = ex->free_slots[--ex->nfree];
    }
    if (sched_prim_recvs(st->prim)) {
      struct transport_conn* c = comm->recv_conns[st->recv_peer];
      rec->recv_seq = c->posted;
      CHECK(transport_post_host(c, rec->slot >= 0 ? slot_ptr(ex, rec->slot) : y, st->count * es,
                                &ex->tag));
    }
    if (st->prim == PRIM_EXCHANGE) {
      struct transport_conn* c = comm->send_conns[st->send_peer];
      rec->send_seq = c->posted;
      CHECK(transport_post_host(c, y, st->count * es, &ex->tag));
      CHECK(c->ops->progress(c, progressed));
    }
    ex->next_post++;
  }
fail:
  return res;
}

static void release_slot(struct exec_state* ex, struct exec_rec* rec) {
  if (rec->slot < 0) return;
  ex->free_slots[ex->nfree++] = rec->slot;
  rec->slot = -1;
}

/* Hand a step's slot over as the carry, or give the carry back. */
static void carry_take(struct exec_state* ex, struct exec_rec* rec) {
  ex->carry = rec->slot;
  rec->slot = -1;
}
static void carry_release(struct exec_state* ex) {
  if (ex->carry >= 0) ex->free_slots[ex->nfree++] = ex->carry;
  ex->carry = -1;
}

/* Run the local part of one step; returns the buffer it sends, if any. */
static const void* compute_step(struct exec_state* ex, const struct sched_step* st,
                                struct exec_rec* rec) {
  const struct exec_args* a = &ex->args;
  size_t es = kern_type_size(a->type);
  const char* x = (const char*)a->sendbuff + st->xoff * es;
  char* y = (char*)a->recvbuff + st->yoff * es;
  char* slot = rec->slot >= 0 ? slot_ptr(ex, rec->slot) : NULL;
  int use_carry = (st->flags & SCHED_LOCAL_CARRY) && ex->carry >= 0;
  const char* src = (st->flags & SCHED_LOCAL_OUT) ? y : x;
  const char* local = use_carry ? slot_ptr(ex, ex->carry) : src;
  unsigned pre = (st->flags & SCHED_PRE) ? a->pre : 0;
  unsigned post = (st->flags & SCHED_POST) ? a->post : 0;
  const void* out = NULL;
  switch ((enum sched_prim)st->prim) {
    case PRIM_SEND:
      if (!pre) return src;
      kern_unary(&a->redop, pre, slot, src, st->count);
      return slot;
    case PRIM_RECV_REDUCE_SEND:
      kern_reduce(&a->redop, pre, slot, slot, local, st->count);
      out = slot;
      break;
    case PRIM_RECV_REDUCE_CARRY:
      kern_reduce(&a->redop, pre, slot, slot, local, st->count);
      carry_take(ex, rec);
      return NULL;
    case PRIM_RECV_REDUCE_COPY_SEND:
    case PRIM_RECV_REDUCE_COPY:
      kern_reduce(&a->redop, pre | post, y, slot, local, st->count);
      release_slot(ex, rec);
      out = st->prim == PRIM_RECV_REDUCE_COPY_SEND ? y : NULL;
      break;
    case PRIM_RECV_COPY_SEND:
    case PRIM_SEND_OUT:
      return y;
    case PRIM_COPY:
      if ((pre | post) || src != y) kern_unary(&a->redop, pre | post, y, src, st->count);
      return NULL;
    case PRIM_EXCHANGE:
      if (st->flags & SCHED_SWAP)
        kern_reduce(&a->redop, post, y, slot, y, st->count);
      else
        kern_reduce(&a->redop, post, y, y, slot, st->count);
      release_slot(ex, rec);
      return NULL;
    default:
      return NULL;
  }
  if (use_carry) carry_release(ex);
  return out;
}

static ncclResult_t compute_ready(struct ncclComm* comm, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct exec_state* ex = &comm->exec;
  const struct schedule* s = &comm->sched;
  size_t es = kern_type_size(ex->args.type);
  while (ex->next_compute < ex->next_post) {
    const struct sched_step* st = &s->steps[ex->next_compute];
    struct exec_rec* rec = &ex->recs[ex->next_compute % (size_t)ex->window];
    if (sched_prim_recvs(st->prim) && comm->recv_conns[st->recv_peer]->completed <= rec->recv_seq)
      break;
    int exchange = st->prim == PRIM_EXCHANGE;
    if (exchange && comm->send_conns[st->send_peer]->completed <= rec->send_seq)
      break; /* Y is still going out: overwrite it only once sent */
    const void* out = compute_step(ex, st, rec);
    if (sched_prim_sends(st->prim) && !exchange) {
      struct transport_conn* c = comm->send_conns[st->send_peer];
      rec->send_seq = c->posted;
      CHECK(transport_post_host(c, (void*)out, st->count * es, &ex->tag));
      CHECK(c->ops->progress(c, progressed)); /* start sending now: latency */
    }
    ex->next_compute++;
    *progressed = 1;
  }
fail:
  return res;
}

static void retire_done(struct ncclComm* comm, int* progressed) {
  struct exec_state* ex = &comm->exec;
  const struct schedule* s = &comm->sched;
  while (ex->retired < ex->next_compute) {
    const struct sched_step* st = &s->steps[ex->retired];
    struct exec_rec* rec = &ex->recs[ex->retired % (size_t)ex->window];
    if (sched_prim_sends(st->prim) && comm->send_conns[st->send_peer]->completed <= rec->send_seq)
      break;
    release_slot(ex, rec);
    ex->retired++;
    *progressed = 1;
  }
}

/* Drive the I/O of every connection the running step window touches. */
static ncclResult_t pump(struct ncclComm* comm, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct exec_state* ex = &comm->exec;
  const struct schedule* s = &comm->sched;
  size_t end = MIN(ex->next_post + 1, s->nsteps);
  int last_r = -1, last_s = -1;
  for (size_t i = ex->retired; i < end; i++) {
    const struct sched_step* st = &s->steps[i];
    if (st->recv_peer >= 0 && st->recv_peer != last_r) {
      struct transport_conn* c = comm->recv_conns[st->recv_peer];
      CHECK(c->ops->progress(c, progressed));
      last_r = st->recv_peer;
    }
    if (st->send_peer >= 0 && st->send_peer != last_s) {
      struct transport_conn* c = comm->send_conns[st->send_peer];
      CHECK(c->ops->progress(c, progressed));
      last_s = st->send_peer;
    }
  }
fail:
  return res;
}

static ncclResult_t check_alive(struct ncclComm* comm, int progressed) {
  struct exec_state* ex = &comm->exec;
  if (atomic_load(&comm->aborted)) {
    WARN("Communicator aborted while rank %d was in a collective", comm->rank);
    return ncclSystemError;
  }
  uint64_t now = braid_now_ns();
  if (progressed) {
    ex->last_progress_ns = now;
  } else if (now - ex->last_progress_ns > (uint64_t)comm->tctx.timeout_ms * 1000000ull) {
    WARN(
        "Rank %d: collective made no progress for %lld ms (BRAID_TIMEOUT_MS); a peer is gone "
        "or stuck",
        comm->rank, (long long)comm->tctx.timeout_ms);
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t exec_progress(struct ncclComm* comm, int* done, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct exec_state* ex = &comm->exec;
  int any = 0, moved;
  *done = 0;
  do {
    moved = 0;
    CHECK(post_steps(comm, &moved));
    CHECK(pump(comm, &moved));
    CHECK(compute_ready(comm, &moved));
    retire_done(comm, &moved);
    any |= moved;
    if (ex->retired == comm->sched.nsteps) {
      CHECK(exec_next_piece(comm, done));
      moved = !*done;
    }
  } while (moved && !*done);
  *progressed = any;
  if (*done) {
    ex->busy = 0;
    return ncclSuccess;
  }
  CHECK(check_alive(comm, any));
  return ncclSuccess;
fail:
  ex->busy = 0;
  if (res == ncclInvalidUsage) exec_tag_report(comm, &ex->tag);
  comm_set_error(comm, res);
  return res;
}
