/*
 * The transport table: which transport carries a pair of ranks, and what
 * each publishes about its rank. Every transport says which pairs it can
 * join (can_connect) and what it moves (caps); a pair takes the first that
 * fits, in the order below: the most direct path first, the network last.
 * Each transport's blob (where it listens, what names its segments) has a
 * slice of peer_info.blobs of its own (transport.c). NCCL's knobs steer the choice:
 * NCCL_SHM_DISABLE (a rank announces no shared-memory domain, so no pair
 * with it passes shm's check), NCCL_P2P_DISABLE (no cudaipc) and NCCL_NET,
 * which names the network. Host buffers and device buffers choose apart:
 * only cudaipc moves device memory as it is; the others move pinned host
 * slots the device path stages through.
 */
#include "transport_table.h"

#include <strings.h>

#include "core.h"
#include "param.h"
#include "tcp/tcp_connect.h"
#include "transport.h"
#ifdef BRAID_HAVE_IBVERBS
#include "ib/ib_probe.h"
#endif

static const struct transport* const k_table[] = {
#ifdef BRAID_HAVE_CUDA
    &cudaipc_transport, /* device buffers only: the host ones go on to shm */
#endif
    &shm_transport,
#ifdef BRAID_HAVE_IBVERBS
    &ib_transport, /* where NCCL_NET=IB */
#endif
    &tcp_transport};
#define TABLE_SIZE (sizeof(k_table) / sizeof(k_table[0]))

/* Networks by NCCL_NET's names. */
static const struct transport* net_named(const char* name) {
  if (name == NULL || strcasecmp(name, "Socket") == 0) return &tcp_transport;
#ifdef BRAID_HAVE_IBVERBS
  if (strcasecmp(name, "IB") == 0) return &ib_transport;
#endif
  return NULL;
}

ncclResult_t transport_blobs_make(struct transport_ctx* ctx, struct peer_info* mine) {
  ncclResult_t res = ncclSuccess;
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    const struct transport* t = k_table[i];
    if (t->blob_bytes > transport_blob_room(t->id))
      FAIL(ncclInternalError, "%s's blob needs %zu bytes, its place in the peer table has %zu",
           t->name, t->blob_bytes, transport_blob_room(t->id));
    CHECK(t->blob_make(ctx, transport_blob_in(mine, t->id)));
  }
fail:
  return res;
}

ncclResult_t transport_register(struct transport_ctx* ctx, void* base, size_t size,
                                void** handles) {
  return transport_register_each(k_table, TABLE_SIZE, ctx, base, size, handles);
}

void transport_deregister(struct transport_ctx* ctx, void** handles) {
  transport_deregister_each(k_table, TABLE_SIZE, ctx, handles);
}

static int is_network(const struct transport* t) {
  return t->id == TRANSPORT_NET_SOCKET || t->id == TRANSPORT_NET_IB;
}

ncclResult_t transport_table_init(struct transport_ctx* ctx) {
  const char* net = param_net();
  ctx->net = net_named(net);
#ifdef BRAID_HAVE_IBVERBS
  if (ctx->net == &ib_transport) return ib_probe(); /* a clear error unless a port is usable */
#endif
  if (ctx->net != NULL) return ncclSuccess;
  WARN("NCCL_NET=%s : no such network in this build (Socket%s)", net,
#ifdef BRAID_HAVE_IBVERBS
       ", IB"
#else
       ""
#endif
  );
  return ncclInvalidArgument;
}

const struct transport* transport_network(const struct transport_ctx* ctx) {
  return ctx->net ? ctx->net : &tcp_transport;
}

const struct transport* transport_select(const struct transport_ctx* ctx, int a, int b,
                                         unsigned mem_caps) {
  for (size_t i = 0; i < TABLE_SIZE; i++) {
    const struct transport* t = k_table[i];
    if ((t->caps & mem_caps) != mem_caps) continue;
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
