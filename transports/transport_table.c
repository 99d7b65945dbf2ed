/*
 * The transport table: which transport carries a pair of ranks, and what
 * each publishes about its rank. Every transport says which pairs it can
 * join (can_connect) and what it moves (caps); a pair takes the first that
 * fits, in the order below: the most direct path first, the network last.
 * Each transport's blob (where it listens, what names its segments) is a
 * record of peer_info.blobs (transport.c). NCCL's knobs steer the choice:
 * NCCL_SHM_DISABLE (a rank announces no shared-memory domain, so no pair
 * with it passes shm's check), NCCL_P2P_DISABLE (no cudaipc) and NCCL_NET,
 * which names the network (a row's net_name). Host buffers and device
 * buffers choose apart: only cudaipc moves device memory as it is; the
 * others move pinned host slots the device path stages through.
 *
 * A row is a transport's descriptor (transport.h): adding a transport is
 * its folder and its row here.
 */
#include "transport_table.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core.h"
#include "param.h"
#include "net/net_transport.h"
#include "tcp/tcp_connect.h"
#include "transport.h"
#ifdef BRAID_HAVE_CUDA
#include "cudaipc/cudaipc.h"
#endif
#ifdef BRAID_HAVE_IBVERBS
#include "ib/ib_transport.h"
#endif

/* A test build may add a row of its own ahead of the others (mp_test_rows
 * compiles this file again with BRAID_TEST_TRANSPORT naming its
 * tests/rows transport): the library itself never has one. */
#ifdef BRAID_TEST_TRANSPORT
extern const struct transport BRAID_TEST_TRANSPORT;
#endif

static const struct transport* const k_table[] = {
#ifdef BRAID_TEST_TRANSPORT
    &BRAID_TEST_TRANSPORT,
#endif
#ifdef BRAID_HAVE_CUDA
    &cudaipc_transport, /* device buffers only: the host ones go on to shm */
#endif
    &shm_transport,
#ifdef BRAID_HAVE_IBVERBS
    &ib_transport, /* where NCCL_NET=IB */
#endif
    &net_transport, /* where NCCL_NET names a net plugin's network */
    &tcp_transport};
#define TABLE_SIZE (sizeof(k_table) / sizeof(k_table[0]))

/* Whether a row crosses the network. */
static int is_network(const struct transport* t) {
  return t->net_name != NULL || t->net_is != NULL;
}

/* Networks by NCCL_NET's names (Socket when unset): the built-in names
 * first, so that only a name none of them has loads a net plugin. */
static const struct transport* net_named(const char* name) {
  if (name == NULL) name = tcp_transport.net_name;
  for (size_t i = 0; i < TABLE_SIZE; i++)
    if (k_table[i]->net_name && strcasecmp(name, k_table[i]->net_name) == 0) return k_table[i];
  for (size_t i = 0; i < TABLE_SIZE; i++)
    if (k_table[i]->net_is && k_table[i]->net_is(name)) return k_table[i];
  return NULL;
}

ncclResult_t transport_blobs_make(struct transport_ctx* ctx, struct peer_info* mine) {
  ncclResult_t res = ncclSuccess;
  memset(mine->blobs, 0, sizeof(mine->blobs));
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    const struct transport* t = k_table[i];
    if (t->blob_bytes == 0) continue;
    void* blob = transport_blob_put(mine, t);
    if (blob == NULL)
      FAIL(ncclInternalError,
           "%s's blob of %zu bytes does not fit the peer table's %d: raise PEER_BLOB_BYTES",
           t->name, t->blob_bytes, PEER_BLOB_BYTES);
    CHECK(t->blob_make(ctx, blob));
  }
fail:
  return res;
}

const char* transport_key_of(unsigned id) {
  for (size_t i = 0; i < TABLE_SIZE; i++)
    if (k_table[i]->id == id) return k_table[i]->key;
  return NULL;
}

int transport_id_of(const char* key) {
  for (size_t i = 0; i < TABLE_SIZE; i++)
    if (strcmp(k_table[i]->key, key) == 0) return (int)k_table[i]->id;
  return -1;
}

ncclResult_t transport_register(struct transport_ctx* ctx, void* base, size_t size,
                                void** handles) {
  return transport_register_each(k_table, TABLE_SIZE, ctx, base, size, handles);
}

void transport_deregister(struct transport_ctx* ctx, void** handles) {
  transport_deregister_each(k_table, TABLE_SIZE, ctx, handles);
}

/* Every row's id is its own and in range: per-comm arrays and peers'
 * blobs are indexed by it. */
static ncclResult_t rows_check(void) {
  unsigned seen = 0;
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    const struct transport* t = k_table[i];
    if (t->id >= TRANSPORT_MAX_ID || (seen & (1u << t->id)) || t->key == NULL) {
      WARN("Transport table: %s has id %u, taken or past %d, or no key", t->name, t->id,
           TRANSPORT_MAX_ID);
      return ncclInternalError;
    }
    seen |= 1u << t->id;
  }
  return ncclSuccess;
}

/* "Socket, IB, a net plugin's": the networks of this build, for
 * NCCL_NET's error. */
static void net_names(char* out, size_t size) {
  size_t at = 0;
  out[0] = '\0';
  for (size_t i = 0; i < TABLE_SIZE && at < size; i++)
    if (is_network(k_table[i]))
      at += (size_t)snprintf(
          out + at, size - at, "%s%s", at ? ", " : "",
          k_table[i]->net_name ? k_table[i]->net_name : "a net plugin's (NCCL_NET_PLUGIN)");
}

ncclResult_t transport_table_init(struct transport_ctx* ctx) {
  ncclResult_t res = rows_check();
  const char* net = param_net();
  char names[128];
  if (res != ncclSuccess) return res;
  ctx->net = net_named(net);
  if (ctx->net != NULL) /* a network that can fail to run says so now (verbs: no usable port) */
    return ctx->net->net_check ? ctx->net->net_check() : ncclSuccess;
  net_names(names, sizeof(names));
  WARN("NCCL_NET=%s : no such network in this build (%s)", net, names);
  return ncclInvalidArgument;
}

const struct transport* transport_network(const struct transport_ctx* ctx) {
  return ctx->net ? ctx->net : &tcp_transport;
}

int transport_network_describe(const struct transport_ctx* ctx, char* out, size_t len) {
  const struct transport* t = transport_network(ctx);
  if (len == 0) return 0;
  out[0] = '\0';
  if (t->describe) t->describe(ctx, out, len);
  return out[0] != '\0';
}

const struct transport* transport_select(const struct transport_ctx* ctx, int a, int b,
                                         unsigned mem_caps) {
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    const struct transport* t = k_table[i];
    if ((t->caps & mem_caps) != mem_caps) continue;
    if ((mem_caps & TRANSPORT_CAP_DEVICE_MEM) && t->device_ok && !t->device_ok(ctx, a, b)) continue;
    if (is_network(t) && t != transport_network(ctx)) continue; /* not NCCL_NET's */
    if (t->can_connect(ctx, a, b)) return t;
  }
  return NULL;
}

ncclResult_t transport_for_peer(struct transport_ctx* ctx, int peer, const struct transport** out) {
  const struct transport* t = ctx->chosen[peer];
  if (t == NULL) {
    t = transport_select(ctx, ctx->rank, peer, TRANSPORT_CAP_HOST_MEM);
    if (t == NULL) {
      WARN("Rank %d: no transport of this build can reach rank %d", ctx->rank, peer);
      return ncclSystemError;
    }
    ctx->chosen[peer] = t;
    INFO(SUB_INIT, "Rank %d: peer %d via %s", ctx->rank, peer, t->name);
  }
  *out = t;
  return ncclSuccess;
}

/* No transport: what chosen_device holds for a pair none joins. */
const struct transport transport_none = {.name = "none (staged through host memory)"};

const struct transport* transport_for_peer_device(struct transport_ctx* ctx, int peer) {
  const struct transport* t = ctx->chosen_device[peer];
  if (ctx->device == NULL) return NULL; /* no device call yet: nothing to move */
  if (t == NULL) {
    t = transport_select(ctx, ctx->rank, peer, TRANSPORT_CAP_DEVICE_MEM);
    if (t == NULL) t = &transport_none;
    ctx->chosen_device[peer] = t;
    INFO(SUB_INIT, "Rank %d: peer %d's device buffers via %s", ctx->rank, peer, t->name);
  }
  return t == &transport_none ? NULL : t;
}

ncclResult_t transport_device_attach(struct transport_ctx* ctx, struct transport_device* dev) {
  ncclResult_t res = ncclSuccess;
  ctx->device = dev;
  for (size_t i = 0; i < TABLE_SIZE; i++)
    if (k_table[i]->device_attach) CHECK(k_table[i]->device_attach(ctx));
fail:
  return res;
}

ncclResult_t transport_ctx_fork(struct transport_ctx* ctx, int epoll_fd,
                                struct transport_waits* waits, struct transport_ctx* out) {
  ncclResult_t res = transport_accept_share(ctx);
  if (res != ncclSuccess) return res;
  *out = *ctx;
  out->epoll_fd = epoll_fd;
  out->waits = waits;
  out->chosen = out->chosen_device = NULL; /* the comm's choices stay the comm's */
  return ncclSuccess;
}

const struct transport* transport_lane_for_peer(const struct transport_ctx* ctx, int peer) {
  return shm_transport.can_connect(ctx, ctx->rank, peer) ? &shm_transport : &tcp_transport;
}

void transport_states_free(struct transport_ctx* ctx) {
  transport_accept_free(ctx); /* incoming connections nobody claimed */
  for (size_t i = 0; i < TABLE_SIZE; i++)
    if (k_table[i]->free_state && ctx->state[k_table[i]->id]) k_table[i]->free_state(ctx);
}
