/*
 * The net plugin transport: an NCCL net plugin (net_plugin.h) carries
 * Braid's messages between hosts where NCCL_NET names the plugin's
 * network (as NCCL picks among its nets by name).
 *
 * Setup, as NCCL does it: the receiving end listens, once per connection
 * (some plugins accept once per listener), and hands the plugin's 128-byte
 * handle to the sender, which connects with it. The handle travels on an
 * out-of-band socket of the TCP transport (tcp_oob_dial, as the verbs
 * transport's setup does), which also says who is at the other end. A
 * sender dials in its send phase and waits for nothing; its connection is
 * made later, as the handle arrives, by whichever of its comm's threads
 * next waits or moves messages (net_pump): a plugin's connect may finish
 * only once the peer accepts, and its accept once the sender connects, so
 * a rank waiting for a peer must move its own connections on meanwhile.
 * Neither connect nor accept blocks in the plugin; both are retried until
 * the timeout.
 *
 * Messages. A plugin matches sends and receives in posting order, one
 * connection per direction, and a receive may be larger than its send.
 * So each Braid message travels as a frame (sequence number, size, call),
 * then its payload in pieces of at most the device's largest message. A
 * receiver posts the payload only once the frame came and matched what it
 * posted, into exactly the bytes announced: another call's or size's
 * message fails the call before a byte of it lands in the buffer, and a
 * peer or plugin that sends more fails the plugin's receive, never writes
 * past it. A payload's registration (the plugin's regMr) is kept per
 * connection for the comm's own memory and for device allocations (the
 * whole allocation, checked by the driver's buffer id before each reuse:
 * an address freed and allocated again is registered again); any other
 * payload is registered for its message and deregistered when it
 * completes.
 * Plugins are polled: a blocked connection makes its waiter nap.
 */
#include "net_transport.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core.h"
#include "mem_kind.h"
#include "net_plugin.h"
#include "socket.h"
#include "tcp/tcp_connect.h"

#define NET_MAGIC 0x4e455442u /* "BTEN" */
#define NET_MAX_REQS 8        /* requests a connection keeps in a plugin at once */
#define NET_NAP_US 200        /* between tries of a connect or accept */

/* What a rank publishes: whether it opened the plugin (0: no pair with it
 * uses this transport), its device's speed (0: the plugin said none) and
 * latency, and whether the device takes CUDA device memory. */
struct net_blob {
  uint32_t valid;
  uint32_t speed_mbps;
  uint32_t device_ptrs;
  uint32_t latency_ns;
};

/* The receiver's answer to a sender's dial: where to connect. */
struct net_offer {
  uint32_t magic;
  uint32_t pad;
  uint8_t handle[NET_PLUGIN_HANDLE_BYTES];
};

struct net_frame {
  uint64_t seq;
  uint64_t bytes;
  struct transport_tag tag;
};

struct net_conn;

/* Per comm (ctx->state[NET_TRANSPORT_ID]). */
struct net_state {
  struct net_plugin* plugin;
  void* ctx; /* the plugin's, v11 and up */
  int dev;
  struct net_props props;
  pthread_mutex_t lock;        /* the connecting senders, from any of the comm's threads */
  struct net_conn* connecting; /* senders not yet connected */
  _Atomic uint64_t pumped_ns;  /* the last pump of the messages' progress */
};

/* One request in the plugin: what it moves, what to undo when done. */
struct net_req {
  void* request;
  void* flush;   /* a device receive's flush, once the request is done; NULL: none pending */
  char* at;      /* where its bytes are */
  void* mhandle; /* deregistered when done (NULL: the frames' own) */
  int mr;        /* its registration's entry in the conn's cache + 1; 0: its own */
  size_t bytes;  /* posted */
  int last;      /* the last request of its message */
  int is_frame;
};

struct net_msg {
  char* buf;
  size_t bytes;
  int owned;  /* the comm's own memory (transport_buf.owned): its registration is kept */
  int device; /* CUDA device memory */
  struct transport_tag tag;
};

/* Registrations of the comm's own memory (the executor's slots, posted
 * again and again), kept for the connection's life: a plugin's regMr is a
 * system call or more per message otherwise. An entry in use by a request
 * is never replaced. */
#define NET_MR_CACHE 32
struct net_mr {
  char* base;
  size_t len;
  uint64_t id; /* a device allocation's buffer id; 0: the comm's own host memory */
  int refused; /* the plugin would not register this allocation whole (mh NULL) */
  void* mh;
  int refs;
  uint64_t used;
};

struct net_conn {
  struct transport_conn base;
  struct net_state* st;
  struct transport_waits* waits;
  void* comm; /* the plugin's; NULL while a sender still connects */
  int tag;    /* the sender's rank, as NCCL tags */
  /* a sender until connected: its dial, the offer read so far, its deadline */
  int oob;
  struct net_offer offer;
  size_t offer_got;
  uint64_t deadline;
  ncclResult_t setup_res; /* why connecting failed, given by the conn's own progress */
  struct net_conn* next_connecting;
  /* the frames, registered once: a sender's are built here, a receiver's land here */
  struct net_frame frames[TRANSPORT_MAX_INFLIGHT];
  void* frames_mh;
  struct net_msg msgs[TRANSPORT_MAX_INFLIGHT];
  /* posting: the message and the offset in it (frame first) */
  uint64_t post_msg;
  size_t post_off;
  int post_framed;
  int frame_in_flight; /* a receiver's frame of post_msg, not yet come and checked */
  /* requests in flight, oldest first */
  struct net_req reqs[NET_MAX_REQS];
  int nreqs;
  struct net_mr mrs[NET_MR_CACHE];
  uint64_t mr_clock;
};

static struct net_state* net_state(const struct transport_ctx* ctx) {
  return ctx->state[NET_TRANSPORT_ID];
}

/* ---- the network's name and its blob ---- */

static int net_is(const char* name) {
  struct net_plugin* p;
  if (name == NULL || net_plugin_get(&p) != ncclSuccess) return 0;
  return strcasecmp(name, net_plugin_name(p)) == 0;
}

/* This rank's place among its host's ranks: the ranks of a host spread
 * over its devices (NICs), as NCCL gives each GPU its nearest NIC. */
static int net_local_index(const struct transport_ctx* ctx) {
  int local = 0;
  for (int r = 0; r < ctx->rank; r++)
    local += ctx->peers[r].host_hash == ctx->peers[ctx->rank].host_hash;
  return local;
}

/* One device's properties, as the log and the topology's report say them. */
static void net_props_text(const struct net_props* p, char* out, size_t len) {
  char speed[16] = "?"; /* a plugin may give none (aws-ofi-nccl over tcp), as sysfs may */
  if (p->speed_mbps > 0) snprintf(speed, sizeof(speed), "%d", p->speed_mbps);
  snprintf(out, len, "%s, %s Mb/s, %.1f us, messages up to %zu, %d receive%s grouped, %s memory",
           p->name, speed, p->latency_us, p->max_bytes, p->max_recvs, p->max_recvs > 1 ? "s" : "",
           p->device_ptrs ? "host and CUDA" : "host");
}

/* Every device the plugin has, in the log, each checked. */
static ncclResult_t net_devices_log(struct net_state* s, int ndev) {
  ncclResult_t res = ncclSuccess;
  for (int d = 0; d < ndev && debug_enabled(DEBUG_INFO, SUB_NET); d++) {
    struct net_props p;
    char text[256];
    CHECK(net_plugin_props(s->plugin, d, &p));
    net_props_text(&p, text, sizeof(text));
    INFO(SUB_INIT | SUB_NET, "NET/Plugin : %s device %d: %s%s", net_plugin_name(s->plugin), d, text,
         d == s->dev ? " (this rank's)" : "");
  }
fail:
  return res;
}

/* The topology's report: the plugin, its devices and what each says of
 * itself (checked again: a plugin may answer differently now), and which
 * device this rank uses (a host's ranks spread over them). */
static void net_describe(const struct transport_ctx* ctx, char* out, size_t len) {
  const struct net_state* s = net_state(ctx);
  int ndev = 0;
  size_t at = 0;
  if (s == NULL || net_plugin_devices(s->plugin, &ndev) != ncclSuccess) return;
  at = (size_t)MAX(
      0, snprintf(out, len, "%s %s, %d device%s, rank %d on device %d:", net_transport.name,
                  net_plugin_name(s->plugin), ndev, ndev == 1 ? "" : "s", ctx->rank, s->dev));
  for (int d = 0; d < ndev && at < len; d++) {
    struct net_props p;
    char text[256];
    if (net_plugin_props(s->plugin, d, &p) != ncclSuccess) break;
    net_props_text(&p, text, sizeof(text));
    at += (size_t)MAX(0, snprintf(out + at, len - at, "%s %d %s", d ? ";" : "", d, text));
  }
}

static ncclResult_t net_state_make(struct transport_ctx* ctx, struct net_state** out) {
  ncclResult_t res = ncclSuccess;
  struct net_state* s = NULL;
  int ndev = 0;
  CHECK(braid_calloc(&s, 1, sizeof(*s)));
  pthread_mutex_init(&s->lock, NULL);
  CHECK(net_plugin_get(&s->plugin));
  CHECK(net_plugin_open(s->plugin, ctx->secret * 0x9e3779b97f4a7c15ull, &s->ctx));
  CHECK(net_plugin_devices(s->plugin, &ndev));
  if (ndev == 0) FAIL(ncclSystemError, "NET/Plugin : %s has no device", net_plugin_name(s->plugin));
  s->dev = net_local_index(ctx) % ndev;
  CHECK(net_plugin_props(s->plugin, s->dev, &s->props));
  CHECK(net_devices_log(s, ndev));
  *out = s;
  return ncclSuccess;
fail:
  if (s && s->plugin && s->ctx) net_plugin_close(s->plugin, s->ctx);
  free(s);
  return res;
}

/* Only where NCCL_NET chose the plugin: otherwise the blob says "not here". */
static ncclResult_t net_blob_make(struct transport_ctx* ctx, void* blob) {
  ncclResult_t res = ncclSuccess;
  struct net_blob* b = blob;
  struct net_state* s = NULL;
  if (ctx->net != &net_transport) return ncclSuccess;
  CHECK(net_state_make(ctx, &s));
  ctx->state[NET_TRANSPORT_ID] = s;
  b->valid = 1;
  b->speed_mbps = (uint32_t)s->props.speed_mbps;
  b->device_ptrs = (uint32_t)s->props.device_ptrs;
  b->latency_ns = (uint32_t)MIN(s->props.latency_us * 1000.0, 1e9); /* checked: >= 0 */
fail:
  return res;
}

static int net_can_connect(const struct transport_ctx* ctx, int a, int b) {
  const struct net_blob *ba = transport_peer_blob(ctx, &net_transport, a),
                        *bb = transport_peer_blob(ctx, &net_transport, b);
  return ba->valid == 1 && bb->valid == 1;
}

static double net_link_latency_us(const struct transport_ctx* ctx, int rank) {
  const struct net_blob* b = transport_peer_blob(ctx, &net_transport, rank);
  return b->latency_ns / 1000.0;
}

/* Device buffers go straight to the plugin where both ends' devices take
 * CUDA memory; otherwise they are staged through pinned host memory. */
static int net_device_ok(const struct transport_ctx* ctx, int a, int b) {
  const struct net_blob *ba = transport_peer_blob(ctx, &net_transport, a),
                        *bb = transport_peer_blob(ctx, &net_transport, b);
  return ba->device_ptrs == 1 && bb->device_ptrs == 1;
}

/* What the tuner prices a rank's link at: its device's speed, else (the
 * plugin gave none) its NIC's, as the topology found it. From the peer
 * table, so every rank gets the same answer. */
static uint32_t net_link_mbps(const struct transport_ctx* ctx, int rank) {
  const struct net_blob* b = transport_peer_blob(ctx, &net_transport, rank);
  return b->speed_mbps ? b->speed_mbps : ctx->peers[rank].nic_mbps;
}

/* ---- connections ---- */

static ncclResult_t net_conn_new(struct net_state* s, struct transport_ctx* ctx, int peer,
                                 int is_send, struct net_conn** out) {
  struct net_conn* c = NULL;
  ncclResult_t res = braid_calloc(&c, 1, sizeof(*c));
  if (res != ncclSuccess) return res;
  c->base.ops = &net_transport;
  c->base.peer = peer;
  c->base.is_send = is_send;
  c->base.device_direct = net_device_ok(ctx, ctx->rank, peer);
  c->st = s;
  c->waits = ctx->waits;
  c->tag = is_send ? ctx->rank : peer;
  c->oob = -1;
  *out = c;
  return ncclSuccess;
}

/* The plugin's connection is made: the frames get their registration,
 * then the connection is published (another thread's progress may be
 * looking: it reads comm with acquire, and so sees frames_mh). It is c's
 * to close even when the registration failed. */
static ncclResult_t net_conn_ready(struct net_conn* c, void* comm) {
  void* mh = NULL;
  ncclResult_t res = net_plugin_reg(c->st->plugin, comm, c->frames, sizeof(c->frames), 0, &mh);
  c->frames_mh = mh;
  __atomic_store_n(&c->comm, comm, __ATOMIC_RELEASE);
  return res;
}

/* One step of a sender's setup, never waiting: read what there is of the
 * receiver's offer; once whole, try to connect. */
static ncclResult_t net_sender_step(struct net_conn* c) {
  ncclResult_t res = ncclSuccess;
  struct net_state* s = c->st;
  void* comm = NULL;
  if (c->offer_got < sizeof(c->offer)) {
    ssize_t n = recv(c->oob, (char*)&c->offer + c->offer_got, sizeof(c->offer) - c->offer_got,
                     MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      FAIL(ncclRemoteError, "NET/Plugin : rank %d closed its setup socket (it failed or died)",
           c->base.peer);
    if (n > 0) c->offer_got += (size_t)n;
    if (c->offer_got < sizeof(c->offer)) goto check_time;
    if (c->offer.magic != NET_MAGIC)
      FAIL(ncclRemoteError, "NET/Plugin : rank %d answered with something not an offer",
           c->base.peer);
  }
  CHECK(net_plugin_connect(s->plugin, s->ctx, s->dev, c->offer.handle, &comm));
  if (comm) { /* the receiver hears it made it: a close without this is a failure */
    (void)!send(c->oob, "K", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    close(c->oob);
    c->oob = -1;
    return net_conn_ready(c, comm);
  }
check_time:
  if (braid_now_ns() >= c->deadline)
    FAIL(ncclSystemError, "NET/Plugin : timed out connecting to rank %d (BRAID_TIMEOUT_MS)",
         c->base.peer);
fail:
  return res;
}

/* Move every connecting sender of the comm one step; those connected
 * leave the list, and so do those that failed, their error kept for their
 * own progress to give (a connection that fails fails its calls, not the
 * others'). */
static void net_pump(struct net_state* s) {
  pthread_mutex_lock(&s->lock);
  for (struct net_conn** at = &s->connecting; *at;) {
    struct net_conn* c = *at;
    ncclResult_t res = net_sender_step(c);
    if (res == ncclSuccess && c->comm == NULL) {
      at = &c->next_connecting;
      continue;
    }
    *at = c->next_connecting;
    if (c->oob >= 0) close(c->oob);
    c->oob = -1;
    __atomic_store_n(&c->setup_res, res, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&s->lock);
}

/* A sender closed while connecting leaves the list (under the lock: a
 * pump on another thread may be stepping it). */
static void net_connecting_drop(struct net_state* s, struct net_conn* c) {
  pthread_mutex_lock(&s->lock);
  for (struct net_conn** at = &s->connecting; *at; at = &(*at)->next_connecting)
    if (*at == c) {
      *at = c->next_connecting;
      break;
    }
  if (c->oob >= 0) close(c->oob);
  c->oob = -1;
  pthread_mutex_unlock(&s->lock);
}

/* Dial the receiver; the rest comes as its offer does (net_pump). */
static ncclResult_t net_connect_send(struct transport_ctx* ctx, int peer, int channel,
                                     struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct net_state* s = net_state(ctx);
  struct net_conn* c = NULL;
  CHECK(net_conn_new(s, ctx, peer, 1, &c));
  CHECK(tcp_oob_dial(ctx, peer, channel, &c->oob));
  c->deadline = socket_deadline(ctx->timeout_ms);
  pthread_mutex_lock(&s->lock);
  c->next_connecting = s->connecting;
  s->connecting = c;
  pthread_mutex_unlock(&s->lock);
  *out = &c->base;
  return ncclSuccess;
fail:
  free(c);
  return res;
}

/* Wait out a plugin's "not yet", within the deadline, moving the comm's
 * own connecting senders on meanwhile. */
static ncclResult_t net_nap(struct transport_ctx* ctx, uint64_t deadline, const char* what,
                            int peer) {
  net_pump(net_state(ctx));
  if (ctx->aborted && atomic_load(ctx->aborted)) {
    WARN("NET/Plugin : communicator aborted while waiting to %s rank %d", what, peer);
    return ncclSystemError;
  }
  if (braid_now_ns() >= deadline) {
    WARN("NET/Plugin : timed out waiting to %s rank %d (BRAID_TIMEOUT_MS)", what, peer);
    return ncclSystemError;
  }
  usleep(NET_NAP_US);
  return ncclSuccess;
}

/* While accepting: whether the sender's connect failed (it closed the
 * setup socket without its 'K'), so that the receiver fails at once
 * rather than at the timeout. *heard: the 'K' came, stop looking. */
static ncclResult_t net_sender_alive(int oob, int peer, int* heard) {
  char k;
  ssize_t n = recv(oob, &k, 1, MSG_DONTWAIT);
  if (n == 1 && k == 'K') *heard = 1;
  if (n == 0 || (n == 1 && k != 'K') ||
      (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    WARN("NET/Plugin : rank %d could not connect (it closed its setup socket)", peer);
    return ncclRemoteError;
  }
  return ncclSuccess;
}

/* Answer the sender's dial with a listener of this connection's own, and
 * accept on it. */
static ncclResult_t net_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                                     struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct net_state* s = net_state(ctx);
  uint64_t deadline = socket_deadline(ctx->timeout_ms);
  struct net_offer offer = {NET_MAGIC, 0, {0}};
  struct net_conn* c = NULL;
  void *listen = NULL, *comm = NULL;
  int oob = -1;
  CHECK(tcp_oob_answer(ctx, peer, channel, &oob));
  CHECK(net_plugin_listen(s->plugin, s->ctx, s->dev, offer.handle, &listen));
  CHECK(socket_send_all(oob, &offer, sizeof(offer), deadline, ctx->aborted));
  for (int heard = 0;;) {
    CHECK(net_plugin_accept(s->plugin, listen, &comm));
    if (comm) break;
    if (!heard) CHECK(net_sender_alive(oob, peer, &heard));
    CHECK(net_nap(ctx, deadline, "accept", peer));
  }
  CHECK(net_conn_new(s, ctx, peer, 0, &c));
  res = net_conn_ready(c, comm);
  comm = NULL; /* c's now, closed with it */
  CHECK(res);
  *out = &c->base;
fail:
  if (res != ncclSuccess && c) net_transport.close(&c->base);
  net_plugin_close_recv(s->plugin, comm);
  net_plugin_close_listen(s->plugin, listen);
  if (oob >= 0) close(oob);
  return res;
}

/* ---- messages ---- */

static ncclResult_t net_post(struct transport_conn* base, const struct transport_buf* b,
                             const struct transport_tag* tag) {
  struct net_conn* c = (struct net_conn*)base;
  struct net_msg* m = &c->msgs[base->posted % TRANSPORT_MAX_INFLIGHT];
  if (base->posted - base->completed >= TRANSPORT_MAX_INFLIGHT) {
    WARN("NET/Plugin : too many messages in flight to rank %d", base->peer);
    return ncclInternalError;
  }
  if (!transport_moves(base, b)) return ncclInternalError;
  m->buf = b->ptr;
  m->owned = b->owned;
  m->device = b->mem == TRANSPORT_CAP_DEVICE_MEM;
  m->bytes = b->bytes;
  memset(&m->tag, 0, sizeof(m->tag));
  if (tag) m->tag = *tag;
  base->posted++;
  return ncclSuccess;
}

/* Post the frame of message post_msg: built here by a sender, landing
 * here for a receiver. */
static ncclResult_t net_post_frame(struct net_conn* c, struct net_msg* m, struct net_req* r) {
  struct net_frame* f = &c->frames[c->post_msg % TRANSPORT_MAX_INFLIGHT];
  struct net_plugin* p = c->st->plugin;
  if (c->base.is_send) *f = (struct net_frame){c->post_msg, m->bytes, m->tag};
  *r = (struct net_req){.bytes = sizeof(*f), .last = m->bytes == 0, .is_frame = 1};
  return c->base.is_send
             ? net_plugin_isend(p, c->comm, f, sizeof(*f), c->tag, c->frames_mh, &r->request)
             : net_plugin_irecv(p, c->comm, f, sizeof(*f), c->tag, c->frames_mh, &r->request);
}

/* What a request's registration may be kept as (net_mr): the comm's own
 * host memory as posted, a device allocation whole; 0 when neither (a
 * user's host buffer may be freed and its address reused unseen). */
static int net_mr_key(const struct net_msg* m, char* at, size_t len, struct net_mr* key) {
  uintptr_t base;
  size_t size;
  uint64_t id;
  if (m->owned && !m->device) {
    *key = (struct net_mr){.base = at, .len = len};
    return 1;
  }
  if (!m->device || !mem_device_range(at, &base, &size, &id)) return 0;
  *key = (struct net_mr){.base = (char*)base, .len = size, .id = id};
  return 1;
}

/* The cache's entry for key, else the least recently used free one
 * (deregistered, made key's), else NULL: also where a device allocation
 * cannot be registered whole (a NIC's limit on a region), so that its
 * messages are registered one by one as before; the refusal is kept like
 * a registration, so that it is asked (and warned of) once. */
static ncclResult_t net_mr_find(struct net_conn* c, const struct net_mr* key, int device,
                                struct net_mr** out) {
  ncclResult_t res = ncclSuccess;
  struct net_plugin* p = c->st->plugin;
  struct net_mr* free_e = NULL;
  *out = NULL;
  for (int i = 0; i < NET_MR_CACHE; i++) {
    struct net_mr* e = &c->mrs[i];
    int same = e->base == key->base && e->len >= key->len && e->id == key->id;
    if (same && e->refused) {
      e->used = ++c->mr_clock; /* kept as long as a registration in use */
      return ncclSuccess;
    }
    if (same && e->mh) {
      *out = e;
      return ncclSuccess;
    }
    if (e->refs == 0 && (free_e == NULL || e->used < free_e->used)) free_e = e;
  }
  if (free_e == NULL) return ncclSuccess;
  net_plugin_dereg(p, c->comm, free_e->mh);
  free_e->mh = NULL;
  res = net_plugin_reg(p, c->comm, key->base, key->len, device, &free_e->mh);
  free_e->base = key->base;
  free_e->len = key->len;
  free_e->id = key->id;
  free_e->refused = res != ncclSuccess && device;
  if (free_e->refused) {
    INFO(SUB_NET, "NET/Plugin : %zu bytes of device memory not registered whole; by message",
         key->len);
    return ncclSuccess;
  }
  CHECK(res);
  *out = free_e;
fail:
  return res;
}

/* A registration of [at, at + len) for a request: from the cache (*mr its
 * entry + 1), else made for it (*mr 0). */
static ncclResult_t net_mr_get(struct net_conn* c, const struct net_msg* m, char* at, size_t len,
                               void** mh, int* mr) {
  ncclResult_t res = ncclSuccess;
  struct net_mr key, *e = NULL;
  *mr = 0;
  if (net_mr_key(m, at, len, &key)) CHECK(net_mr_find(c, &key, m->device, &e));
  if (e == NULL) return net_plugin_reg(c->st->plugin, c->comm, at, len, m->device, mh);
  e->refs++;
  e->used = ++c->mr_clock;
  *mh = e->mh;
  *mr = (int)(e - c->mrs) + 1;
fail:
  return res;
}

/* A request's registration is done with. */
static void net_mr_put(struct net_conn* c, const struct net_req* r) {
  if (r->mr)
    c->mrs[r->mr - 1].refs--;
  else
    net_plugin_dereg(c->st->plugin, c->comm, r->mhandle);
}

/* Post the next piece of message post_msg's payload, registered for it. */
static ncclResult_t net_post_piece(struct net_conn* c, struct net_msg* m, struct net_req* r) {
  ncclResult_t res = ncclSuccess;
  struct net_plugin* p = c->st->plugin;
  size_t len = MIN(m->bytes - c->post_off, c->st->props.max_bytes);
  char* at = m->buf + c->post_off;
  *r = (struct net_req){.at = at, .bytes = len, .last = c->post_off + len == m->bytes};
  CHECK(net_mr_get(c, m, at, len, &r->mhandle, &r->mr));
  res = c->base.is_send ? net_plugin_isend(p, c->comm, at, len, c->tag, r->mhandle, &r->request)
                        : net_plugin_irecv(p, c->comm, at, len, c->tag, r->mhandle, &r->request);
  if (res != ncclSuccess || r->request == NULL) net_mr_put(c, r);
fail:
  return res;
}

/* The next request of the message being posted: its frame, then its
 * payload's pieces, a receiver's only once the frame came and matched.
 * *posted 0: nothing to post now. */
static ncclResult_t net_post_next(struct net_conn* c, int* posted) {
  ncclResult_t res = ncclSuccess;
  struct net_msg* m = &c->msgs[c->post_msg % TRANSPORT_MAX_INFLIGHT];
  struct net_req r;
  *posted = 0;
  if (c->post_msg >= c->base.posted || c->nreqs == NET_MAX_REQS) return ncclSuccess;
  if (c->post_framed && c->frame_in_flight) return ncclSuccess;
  CHECK(c->post_framed ? net_post_piece(c, m, &r) : net_post_frame(c, m, &r));
  if (r.request == NULL) return ncclSuccess; /* the plugin is full: later */
  c->reqs[c->nreqs++] = r;
  *posted = 1;
  if (r.is_frame) {
    c->post_framed = 1;
    c->frame_in_flight = !c->base.is_send && !r.last; /* an empty message's has no payload */
  } else {
    c->post_off += r.bytes;
  }
  if (r.last) { /* the payload's last piece, or the frame of an empty message */
    c->post_msg++;
    c->post_off = 0;
    c->post_framed = 0;
  }
fail:
  return res;
}

/* A receiver's frame came: the message it announces must be the one posted. */
static ncclResult_t net_frame_check(struct net_conn* c, uint64_t seq) {
  const struct net_frame* f = &c->frames[seq % TRANSPORT_MAX_INFLIGHT];
  const struct net_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  return transport_check_message(&c->base, f->seq, f->bytes, &f->tag, seq, m->bytes, &m->tag);
}

/* Test the oldest request; retire it when done (*retired). */
static ncclResult_t net_retire(struct net_conn* c, int* retired) {
  ncclResult_t res = ncclSuccess;
  struct net_state* s = c->st;
  struct net_req* r = &c->reqs[0];
  int done = 0, recv = !c->base.is_send;
  size_t got = 0;
  *retired = 0;
  if (r->flush) { /* done already: its flush is what it waits for */
    CHECK(net_plugin_test(s->plugin, r->flush, 0, &done, NULL));
    if (!done) return ncclSuccess;
    r->flush = NULL;
    goto done;
  }
  CHECK(net_plugin_test(s->plugin, r->request, r->bytes, &done, recv ? &got : NULL));
  if (!done) return ncclSuccess;
  if (recv && got != r->bytes)
    FAIL(ncclRemoteError, "NET/Plugin : rank %d sent %zu bytes where %zu were announced",
         c->base.peer, got, r->bytes);
  if (recv && r->is_frame) {
    CHECK(net_frame_check(c, c->base.completed));
    if (!r->last) c->frame_in_flight = 0; /* the frame whose payload waits */
  }
  /* a message received into device memory is flushed before it completes */
  if (recv && r->last && !r->is_frame &&
      c->msgs[c->base.completed % TRANSPORT_MAX_INFLIGHT].device) {
    CHECK(net_plugin_iflush(s->plugin, c->comm, r->at, r->bytes, r->mhandle, &r->flush));
    if (r->flush) return ncclSuccess;
  }
done:
  if (!r->is_frame) net_mr_put(c, r);
  if (r->last) c->base.completed++;
  memmove(&c->reqs[0], &c->reqs[1], (size_t)(--c->nreqs) * sizeof(c->reqs[0]));
  *retired = 1;
fail:
  return res;
}

static ncclResult_t net_progress(struct transport_conn* base, int* progressed) {
  ncclResult_t res = ncclSuccess;
  struct net_conn* c = (struct net_conn*)base;
  int posted = 1, retired = 1;
  /* the comm's connecting senders move on with its traffic, every
   * millisecond or so (a connection made for a call that sent nothing on
   * it still owes the peer its connect); this one's at once */
  int connected = __atomic_load_n(&c->comm, __ATOMIC_ACQUIRE) != NULL;
  int others = __atomic_load_n(&c->st->connecting, __ATOMIC_RELAXED) != NULL;
  uint64_t now = connected && others ? braid_now_ns() : 0; /* no clock while none connects */
  if (!connected ||
      (others && now - atomic_load_explicit(&c->st->pumped_ns, memory_order_relaxed) > 1000000)) {
    atomic_store_explicit(&c->st->pumped_ns, now, memory_order_relaxed);
    net_pump(c->st);
  }
  CHECK(__atomic_load_n(&c->setup_res, __ATOMIC_ACQUIRE)); /* its connect failed */
  connected = __atomic_load_n(&c->comm, __ATOMIC_ACQUIRE) != NULL;
  if (!connected) goto wait;
  while (posted || retired) {
    CHECK(net_post_next(c, &posted));
    retired = 0;
    if (c->nreqs > 0) CHECK(net_retire(c, &retired));
    if (retired) *progressed = 1;
  }
wait:
  if (base->completed < base->posted || !connected) transport_wait_nap(c->waits);
fail:
  return res;
}

static int net_connecting(const struct transport_conn* base) {
  const struct net_conn* c = (const struct net_conn*)base;
  return __atomic_load_n(&c->comm, __ATOMIC_ACQUIRE) == NULL;
}

static void net_shutdown(struct transport_conn* base) {
  (void)base; /* a plugin has no half-close: the peer hears of it at close */
}

static void net_close(struct transport_conn* base) {
  struct net_conn* c = (struct net_conn*)base;
  struct net_state* s = c->st;
  if (base->is_send) net_connecting_drop(s, c);
  for (int i = 0; i < c->nreqs; i++)
    if (!c->reqs[i].is_frame && !c->reqs[i].mr)
      net_plugin_dereg(s->plugin, c->comm, c->reqs[i].mhandle);
  for (int i = 0; i < NET_MR_CACHE; i++) net_plugin_dereg(s->plugin, c->comm, c->mrs[i].mh);
  net_plugin_dereg(s->plugin, c->comm, c->frames_mh);
  if (base->is_send)
    net_plugin_close_send(s->plugin, c->comm);
  else
    net_plugin_close_recv(s->plugin, c->comm);
  free(c);
}

static void net_free_state(struct transport_ctx* ctx) {
  struct net_state* s = net_state(ctx);
  net_plugin_close(s->plugin, s->ctx);
  pthread_mutex_destroy(&s->lock);
  free(s);
  ctx->state[NET_TRANSPORT_ID] = NULL;
}

const struct transport net_transport = {
    .name = "NET/Plugin",
    .key = "net",
    .id = NET_TRANSPORT_ID,
    .net_is = net_is,
    .link = TRANSPORT_LINK_NETWORK,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_DEVICE_MEM, /* device: where device_ok */
    .can_connect = net_can_connect,
    .device_ok = net_device_ok,
    .connecting = net_connecting,
    .blob_bytes = sizeof(struct net_blob),
    .blob_make = net_blob_make,
    .connect_send = net_connect_send,
    .connect_recv = net_connect_recv,
    .post = net_post,
    .progress = net_progress,
    .shutdown = net_shutdown,
    .close = net_close,
    .free_state = net_free_state,
    .link_mbps = net_link_mbps,
    .link_latency_us = net_link_latency_us,
    .describe = net_describe,
};
