/*
 * The tagged lane's wire protocol (p2p_lane_proto.h): per peer, frames and
 * payloads on one ordered stream each way, and the matching of announced
 * sends with posted receives by tag, in posting order. Everything here runs
 * on the lane's thread; a peer whose frames break the protocol is a remote
 * error, and only its requests fail.
 */
#include "engine/p2p_lane_proto.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

void lane_list_push(struct lane_list* l, struct lane_req* r) {
  r->next = NULL;
  if (l->tail)
    l->tail->next = r;
  else
    l->head = r;
  l->tail = r;
}

struct lane_req* lane_list_pop(struct lane_list* l) {
  struct lane_req* r = l->head;
  if (r == NULL) return NULL;
  l->head = r->next;
  if (l->head == NULL) l->tail = NULL;
  r->next = NULL;
  return r;
}

/* The first request of l that `want` accepts, taken out of l. */
static struct lane_req* list_take(struct lane_list* l, int by_tag, int64_t key) {
  struct lane_req *prev = NULL, *r = l->head;
  for (; r; prev = r, r = r->next)
    if (by_tag ? r->tag == (int)key : r->id == (uint64_t)key) break;
  if (r == NULL) return NULL;
  if (prev)
    prev->next = r->next;
  else
    l->head = r->next;
  if (l->tail == r) l->tail = prev;
  r->next = NULL;
  return r;
}

static void req_finish(struct lane_req* r, ncclResult_t status, struct lane_list* finished) {
  r->status = status;
  lane_list_push(finished, r);
}

static struct lane_out* out_item(struct lane_peer* p) {
  struct lane_out* o = p->out_free;
  if (o)
    p->out_free = o->next;
  else if ((o = malloc(sizeof(*o))) == NULL)
    WARN("Tagged p2p : out of memory for rank %d's stream", p->rank);
  return o;
}

static void out_append(struct lane_peer* p, struct lane_out* o) {
  o->next = NULL;
  if (p->out_tail)
    p->out_tail->next = o;
  else
    p->out_head = o;
  p->out_tail = o;
  if (p->out_post == NULL) p->out_post = o;
}

/* Queue a frame on the peer's outgoing stream, and the payload of
 * `payload` (a send) after it. */
static ncclResult_t out_push(struct lane_peer* p, enum lane_frame_kind kind, int32_t tag,
                             uint64_t id, uint64_t other, uint64_t bytes,
                             struct lane_req* payload) {
  struct lane_out* o = out_item(p);
  struct lane_out* d = o && payload ? out_item(p) : NULL;
  if (o == NULL || (payload && d == NULL)) {
    if (o) o->next = p->out_free, p->out_free = o;
    return ncclSystemError;
  }
  *o = (struct lane_out){.frame = {LANE_MAGIC, (uint32_t)kind, tag, 0, id, other, bytes}};
  out_append(p, o);
  if (d) {
    *d = (struct lane_out){.req = payload};
    out_append(p, d);
  }
  return ncclSuccess;
}

/* A send and a receive met: CTS, or NACK when their sizes differ. */
static ncclResult_t lane_match(struct lane_peer* p, uint64_t send_id, uint64_t send_bytes,
                               struct lane_req* r, struct lane_list* finished) {
  if (send_bytes != r->bytes) {
    WARN("Tagged p2p : rank %d sent %" PRIu64 " bytes with tag %d where this rank receives %zu",
         p->rank, send_bytes, r->tag, r->bytes);
    req_finish(r, ncclInvalidUsage, finished);
    return out_push(p, LANE_NACK, r->tag, send_id, 0, r->bytes, NULL);
  }
  lane_list_push(&p->matched, r);
  return out_push(p, LANE_CTS, r->tag, send_id, r->id, 0, NULL);
}

ncclResult_t lane_peer_send(struct lane_peer* p, struct lane_req* r) {
  r->id = p->next_send_id++;
  lane_list_push(&p->sends, r);
  return out_push(p, LANE_RTS, r->tag, r->id, 0, r->bytes, NULL);
}

const struct lane_rts* lane_peer_unexpected(const struct lane_peer* p, int tag) {
  const struct lane_rts* u = p->unexpected;
  for (; u && u->tag != tag; u = u->next) {
  }
  return u;
}

ncclResult_t lane_peer_take(struct lane_peer* p, const struct lane_rts* u, struct lane_req* r,
                            struct lane_list* finished) {
  struct lane_rts* prev = NULL;
  struct lane_rts* x = p->unexpected;
  for (; x != u; prev = x, x = x->next) {
  }
  if (prev)
    prev->next = x->next;
  else
    p->unexpected = x->next;
  if (p->unexpected_tail == x) p->unexpected_tail = prev;
  p->nunexpected--;
  r->peer = p->rank;
  r->id = p->next_recv_id++;
  ncclResult_t res = lane_match(p, x->id, x->bytes, r, finished);
  free(x);
  return res;
}

ncclResult_t lane_peer_recv(struct lane_peer* p, struct lane_req* r, struct lane_list* finished) {
  const struct lane_rts* u = lane_peer_unexpected(p, r->tag);
  if (u) return lane_peer_take(p, u, r, finished);
  r->id = p->next_recv_id++;
  lane_list_push(&p->recvs, r);
  return ncclSuccess;
}

/* The receive an announced send goes to: the earliest posted of this
 * peer's with its tag and those from any source with its tag. */
static struct lane_req* rts_receiver(struct lane_peer* p, int tag) {
  struct lane_req *named = p->recvs.head, *any = p->shared->anys.head;
  for (; named && named->tag != tag; named = named->next) {
  }
  for (; any && any->tag != tag; any = any->next) {
  }
  if (named == NULL && any == NULL) return NULL;
  if (any == NULL || (named && named->order < any->order)) return list_take(&p->recvs, 1, tag);
  struct lane_req* r = list_take(&p->shared->anys, 1, tag);
  r->peer = p->rank;
  r->id = p->next_recv_id++;
  return r;
}

static ncclResult_t on_rts(struct lane_peer* p, const struct lane_frame* f,
                           struct lane_list* finished) {
  struct lane_req* r = rts_receiver(p, f->tag);
  if (r) return lane_match(p, f->id, f->bytes, r, finished);
  if (p->nunexpected == LANE_MAX_UNEXPECTED) {
    WARN("Tagged p2p : rank %d announced %d sends nobody here received: refused", p->rank,
         LANE_MAX_UNEXPECTED);
    return ncclRemoteError;
  }
  struct lane_rts* u = malloc(sizeof(*u));
  if (u == NULL) return ncclSystemError;
  *u = (struct lane_rts){f->id, f->tag, f->bytes, p->shared->next_arrival++, NULL};
  if (p->unexpected_tail)
    p->unexpected_tail->next = u;
  else
    p->unexpected = u;
  p->unexpected_tail = u;
  p->nunexpected++;
  return ncclSuccess;
}

/* DATA: the payload comes next, posted straight into the receive. */
static ncclResult_t on_data(struct lane_peer* p, const struct lane_frame* f) {
  struct lane_req* r = list_take(&p->matched, 0, (int64_t)f->other);
  if (r == NULL || f->bytes != r->bytes) {
    WARN("Tagged p2p : rank %d sent data for receive %" PRIu64 " (%" PRIu64
         " bytes), which it was not offered",
         p->rank, f->other, f->bytes);
    if (r) lane_list_push(&p->matched, r); /* failed with the peer's others */
    return ncclRemoteError;
  }
  p->in_payload = r;
  p->in_seq = p->rx->posted;
  p->in_posted = 1;
  return transport_post_host(p->rx, r->buf, r->bytes, NULL);
}

/* What a received frame asks for. */
static ncclResult_t lane_frame_act(struct lane_peer* p, const struct lane_frame* f,
                                   struct lane_list* finished) {
  struct lane_req* s;
  if (f->magic != LANE_MAGIC) {
    WARN("Tagged p2p : rank %d sent a frame that is not the lane's", p->rank);
    return ncclRemoteError;
  }
  switch (f->kind) {
    case LANE_RTS:
      return on_rts(p, f, finished);
    case LANE_DATA:
      return on_data(p, f);
    case LANE_CTS:
    case LANE_NACK:
      s = list_take(&p->sends, 0, (int64_t)f->id);
      if (s == NULL) break;
      if (f->kind == LANE_CTS) return out_push(p, LANE_DATA, s->tag, s->id, f->other, s->bytes, s);
      WARN("Tagged p2p : this rank sent %zu bytes with tag %d where rank %d receives %" PRIu64,
           s->bytes, s->tag, p->rank, f->bytes);
      req_finish(s, ncclInvalidUsage, finished);
      return ncclSuccess;
    default:
      break;
  }
  WARN("Tagged p2p : rank %d sent frame kind %u for send %" PRIu64 ", which this rank never made",
       p->rank, f->kind, f->id);
  return ncclRemoteError;
}

/* Post what waits on the outgoing stream, while the connection takes it. */
static ncclResult_t out_post(struct lane_peer* p, int* moved) {
  struct transport_conn* c = p->tx;
  for (struct lane_out* o;
       (o = p->out_post) != NULL && c->posted - c->completed < TRANSPORT_MAX_INFLIGHT;) {
    o->seq = c->posted;
    ncclResult_t res = o->req ? transport_post_host(c, o->req->buf, o->req->bytes, NULL)
                              : transport_post_host(c, &o->frame, sizeof(o->frame), NULL);
    if (res != ncclSuccess) return res;
    p->out_post = o->next;
    *moved = 1;
  }
  return ncclSuccess;
}

/* Items the connection has sent: a payload's send is complete. */
static void out_retire(struct lane_peer* p, struct lane_list* finished, int* moved) {
  for (struct lane_out* o;
       (o = p->out_head) != NULL && o != p->out_post && o->seq < p->tx->completed;) {
    p->out_head = o->next;
    if (p->out_head == NULL) p->out_tail = NULL;
    if (o->req) req_finish(o->req, ncclSuccess, finished);
    o->next = p->out_free;
    p->out_free = o;
    *moved = 1;
  }
}

/* The receive posted on the incoming stream completed. */
static ncclResult_t in_arrived(struct lane_peer* p, struct lane_list* finished, int* moved) {
  if (!p->in_posted || p->rx->completed <= p->in_seq) return ncclSuccess;
  p->in_posted = 0;
  *moved = 1;
  if (p->in_payload) {
    req_finish(p->in_payload, ncclSuccess, finished);
    p->in_payload = NULL;
    return ncclSuccess;
  }
  return lane_frame_act(p, &p->in_frame, finished);
}

ncclResult_t lane_peer_step(struct lane_peer* p, struct lane_list* finished, int* moved) {
  ncclResult_t res = ncclSuccess;
  int progressed = 0;
  if (p->tx) {
    CHECK(out_post(p, moved));
    CHECK(p->tx->ops->progress(p->tx, &progressed));
    out_retire(p, finished, moved);
  }
  if (p->rx_ready) {
    if (!p->in_posted) {
      p->in_seq = p->rx->posted;
      p->in_posted = 1;
      CHECK(transport_post_host(p->rx, &p->in_frame, sizeof(p->in_frame), NULL));
    }
    CHECK(p->rx->ops->progress(p->rx, &progressed));
    CHECK(in_arrived(p, finished, moved));
  }
  if (progressed) *moved = 1;
fail:
  return res;
}

static void list_fail(struct lane_list* l, ncclResult_t res, struct lane_list* finished) {
  for (struct lane_req* r; (r = lane_list_pop(l)) != NULL;) req_finish(r, res, finished);
}

void lane_peer_fail(struct lane_peer* p, ncclResult_t res, struct lane_list* finished) {
  list_fail(&p->sends, res, finished);
  list_fail(&p->recvs, res, finished);
  list_fail(&p->matched, res, finished);
  if (p->in_payload) req_finish(p->in_payload, res, finished);
  p->in_payload = NULL;
  for (struct lane_out* o; (o = p->out_head) != NULL;) {
    p->out_head = o->next;
    if (o->req) req_finish(o->req, res, finished);
    o->next = p->out_free;
    p->out_free = o;
  }
  p->out_tail = p->out_post = NULL;
  for (struct lane_rts* u; (u = p->unexpected) != NULL;) {
    p->unexpected = u->next;
    free(u);
  }
  p->unexpected_tail = NULL;
  p->nunexpected = 0;
  /* shut down, not drained: what was sent still arrives (a ring's slots,
   * a socket's buffer), and a peer that never reads cannot hold us up */
  if (p->tx) p->tx->ops->shutdown(p->tx), p->tx->ops->close(p->tx);
  if (p->rx) p->rx->ops->shutdown(p->rx), p->rx->ops->close(p->rx);
  p->tx = p->rx = NULL;
  p->rx_ready = 0;
  p->in_posted = 0;
  p->broken = res;
}

int lane_peer_moving(const struct lane_peer* p) {
  return p->matched.head != NULL || p->in_payload != NULL || p->out_head != NULL;
}

void lane_peer_free(struct lane_peer* p) {
  for (struct lane_out* o; (o = p->out_free) != NULL;) {
    p->out_free = o->next;
    free(o);
  }
  free(p);
}

int lane_peer_busy(const struct lane_peer* p) {
  return lane_peer_moving(p) || p->sends.head != NULL || p->recvs.head != NULL;
}
