/*
 * The transport interface: a connection moves an ordered stream of
 * messages to or from one peer. Posting never blocks; progress() does the
 * I/O it can and the executor reads the `completed` counter.
 */
#ifndef BRAID_TRANSPORT_H_
#define BRAID_TRANSPORT_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "bootstrap.h"
#include "nccl.h"

/* What the progress calls of one pass found blocked, so that the waiting
 * thread can sleep on exactly those: shared-memory connections name a
 * futex word (with the value they saw, and a sleeper count their peer
 * reads before waking; fd_sleepers is the count the peer reads before
 * ringing the comm's bell pipe instead, NULL if it cannot), socket
 * connections only count themselves (their fds are already in the comm's
 * epoll set). Reset before every pass. */
#define TRANSPORT_WAIT_MAX 32
struct transport_waits {
  int nfutex;
  struct {
    _Atomic uint32_t* word;
    _Atomic uint32_t* sleepers;
    _Atomic uint32_t* fd_sleepers;
    uint32_t seen;
  } futex[TRANSPORT_WAIT_MAX];
  int nfd;
  int npoll; /* blocked on something nothing wakes: the waiter naps */
};

/* A connection that cannot move now records what would wake it. */
static inline void transport_wait_on_futex(struct transport_waits* w, _Atomic uint32_t* word,
                                           _Atomic uint32_t* sleepers,
                                           _Atomic uint32_t* fd_sleepers, uint32_t seen) {
  if (w == NULL) return;
  if (w->nfutex == TRANSPORT_WAIT_MAX) { /* too many: make the waiter poll */
    w->npoll++;
    return;
  }
  w->futex[w->nfutex].word = word;
  w->futex[w->nfutex].sleepers = sleepers;
  w->futex[w->nfutex].fd_sleepers = fd_sleepers;
  w->futex[w->nfutex].seen = seen;
  w->nfutex++;
}
static inline void transport_wait_on_fd(struct transport_waits* w) {
  if (w) w->nfd++;
}

/* What a transport may know of its communicator. */
struct transport_ctx {
  int rank;
  int nranks;
  uint64_t secret;               /* the data secret: every connection opens with it */
  const struct peer_info* peers; /* nranks entries */
  int listen_fd;                 /* this rank's data listener */
  int epoll_fd;                  /* progress engine: register fds here */
  int64_t timeout_ms;
  struct transport_accept* accept; /* incoming connections: pending hellos, unclaimed ones */
  _Atomic int* aborted;            /* set by ncclCommAbort: stop waiting */
  struct transport_waits* waits;   /* the comm's, see above */
};

/* What call a message belongs to, as its poster describes it: opaque to
 * transports, which carry it with the message and compare it, byte for
 * byte, with what the receiver posted. */
#define TRANSPORT_TAG_BYTES 24
struct transport_tag {
  uint8_t b[TRANSPORT_TAG_BYTES];
};

/* Why a receive failed its check: another call's message, or one of
 * another size (NCCL's "Message truncated"). */
enum transport_mismatch { TRANSPORT_MATCH = 0, TRANSPORT_OTHER_CALL, TRANSPORT_OTHER_SIZE };

/* Messages a connection can hold in flight; the executor keeps fewer. */
#define TRANSPORT_MAX_INFLIGHT 64

/* Common head of every connection. Messages are numbered 0,1,2,... in
 * posting order; message k is complete when `completed` > k. */
struct transport_conn {
  const struct transport* ops;
  int peer;
  int is_send;
  uint64_t posted;
  uint64_t completed;
  uint64_t stall_pass; /* p2p: the posting pass that found this connection full */
  /* receive: set with ncclInvalidUsage when a message did not match its
   * receive, with the tag the peer sent */
  enum transport_mismatch mismatch;
  struct transport_tag peer_tag;
};

/* A received message's (seq, bytes, tag) against what was posted for it:
 * TRANSPORT_MATCH, or a WARN, conn->mismatch and peer_tag set and
 * ncclInvalidUsage. Shared by every transport so all report alike. */
ncclResult_t transport_check_message(struct transport_conn* conn, uint64_t seq, uint64_t bytes,
                                     const struct transport_tag* tag, uint64_t want_seq,
                                     uint64_t want_bytes, const struct transport_tag* want_tag);

struct transport {
  const char* name;
  /* Connect to `peer` for sending / accept from `peer` for receiving, on
   * `channel` (0: collectives, 1: point-to-point; each pair of ranks has
   * one connection per channel and direction). A rank connects all its
   * sends before accepting its receives. */
  ncclResult_t (*connect_send)(struct transport_ctx* ctx, int peer, int channel,
                               struct transport_conn** out);
  ncclResult_t (*connect_recv)(struct transport_ctx* ctx, int peer, int channel,
                               struct transport_conn** out);
  /* Optional: both directions with `peer` on `channel` at once, sharing
   * one link (NULL: use connect_send and connect_recv). Called in the send
   * phase (send_phase 1) and again in the receive phase; the transport
   * makes both conns in one of them, in the other it leaves both NULL. It
   * may wait only in the receive phase, and only for what the peer makes
   * in its send phase, like connect_recv. */
  ncclResult_t (*connect_duplex)(struct transport_ctx* ctx, int peer, int channel, int send_phase,
                                 struct transport_conn** send, struct transport_conn** recv);
  /* Queue one message (send: from buf; receive: into buf) of the call
   * `tag` describes (NULL: none, all zero). The caller keeps fewer than
   * TRANSPORT_MAX_INFLIGHT messages pending. */
  ncclResult_t (*post)(struct transport_conn* conn, void* buf, size_t bytes,
                       const struct transport_tag* tag);
  /* Do the non-blocking I/O that is possible now; *progressed tells if any. */
  ncclResult_t (*progress)(struct transport_conn* conn, int* progressed);
  /* Make the peer see end-of-stream now (error cascade, abort). */
  void (*shutdown)(struct transport_conn* conn);
  void (*close)(struct transport_conn* conn);
};

extern const struct transport tcp_transport;
extern const struct transport shm_transport;

/* Remove the shared-memory segments of this host and shared-memory domain
 * (bootstrap_shm_domain(); 0: shared memory is off) whose creator died
 * before they were unlinked. Once per process; see shm_names.c. */
void transport_shm_sweep(uint64_t domain);

/* Close the incoming connections nobody claimed (see tcp). */
void transport_accept_free(struct transport_ctx* ctx);

#endif /* BRAID_TRANSPORT_H_ */
