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

#include "launch.h"
#include "peer.h"
#include "nccl.h"

/* What the progress calls of one pass found blocked, so that the waiting
 * thread can sleep on exactly those: shared-memory connections name a
 * futex word (with the value they saw, and a sleeper count their peer
 * reads before waking; fd_sleepers is the count the peer reads before
 * ringing the comm's bell pipe instead, NULL if it cannot), socket
 * connections only count themselves (their fds are already in the comm's
 * epoll set). Reset before every pass.
 *
 * The counts live in memory the peer writes too. A sleeper that finds one
 * below its own raise when it lowers it (the peer zeroed it: its wake-ups
 * would be skipped, each sleep lasting the whole slice) sets *miscounted,
 * the connection's own flag, and the connection naps from then on. */
#define TRANSPORT_WAIT_MAX 32
struct transport_waits {
  int nfutex;
  struct {
    _Atomic uint32_t* word;
    _Atomic uint32_t* sleepers;
    _Atomic uint32_t* fd_sleepers;
    _Atomic int* miscounted;
    uint32_t seen;
  } futex[TRANSPORT_WAIT_MAX];
  int nfd;
  int npoll; /* blocked on something nothing wakes: the waiter naps */
};

/* A connection that cannot move now records what would wake it. */
static inline void transport_wait_on_futex(struct transport_waits* w, _Atomic uint32_t* word,
                                           _Atomic uint32_t* sleepers,
                                           _Atomic uint32_t* fd_sleepers, _Atomic int* miscounted,
                                           uint32_t seen) {
  if (w == NULL) return;
  if (w->nfutex == TRANSPORT_WAIT_MAX) { /* too many: make the waiter poll */
    w->npoll++;
    return;
  }
  w->futex[w->nfutex].word = word;
  w->futex[w->nfutex].sleepers = sleepers;
  w->futex[w->nfutex].fd_sleepers = fd_sleepers;
  w->futex[w->nfutex].miscounted = miscounted;
  w->futex[w->nfutex].seen = seen;
  w->nfutex++;
}
static inline void transport_wait_on_fd(struct transport_waits* w) {
  if (w) w->nfd++;
}
/* Blocked on something nothing wakes (a kernel's end, a full socket): the
 * waiter naps instead of sleeping. */
static inline void transport_wait_nap(struct transport_waits* w) {
  if (w) w->npoll++;
}

/* The channel of the tagged point-to-point lane (src/p2p_lane.c), past
 * TCP's out-of-band hello channels (2, 3). */
#define TRANSPORT_CHANNEL_LANE 4

struct transport;
struct transport_ctx;
struct cudaipc_cache;

/* A transport's id (its descriptor's `id`) is a small number of its own,
 * the same in every build: it names the transport's blob in a peer table
 * and its links in the flight recorder's dumps, which builds with and
 * without CUDA or verbs read alike; per-comm arrays are indexed by it.
 * The table refuses two rows with one id (transport_table_init). */
#define TRANSPORT_MAX_ID 16

/* How the tuner prices a transport's hops (src/tune/tuner_model.c): by the
 * kind of link it moves bytes over, so a new transport of a known kind
 * needs no cost of its own. */
enum transport_link {
  TRANSPORT_LINK_DEVICE = 0, /* device memory only: the device model prices it */
  TRANSPORT_LINK_MEMORY,     /* copies through memory both ranks map */
  TRANSPORT_LINK_NETWORK,    /* messages through a NIC (the NIC's rate bounds them) */
};

/* The comm's device, made at its first device call (src/cuda/cuda_comm.c):
 * what a transport that moves device memory needs (it copies through the
 * device runtime below it, gpu/cuda/cuda_copy.h). */
struct transport_device {
  void* context;               /* CUcontext of the comm's device */
  void* copy_stream;           /* CUstream: copies of synchronous calls, waited for */
  struct cudaipc_cache* cache; /* peers' allocations mapped here (shared with Direct) */
  int mappings_in_use;         /* a kernel may still use them: never unmap (timeout) */
};

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
  /* per peer: the transport that carries the pair, chosen at first need
   * (transport_for_peer), NULL until then */
  const struct transport** chosen;
  /* per peer: the transport of device buffers, as `chosen` (NULL: not yet;
   * transport_none: none moves device memory between the two) */
  const struct transport** chosen_device;
  const struct transport* net;     /* the network NCCL_NET names */
  struct transport_device* device; /* NULL until the comm's first device call */
  void* state[TRANSPORT_MAX_ID];   /* what a transport keeps per comm, by id (free_state) */
};

/* Rank's blob of transport t in the comm's peer table: its blob_bytes as
 * the rank published them, or zeros where the rank's build has no such
 * transport or its record is malformed (transport_blobs_make's layout). */
const void* transport_peer_blob(const struct transport_ctx* ctx, const struct transport* t,
                                int rank);
/* The place of t's blob in p (a record made at the end if p has none),
 * or NULL where there is no room: how the table writes a rank's blobs
 * (transport_blobs_make), and tests a peer's. */
void* transport_blob_put(struct peer_info* p, const struct transport* t);

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

/* A message's buffer as its poster describes it: where, how long, which
 * kind of memory (one TRANSPORT_CAP_*_MEM bit), and the registration that
 * covers it for transports that need one (NULL: none). A device-memory
 * send of a call gated on its stream names the kernel launch queued there
 * for its copy (gpu/cuda/cuda_deferred.h): a transport that copies device
 * to device gives that launch its task, never work on a stream of its own
 * (which could queue behind the gated stream). A transport keeps what it
 * needs of it: the descriptor itself may live on the stack. `owned`: the
 * comm's own memory (executor slots), allocated for the comm's life, so a
 * transport may keep it pinned or mapped past the message; a user's buffer
 * may be freed and its address reused once the call returns. */
struct transport_buf {
  void* ptr;
  size_t bytes;
  unsigned mem;
  void* reg;
  const struct gpu_launch* launch; /* NULL: none */
  int owned;
  int lend;     /* a receive left in the transport's memory (ptr NULL): see lend_max */
  int in_place; /* a send already where the peer reads it: see send_space */
};

/* Messages a connection can hold in flight; the executor keeps fewer. */
#define TRANSPORT_MAX_INFLIGHT 64
/* Messages a receiver that lends may keep posted past its oldest lent one
 * (transport.lend_max). */
#define TRANSPORT_LEND_SPAN 16

/* Common head of every connection. Messages are numbered 0,1,2,... in
 * posting order; message k is complete when `completed` > k. */
struct transport_conn {
  const struct transport* ops;
  int peer;
  int is_send;
  uint64_t posted;
  uint64_t completed;
  /* Bytes of every message posted so far, and that count as it stood after
   * each of the last TRANSPORT_MAX_INFLIGHT (by seq): what the messages
   * completed carried is then known without the transports counting it
   * (transport_conn_done_bytes). Written by transport_conn_post. */
  uint64_t posted_bytes;
  uint64_t bytes_after[TRANSPORT_MAX_INFLIGHT];
  uint64_t stall_pass; /* p2p: the posting pass that found this connection full */
  /* It reads and writes device memory itself (a NIC's DMA, where both
   * ends' devices take it), set by its transport when it makes the
   * connection: a collective on device buffers may post them to it as
   * they are (src/engine/executor.c, exec_piece_direct). */
  int device_direct;
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

/* Capabilities: the memory kinds a transport moves, and what wakes a rank
 * that sleeps on one of its connections (transport_waits). */
#define TRANSPORT_CAP_HOST_MEM 0x1u   /* host (pageable) memory */
#define TRANSPORT_CAP_DEVICE_MEM 0x2u /* CUDA device memory */
/* It moves device memory with a copy kernel queued on the call's stream: a
 * gated send hands it a deferred launch (transport_buf.launch); without
 * this, a transport reads and writes device memory itself (a NIC's DMA). */
#define TRANSPORT_CAP_DEVICE_COPY 0x4u
#define TRANSPORT_CAP_WAKE_FD 0x100u    /* its fds in the comm's epoll set */
#define TRANSPORT_CAP_WAKE_FUTEX 0x200u /* a futex word in shared memory */

/* A transport's descriptor: one row of the table (transport_table.c). */
struct transport {
  const char* name;     /* in logs: "NET/Socket" */
  const char* key;      /* in status reports and dumps: "tcp" */
  unsigned id;          /* < TRANSPORT_MAX_ID, see above */
  unsigned caps;        /* TRANSPORT_CAP_* */
  const char* net_name; /* NCCL_NET's name for it where it crosses the network ("Socket"); NULL:
                         * it joins ranks of one host only, or its name is known at run time */
  /* Optional, for a network whose name only its run time knows (a net
   * plugin's): whether NCCL_NET's `name` is its name. */
  int (*net_is)(const char* name);
  enum transport_link link;
  /* Whether this transport can join ranks a and b. Decided from the peer
   * table alone, so that both ends of a pair, and the tuner of every rank
   * (which asks about pairs it is not part of), get the same answer. */
  int (*can_connect)(const struct transport_ctx* ctx, int a, int b);
  /* Optional, with TRANSPORT_CAP_DEVICE_MEM (NULL: every pair it joins):
   * whether it moves device memory between a and b, where that depends on
   * its run time (a net plugin's pointer support); from the peer table. */
  int (*device_ok)(const struct transport_ctx* ctx, int a, int b);
  /* This rank's blob (blob_bytes, at most 255; all transports' together,
   * with an 8-byte header each and padded to 8, at most PEER_BLOB_BYTES),
   * filled at init into its peer_info before the bootstrap exchange; a
   * peer's is transport_peer_blob(). */
  size_t blob_bytes;
  ncclResult_t (*blob_make)(struct transport_ctx* ctx, void* blob);
  /* Connect to `peer` for sending / accept from `peer` for receiving, on
   * `channel` (0: collectives, 1: point-to-point, TRANSPORT_CHANNEL_LANE:
   * the tagged lane; each pair of ranks has one connection per channel and
   * direction). A rank connects all its sends before accepting its
   * receives. */
  ncclResult_t (*connect_send)(struct transport_ctx* ctx, int peer, int channel,
                               struct transport_conn** out);
  ncclResult_t (*connect_recv)(struct transport_ctx* ctx, int peer, int channel,
                               struct transport_conn** out);
  /* Optional: connect_recv that never waits, for a thread that drives many
   * connections at once (the tagged point-to-point lane). *inout is NULL
   * at the first call; while the peer has not connected it returns
   * ncclInProgress with *inout a connection in the making (call again with
   * it, or give up with ops->close), then ncclSuccess with *inout ready. On
   * an error *inout is closed and NULL. */
  ncclResult_t (*connect_recv_try)(struct transport_ctx* ctx, int peer, int channel,
                                   struct transport_conn** inout);
  /* Optional: both directions with `peer` on `channel` at once, sharing
   * one link (NULL: use connect_send and connect_recv). Called in the send
   * phase (send_phase 1) and again in the receive phase; the transport
   * makes both conns in one of them, in the other it leaves both NULL. It
   * may wait only in the receive phase, and only for what the peer makes
   * in its send phase, like connect_recv. */
  ncclResult_t (*connect_duplex)(struct transport_ctx* ctx, int peer, int channel, int send_phase,
                                 struct transport_conn** send, struct transport_conn** recv);
  /* Optional (NULL: a connection is whole once its connect returns):
   * whether this end of `conn` is still being made (a net plugin's sender,
   * whose connect finishes only once the peer accepts); its progress
   * moves it on. */
  int (*connecting)(const struct transport_conn* conn);
  /* Optional (NULL: it moves any buffer as it is): prepare a user range
   * that ncclCommRegister names, pinning or mapping it; *handle comes back
   * in transport_buf.reg when a message lies in the range. dereg undoes it,
   * after the last call that used the range. */
  ncclResult_t (*reg)(struct transport_ctx* ctx, void* base, size_t size, void** handle);
  void (*dereg)(struct transport_ctx* ctx, void* handle);
  /* Queue one message (send: from buf; receive: into buf) of the call
   * `tag` describes (NULL: none, all zero). The caller keeps fewer than
   * TRANSPORT_MAX_INFLIGHT messages pending, and posts only memory kinds
   * the transport's caps name (the table chose it for them). */
  ncclResult_t (*post)(struct transport_conn* conn, const struct transport_buf* buf,
                       const struct transport_tag* tag);
  /* Do the non-blocking I/O that is possible now; *progressed tells if any. */
  ncclResult_t (*progress)(struct transport_conn* conn, int* progressed);
  /* Make the peer see end-of-stream now (error cascade, abort). */
  void (*shutdown)(struct transport_conn* conn);
  void (*close)(struct transport_conn* conn);
  /* Optional (NULL: never): receives read where they arrived, saving the
   * copy into the reader's buffer. A host-memory receive posted with
   * buf.lend (ptr NULL, bytes at most lend_max(conn), which is 0 when the
   * connection cannot lend now) completes once the whole message lies,
   * contiguous, in the transport's own memory; lent() then says where. The
   * transport reuses that memory only after lend_return() for the message
   * (in any order): until then the peer cannot overwrite it by the
   * protocol, though a hostile peer could write into it at any time, as it
   * could send any bytes. A lent message holds up the messages behind it:
   * a receiver that lends keeps at most TRANSPORT_LEND_SPAN messages
   * posted past its oldest lent one, none longer than lend_max, and the
   * transport holds that many, so whatever the receiver waits for can
   * still arrive. */
  size_t (*lend_max)(const struct transport_conn* conn);
  /* Optional (NULL: never): a send written where the peer reads it,
   * saving the copy out of the writer's buffer. With nothing queued on
   * conn, send_space(conn, bytes) gives room for its next message if there
   * is some now (NULL if not, or if bytes is more than it can give); the
   * writer fills it and posts the message with buf.ptr that room and
   * buf.in_place, before anything else is posted on conn. */
  void* (*send_space)(struct transport_conn* conn, size_t bytes);
  const void* (*lent)(const struct transport_conn* conn, uint64_t seq);
  ncclResult_t (*lend_return)(struct transport_conn* conn, uint64_t seq);
  /* Optional (NULL: the peer table's NIC speed): the line rate of `rank`'s
   * link on this transport, Mb/s, 0 unknown; what the tuner prices. */
  uint32_t (*link_mbps)(const struct transport_ctx* ctx, int rank);
  /* Optional (NULL: unknown): the latency of `rank`'s link on this
   * transport, microseconds, from the peer table; the tuner's floor for a
   * hop across nodes. */
  double (*link_latency_us)(const struct transport_ctx* ctx, int rank);
  /* Optional, for a network: where NCCL_NET names it, whether it can run
   * here, with a WARN saying why not (verbs: no usable port). */
  ncclResult_t (*net_check)(void);
  /* Optional, for a network whose devices only its run time knows (a net
   * plugin's, the verbs ports): the topology's report of them, one line
   * into out (len bytes, NUL-terminated); "" when this comm does not use
   * it. */
  void (*describe)(const struct transport_ctx* ctx, char* out, size_t len);
  /* Optional: the comm made its device (ctx->device is set): get ready to
   * move device memory. */
  ncclResult_t (*device_attach)(struct transport_ctx* ctx);
  /* Optional: free ctx->state[t->id], after every connection closed. */
  void (*free_state)(struct transport_ctx* ctx);
};

/* Whether conn's transport moves the memory kind of b; a WARN if not
 * (the table never picks such a transport: this catches a caller's bug). */
int transport_moves(const struct transport_conn* conn, const struct transport_buf* b);

/* Every post goes through here: the connection's byte counts follow. */
static inline ncclResult_t transport_conn_post(struct transport_conn* c,
                                               const struct transport_buf* b,
                                               const struct transport_tag* tag) {
  ncclResult_t res = c->ops->post(c, b, tag);
  if (res == ncclSuccess) {
    c->posted_bytes += b->bytes;
    c->bytes_after[(c->posted - 1) % TRANSPORT_MAX_INFLIGHT] = c->posted_bytes;
  }
  return res;
}

/* Bytes of the messages completed so far (fewer than
 * TRANSPORT_MAX_INFLIGHT are ever pending, so the count is still kept). */
static inline uint64_t transport_conn_done_bytes(const struct transport_conn* c) {
  return c->completed ? c->bytes_after[(c->completed - 1) % TRANSPORT_MAX_INFLIGHT] : 0;
}

/* Post `bytes` at `ptr`, memory of kind `mem` (TRANSPORT_CAP_*_MEM). */
static inline ncclResult_t transport_post(struct transport_conn* c, void* ptr, size_t bytes,
                                          unsigned mem, const struct transport_tag* tag) {
  struct transport_buf b = {.ptr = ptr, .bytes = bytes, .mem = mem};
  return transport_conn_post(c, &b, tag);
}
static inline ncclResult_t transport_post_host(struct transport_conn* c, void* ptr, size_t bytes,
                                               const struct transport_tag* tag) {
  return transport_post(c, ptr, bytes, TRANSPORT_CAP_HOST_MEM, tag);
}

extern const struct transport tcp_transport;
extern const struct transport shm_transport;
/* The chosen_device entry of a pair that no transport joins for device
 * memory: their device buffers go through pinned host slots. */
extern const struct transport transport_none;

/* Register [base, base + size) with every transport in `list` that has a
 * reg hook, handles[t->id] getting its handle: all or none (a failure
 * undoes those done). transport_register (transport_table.h) uses the table. */
ncclResult_t transport_register_each(const struct transport* const* list, size_t n,
                                     struct transport_ctx* ctx, void* base, size_t size,
                                     void** handles);
void transport_deregister_each(const struct transport* const* list, size_t n,
                               struct transport_ctx* ctx, void** handles);

#endif /* BRAID_TRANSPORT_H_ */
