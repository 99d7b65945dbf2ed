/*
 * The tagged point-to-point lane (p2p_lane.h): braidTaggedSend and
 * braidTaggedRecv run on their own, as gloo's and MPI's isend and irecv
 * do, not in the comm's issue order. A rank that posts its receives from
 * every peer before its sends, or its sends before receives larger than a
 * ring, or tags out of order, has each transfer progress as soon as its
 * peer posts the matching one.
 *
 * One thread per comm, started at the first tagged call, drives it with a
 * progress engine and connections of its own (TRANSPORT_CHANNEL_LANE, a
 * copy of the comm's transport context): shared memory within a node, TCP
 * otherwise, the receive side made without waiting (connect_recv_try), so
 * that a peer that has not posted yet delays nobody else. The protocol and
 * the matching are p2p_lane_proto.c. Nothing here runs under the comm's
 * turn: the comm's collectives and ordered send/recv run beside it.
 */
#include "engine/p2p_lane.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core.h"
#include "engine/p2p_lane_proto.h"
#include "param.h"
#include "engine/progress.h"
#include "transport_table.h"

/* A blocked lane sleeps at most this long between looks (a submission or
 * a connection's word wakes it sooner); while a connection is still being
 * made, which nothing signals, it naps 1 ms instead. */
#define LANE_SLICE_MS 100

struct p2p_lane {
  struct ncclComm* comm;
  pthread_t thread;
  pthread_mutex_t lock; /* incoming, stop, exited */
  struct lane_list incoming;
  int stop;
  int exited; /* the thread has failed what it held and left: no more posts */
  struct progress engine;
  struct transport_waits waits;
  struct transport_ctx ctx;
  /* the comm's peer table without bell pipes: the peers' lanes ring no
   * bell, since this thread sleeps on its own engine, not the comm's */
  struct peer_info* peers;
  struct lane_peer** peer; /* per rank, made at first use */
  struct lane_peer* active;
  struct lane_list self_sends, self_recvs; /* with this rank, not matched yet */
  struct lane_shared shared;               /* receives from any source */
  struct lane_list finished;
};

/* While a receive from any source waits, the lane looks for every peer's
 * connection, this often per peer (each look of shared memory asks the
 * kernel whether the peer lives). */
#define LANE_LISTEN_NS (2ull * 1000 * 1000)

static struct lane_peer* lane_peer_get(struct p2p_lane* L, int rank) {
  struct lane_peer* p = L->peer[rank];
  if (p) return p;
  if (braid_calloc(&p, 1, sizeof(*p)) != ncclSuccess) return NULL;
  p->rank = rank;
  p->shared = &L->shared;
  p->t = transport_lane_for_peer(&L->ctx, rank);
  p->moved_ns = braid_now_ns();
  p->next_active = L->active;
  L->active = p;
  L->peer[rank] = p;
  return p;
}

/* A send and a receive of this rank with the same tag: a copy. */
static void lane_self_match(struct p2p_lane* L, struct lane_req* r) {
  struct lane_list* mine = r->kind == LANE_SEND ? &L->self_sends : &L->self_recvs;
  struct lane_list* theirs = r->kind == LANE_SEND ? &L->self_recvs : &L->self_sends;
  struct lane_req *prev = NULL, *o = theirs->head;
  for (; o && o->tag != r->tag; prev = o, o = o->next) {
  }
  if (o == NULL) {
    lane_list_push(mine, r);
    return;
  }
  if (prev)
    prev->next = o->next;
  else
    theirs->head = o->next;
  if (theirs->tail == o) theirs->tail = prev;
  struct lane_req* s = r->kind == LANE_SEND ? r : o;
  struct lane_req* d = r->kind == LANE_SEND ? o : r;
  ncclResult_t res = ncclSuccess;
  if (s->bytes != d->bytes) {
    WARN("Tagged p2p : a send to self of %zu bytes with tag %d met a receive of %zu bytes",
         s->bytes, s->tag, d->bytes);
    res = ncclInvalidUsage;
  } else if (s->bytes > 0) {
    memcpy(d->buf, s->buf, s->bytes);
  }
  s->status = d->status = res;
  lane_list_push(&L->finished, s);
  lane_list_push(&L->finished, d);
}

/* A send to self that a receive from any source waits for, earlier than
 * every receive from self with its tag: true when it took it. */
static int lane_self_to_any(struct p2p_lane* L, struct lane_req* s) {
  struct lane_req *any = L->shared.anys.head, *named = L->self_recvs.head;
  for (; any && any->tag != s->tag; any = any->next) {
  }
  for (; named && named->tag != s->tag; named = named->next) {
  }
  if (any == NULL || (named && named->order < any->order)) return 0;
  struct lane_list* l = &L->shared.anys;
  struct lane_req* prev = NULL;
  for (struct lane_req* x = l->head; x != any; x = x->next) prev = x;
  if (prev)
    prev->next = any->next;
  else
    l->head = any->next;
  if (l->tail == any) l->tail = prev;
  any->peer = L->comm->rank;
  any->next = L->self_recvs.head; /* first: lane_self_match takes the first with the tag */
  L->self_recvs.head = any;
  if (L->self_recvs.tail == NULL) L->self_recvs.tail = any;
  lane_self_match(L, s);
  return 1;
}

/* A receive from any source: the oldest send announced with its tag that
 * nobody took, from whichever peer; else it waits, and the lane listens to
 * every peer. Sends to self count as a source too. */
static void lane_admit_any(struct p2p_lane* L, struct lane_req* r) {
  struct lane_peer* from = NULL;
  const struct lane_rts* oldest = NULL;
  for (struct lane_peer* p = L->active; p; p = p->next_active) {
    const struct lane_rts* u = p->broken ? NULL : lane_peer_unexpected(p, r->tag);
    if (u && (oldest == NULL || u->arrival < oldest->arrival)) oldest = u, from = p;
  }
  if (from) {
    ncclResult_t res = lane_peer_take(from, oldest, r, &L->finished);
    from->moved_ns = braid_now_ns();
    if (res != ncclSuccess) lane_peer_fail(from, res, &L->finished);
    return;
  }
  for (struct lane_req* s = L->self_sends.head; s; s = s->next)
    if (s->tag == r->tag) {
      r->peer = L->comm->rank;
      lane_self_match(L, r);
      return;
    }
  lane_list_push(&L->shared.anys, r);
  for (int rank = 0; rank < L->comm->nranks; rank++)
    if (rank != L->comm->rank) (void)lane_peer_get(L, rank);
}

/* A request taken from the submissions: to its peer, or matched here. */
static void lane_admit(struct p2p_lane* L, struct lane_req* r) {
  r->posted_ns = braid_now_ns();
  if (r->kind == LANE_RECV) r->order = L->shared.next_order++;
  if (r->peer < 0) {
    lane_admit_any(L, r);
    return;
  }
  if (r->peer == L->comm->rank) {
    if (r->kind == LANE_SEND && lane_self_to_any(L, r)) return;
    lane_self_match(L, r);
    return;
  }
  struct lane_peer* p = lane_peer_get(L, r->peer);
  ncclResult_t res = p == NULL ? ncclSystemError : p->broken;
  if (res == ncclSuccess) {
    p->moved_ns = braid_now_ns(); /* the timeout counts from the post */
    res = r->kind == LANE_SEND ? lane_peer_send(p, r) : lane_peer_recv(p, r, &L->finished);
    if (res == ncclSuccess) return;
  }
  r->status = res;
  lane_list_push(&L->finished, r);
}

/* Make what is missing of the peer's connections: both ways when it holds
 * requests, the receive side alone while the lane only listens to it (a
 * receive from any source waits); *connecting while the receive side is
 * not there yet. */
static ncclResult_t lane_connect(struct p2p_lane* L, struct lane_peer* p, int* connecting) {
  ncclResult_t res = ncclSuccess;
  int busy = lane_peer_busy(p);
  if (p->tx == NULL && busy)
    CHECK(p->t->connect_send(&L->ctx, p->rank, TRANSPORT_CHANNEL_LANE, &p->tx));
  if (!p->rx_ready) {
    uint64_t now = braid_now_ns();
    if (!busy && now < p->try_ns) {
      *connecting = 1;
      return ncclSuccess;
    }
    p->try_ns = now + LANE_LISTEN_NS;
    res = p->t->connect_recv_try(&L->ctx, p->rank, TRANSPORT_CHANNEL_LANE, &p->rx);
    if (res == ncclInProgress) {
      *connecting = 1;
      return ncclSuccess;
    }
    if (res != ncclSuccess) return res;
    p->rx_ready = 1;
  }
fail:
  return res;
}

/* One look at a peer: connect, move, and give up on it when nothing has
 * moved with it for BRAID_TIMEOUT_MS while it holds requests. */
static void lane_drive(struct p2p_lane* L, struct lane_peer* p, int* moved, int* connecting) {
  int here = 0;
  ncclResult_t res = ncclSuccess;
  int listening = L->shared.anys.head != NULL;
  if (p->broken != ncclSuccess || (!lane_peer_busy(p) && p->tx == NULL && !listening)) return;
  res = lane_connect(L, p, connecting);
  if (res == ncclSuccess) res = lane_peer_step(p, &L->finished, &here);
  uint64_t now = braid_now_ns();
  if (here) p->moved_ns = now;
  *moved |= here;
  if (res == ncclSuccess && lane_peer_busy(p) &&
      now - p->moved_ns > (uint64_t)L->ctx.timeout_ms * 1000000ull) {
    WARN(
        "Tagged p2p : rank %d: nothing moved with rank %d for %lld ms (BRAID_TIMEOUT_MS): its "
        "sends and receives with that rank fail",
        L->comm->rank, p->rank, (long long)L->ctx.timeout_ms);
    res = ncclSystemError;
  }
  if (res != ncclSuccess) lane_peer_fail(p, res, &L->finished);
}

/* Receives from any source that waited BRAID_TIMEOUT_MS fail. */
static void lane_expire_anys(struct p2p_lane* L) {
  uint64_t now = braid_now_ns(), limit = (uint64_t)L->ctx.timeout_ms * 1000000ull;
  while (L->shared.anys.head && now - L->shared.anys.head->posted_ns > limit) {
    struct lane_req* r = lane_list_pop(&L->shared.anys);
    WARN(
        "Tagged p2p : rank %d: no send with tag %d came from any rank within %lld ms "
        "(BRAID_TIMEOUT_MS)",
        L->comm->rank, r->tag, (long long)L->ctx.timeout_ms);
    r->status = ncclSystemError;
    lane_list_push(&L->finished, r);
  }
}

/* Tell the finished requests' callers, outside any lock. */
static void lane_deliver(struct p2p_lane* L) {
  for (struct lane_req* r; (r = lane_list_pop(&L->finished)) != NULL;) {
    if (r->source && r->status == ncclSuccess) *r->source = r->peer;
    flight_end(&L->comm->flight, r->flight, r->status);
    r->done(r->arg, r->status);
    free(r);
  }
}

/* Everything still held fails with `res` (the lane stops); later posts
 * are refused. */
static void lane_fail_all(struct p2p_lane* L, ncclResult_t res) {
  struct lane_list incoming;
  pthread_mutex_lock(&L->lock);
  incoming = L->incoming;
  L->incoming.head = L->incoming.tail = NULL;
  L->exited = 1;
  pthread_mutex_unlock(&L->lock);
  for (struct lane_peer* p = L->active; p; p = p->next_active)
    if (p->broken == ncclSuccess) lane_peer_fail(p, res, &L->finished);
  struct lane_list* lists[] = {&incoming, &L->self_sends, &L->self_recvs, &L->shared.anys};
  for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++)
    for (struct lane_req* r; (r = lane_list_pop(lists[i])) != NULL;) {
      r->status = res;
      lane_list_push(&L->finished, r);
    }
  lane_deliver(L);
}

/* Sleep until something may have moved: a submission (the engine's wake),
 * a connection's word or socket, or a nap while connections are made. */
static void lane_sleep(struct p2p_lane* L, int connecting, uint64_t* idle_since) {
  uint64_t spin_ns = (uint64_t)param_spin_us() * 1000ull, now = braid_now_ns();
  if (*idle_since == 0) *idle_since = now;
  if (now - *idle_since < spin_ns) {
    sched_yield();
    return;
  }
  struct progress* engines[1] = {&L->engine};
  struct transport_waits* waits[1] = {&L->waits};
  (void)progress_wait(engines, waits, 1, connecting ? 1 : LANE_SLICE_MS);
}

static void* lane_main(void* arg) {
  struct p2p_lane* L = arg;
  uint64_t idle_since = 0;
  for (;;) {
    struct lane_list taken;
    int stop, moved = 0, connecting = 0;
    progress_pass_begin(&L->engine, &L->waits);
    pthread_mutex_lock(&L->lock);
    stop = L->stop;
    taken = L->incoming;
    L->incoming.head = L->incoming.tail = NULL;
    pthread_mutex_unlock(&L->lock);
    for (struct lane_req* r; (r = lane_list_pop(&taken)) != NULL; moved = 1) lane_admit(L, r);
    if (stop || atomic_load(&L->comm->aborted)) break;
    for (struct lane_peer* p = L->active; p; p = p->next_active)
      lane_drive(L, p, &moved, &connecting);
    lane_expire_anys(L);
    lane_deliver(L);
    if (moved) {
      idle_since = 0;
      continue;
    }
    lane_sleep(L, connecting, &idle_since);
  }
  if (atomic_load(&L->comm->aborted))
    WARN("Tagged p2p : rank %d: the communicator was aborted: its tagged sends and receives fail",
         L->comm->rank);
  lane_fail_all(L, ncclSystemError);
  return NULL;
}

static void lane_free(struct p2p_lane* L) {
  if (L == NULL) return;
  for (struct lane_peer *p = L->active, *next; p; p = next) {
    next = p->next_active;
    if (p->broken == ncclSuccess) lane_peer_fail(p, ncclSystemError, &L->finished);
    lane_peer_free(p);
  }
  progress_destroy(&L->engine);
  pthread_mutex_destroy(&L->lock);
  free(L->peers);
  free(L->peer);
  free(L);
}

static ncclResult_t lane_create(struct ncclComm* comm, struct p2p_lane** out) {
  ncclResult_t res = ncclSuccess;
  struct p2p_lane* L = NULL;
  CHECK(braid_calloc(&L, 1, sizeof(*L)));
  pthread_mutex_init(&L->lock, NULL);
  L->comm = comm;
  if ((res = progress_init(&L->engine)) != ncclSuccess) {
    pthread_mutex_destroy(&L->lock);
    free(L);
    return res;
  }
  CHECK(braid_calloc(&L->peer, (size_t)comm->nranks, sizeof(*L->peer)));
  CHECK(braid_calloc(&L->peers, (size_t)comm->nranks, sizeof(*L->peers)));
  memcpy(L->peers, comm->tctx.peers, (size_t)comm->nranks * sizeof(*L->peers));
  for (int r = 0; r < comm->nranks; r++) L->peers[r].bell_ino = 0;
  CHECK(transport_ctx_fork(&comm->tctx, L->engine.epoll_fd, &L->waits, &L->ctx));
  L->ctx.peers = L->peers;
  if (pthread_create(&L->thread, NULL, lane_main, L) != 0)
    FAIL(ncclSystemError, "Tagged p2p : cannot start the lane's thread");
  INFO(SUB_P2P | SUB_INIT, "comm %p rank %d: tagged point-to-point lane started", (void*)comm,
       comm->rank);
  *out = L;
  return ncclSuccess;
fail:
  lane_free(L);
  return res;
}

/* A tagged call in the comm's recorder (under its turn lock, where calls
 * are numbered), running from the start: the lane moves it when it can. */
static struct flight_mark lane_record(struct ncclComm* comm, int kind, int peer, int tag,
                                      size_t bytes) {
  struct flight_call c = {.kind = kind == LANE_SEND ? FLIGHT_SEND : FLIGHT_RECV,
                          .coll = -1,
                          .type = ncclUint8,
                          .op = -1,
                          .root = -1,
                          .peer = peer,
                          .tag = tag,
                          .count = bytes,
                          .bytes = bytes};
  struct flight_mark m = flight_enqueue(&comm->flight, &c);
  flight_start(&comm->flight, m, -1, NULL, 0);
  return m;
}

ncclResult_t lane_post(struct ncclComm* comm, int kind, void* buf, size_t bytes, int peer, int tag,
                       int* source, braidHostFn_t done, void* arg) {
  ncclResult_t res = ncclSuccess;
  struct lane_req* r = NULL;
  CHECK(braid_calloc(&r, 1, sizeof(*r)));
  pthread_mutex_lock(&comm->turn_lock); /* the comm's lane is made once */
  if (comm->lane == NULL) res = lane_create(comm, &comm->lane);
  struct p2p_lane* L = comm->lane;
  if (res == ncclSuccess) r->flight = lane_record(comm, kind, peer, tag, bytes); /* numbered */
  pthread_mutex_unlock(&comm->turn_lock);
  if (res != ncclSuccess) {
    free(r);
    return res;
  }
  *r = (struct lane_req){.flight = r->flight,
                         .kind = kind,
                         .peer = peer,
                         .tag = tag,
                         .buf = buf,
                         .bytes = bytes,
                         .done = done,
                         .arg = arg,
                         .source = source};
  pthread_mutex_lock(&L->lock);
  int exited = L->exited;
  if (!exited) lane_list_push(&L->incoming, r);
  pthread_mutex_unlock(&L->lock);
  if (exited) {
    flight_end(&comm->flight, r->flight, ncclSystemError);
    free(r);
    FAIL(ncclSystemError, "Tagged p2p : rank %d's communicator was aborted or revoked", comm->rank);
  }
  progress_wake(&L->engine);
fail:
  return res;
}

void lane_destroy(struct p2p_lane* L) {
  if (L == NULL) return;
  pthread_mutex_lock(&L->lock);
  L->stop = 1;
  pthread_mutex_unlock(&L->lock);
  progress_wake(&L->engine);
  pthread_join(L->thread, NULL);
  lane_free(L);
}
