/*
 * The tagged lane's state and wire protocol (p2p_lane_proto.c), shared
 * with its thread (p2p_lane.c). Per peer, one ordered stream each way
 * carries fixed-size frames and payloads:
 *   RTS  (id, tag, bytes)   a send announces itself;
 *   CTS  (id, other)        the receiver matched it with its receive `other`;
 *   NACK (id, bytes)        ... with one of another size: both fail;
 *   DATA (other, bytes)     the payload for receive `other` comes next.
 * A receiver matches announced sends against its receives from that peer
 * with that tag in posting order; a payload goes from the sender's buffer
 * into the receiver's, nothing is held beyond the transports' rings.
 */
#ifndef BRAID_P2P_LANE_PROTO_H_
#define BRAID_P2P_LANE_PROTO_H_

#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "status/flight.h"
#include "nccl.h"
#include "transport.h"

#define LANE_MAGIC 0x4c414e45u /* "LANE" */
/* RTS a peer may have outstanding before it counts as a flood. */
#define LANE_MAX_UNEXPECTED 65536

enum lane_frame_kind { LANE_RTS = 1, LANE_CTS, LANE_NACK, LANE_DATA };

struct lane_frame {
  uint32_t magic;
  uint32_t kind;
  int32_t tag;
  uint32_t pad;
  uint64_t id;
  uint64_t other;
  uint64_t bytes;
};

struct lane_req {
  int kind; /* LANE_SEND, LANE_RECV */
  int peer; /* a receive from any source: -1 until matched */
  int tag;
  char* buf;
  size_t bytes;
  braidHostFn_t done;
  void* arg;
  int* source;    /* a receive from any source: where its sender's rank goes */
  uint64_t id;    /* per peer: sends and receives numbered apart */
  uint64_t order; /* receives: posting order across peers (any source vs named) */
  uint64_t posted_ns;
  ncclResult_t status;
  struct flight_mark flight; /* its record in the comm's recorder */
  struct lane_req* next;
};

/* An announced send not matched yet (a received RTS). */
struct lane_rts {
  uint64_t id;
  int32_t tag;
  uint64_t bytes;
  uint64_t arrival; /* across peers: the oldest goes to a receive from any source */
  struct lane_rts* next;
};

struct lane_list {
  struct lane_req *head, *tail;
};

/* What all peers of a lane share: receives from any source, and the
 * counters that order receives and arrivals across peers. */
struct lane_shared {
  struct lane_list anys;
  uint64_t next_order, next_arrival;
};

/* What goes out on a peer's stream, in order: a frame, or a payload that
 * completes `req` once sent. */
struct lane_out {
  struct lane_frame frame; /* a transport reads it until the message is sent: never moved */
  struct lane_req* req;    /* payload when set */
  uint64_t seq;            /* its message number, once posted */
  struct lane_out* next;
};

struct lane_peer {
  int rank;
  struct lane_shared* shared;
  const struct transport* t;
  struct transport_conn* tx; /* this rank -> peer */
  struct transport_conn* rx; /* peer -> this rank; in the making until rx_ready */
  int rx_ready;
  ncclResult_t broken; /* the error that ended the peer's lane, else ncclSuccess */
  /* out, in order: [out_head, out_post) on the wire, [out_post, end) waiting */
  struct lane_out *out_head, *out_post, *out_tail;
  struct lane_out* out_free; /* items to reuse */
  /* in: one receive posted at a time, a frame or the payload after DATA */
  struct lane_frame in_frame;
  struct lane_req* in_payload; /* the receive whose payload is posted */
  int in_posted;
  uint64_t in_seq;
  /* matching */
  struct lane_list sends;   /* announced, waiting for CTS or NACK */
  struct lane_list recvs;   /* posted, no send for them yet */
  struct lane_list matched; /* CTS sent, waiting for DATA */
  struct lane_rts *unexpected, *unexpected_tail;
  size_t nunexpected;
  uint64_t next_send_id, next_recv_id;
  uint64_t moved_ns; /* the last time anything moved with this peer */
  uint64_t try_ns;   /* the next look for its connection when only listening */
  struct lane_peer* next_active;
};

/* Requests done or failed, to be told outside any lock. */
void lane_list_push(struct lane_list* l, struct lane_req* r);
struct lane_req* lane_list_pop(struct lane_list* l);

/* A new request with this peer (never this rank); a receive has its
 * order already. */
ncclResult_t lane_peer_send(struct lane_peer* p, struct lane_req* r);
ncclResult_t lane_peer_recv(struct lane_peer* p, struct lane_req* r, struct lane_list* finished);
/* The oldest send p announced with `tag` that no receive took, its
 * arrival stamp in *arrival; NULL if none. */
const struct lane_rts* lane_peer_unexpected(const struct lane_peer* p, int tag);
/* A receive from any source takes that send of p's. */
ncclResult_t lane_peer_take(struct lane_peer* p, const struct lane_rts* u, struct lane_req* r,
                            struct lane_list* finished);

/* One step of the peer's streams (its connections made): post what waits,
 * progress both ways, act on what arrived; finished requests go to
 * `finished`, *moved when anything moved. An error is the peer's: the
 * caller fails all its requests (lane_peer_fail). */
ncclResult_t lane_peer_step(struct lane_peer* p, struct lane_list* finished, int* moved);

/* Every request with the peer fails with `res`, its connections close. */
void lane_peer_fail(struct lane_peer* p, ncclResult_t res, struct lane_list* finished);

/* Whether the peer has a request in flight (matched, a payload moving). */
int lane_peer_moving(const struct lane_peer* p);
/* Whether the peer has any request at all. */
int lane_peer_busy(const struct lane_peer* p);
/* Free what the peer holds (after lane_peer_fail). */
void lane_peer_free(struct lane_peer* p);

#endif /* BRAID_P2P_LANE_PROTO_H_ */
