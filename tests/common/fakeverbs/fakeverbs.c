/*
 * A stand-in for libibverbs.so.1 for the tests (never in the library),
 * selected by the library path: LD_LIBRARY_PATH=build/tests/fakeverbs.
 * This file: devices, their ports and contexts; fakeverbs.h lists the
 * rest (memory, completions, queue pairs and their wire, faults).
 *
 *   FAKEVERBS_HCAS   comma list of name:ports[:eth] (default: none), e.g.
 *                    "mlx5_0:2,roce0:1:eth"; every port active, 4x EDR
 *                    (100 Gb/s), LIDs from 1; ":eth" ports are RoCE
 *   FAKEVERBS_DOWN   comma list of name:port that are down
 *   FAKEVERBS_SYSFS  where each HCA's sysfs directory is (<dir>/<name>,
 *                    read for device/numa_node)
 *   FAKEVERBS_FAULT  faults to inject, kind:n comma list, each firing once,
 *                    on the n-th event of its kind in the process (from 1):
 *                    access (a request's rkey check at its target fails:
 *                    remote access error), retry (a request is never
 *                    acknowledged: retry exceeded), fatal (a device fatal
 *                    async event once n requests were posted), rnr (the
 *                    n-th request that needs a receive is refused as if
 *                    its receiver had run out of them for good: RNR retry
 *                    exceeded; without the fault such a request waits for
 *                    a receive, as with unlimited RNR retries)
 *   FAKEVERBS_DELAY_US  the HCA pauses this long before each request
 */
#include <fcntl.h>
#include <unistd.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "fakeverbs.h"

#define FV_MAX_HCAS 16

static struct fv_hca g_hcas[FV_MAX_HCAS];
static int g_nhcas = -1;

static void fv_load(void) {
  const char* spec = getenv("FAKEVERBS_HCAS");
  const char* sysfs = getenv("FAKEVERBS_SYSFS");
  char buf[1024];
  g_nhcas = 0;
  if (spec == NULL) return;
  snprintf(buf, sizeof(buf), "%s", spec);
  for (char *save = NULL, *e = strtok_r(buf, ",", &save); e && g_nhcas < FV_MAX_HCAS;
       e = strtok_r(NULL, ",", &save)) {
    struct fv_hca* h = &g_hcas[g_nhcas++];
    char* f1 = strchr(e, ':');
    char* f2 = f1 ? strchr(f1 + 1, ':') : NULL;
    if (f1) *f1 = '\0';
    if (f2) *f2 = '\0';
    memset(h, 0, sizeof(*h));
    snprintf(h->dev.name, sizeof(h->dev.name), "%s", e);
    snprintf(h->dev.ibdev_path, sizeof(h->dev.ibdev_path), "%s/%s", sysfs ? sysfs : "/nonexistent",
             e);
    h->dev.node_type = IBV_NODE_CA;
    h->dev.transport_type = IBV_TRANSPORT_IB;
    h->nports = f1 ? atoi(f1 + 1) : 1;
    h->eth = f2 && strcmp(f2 + 1, "eth") == 0;
  }
}

static int port_down(const char* name, int port) {
  const char* down = getenv("FAKEVERBS_DOWN");
  char want[96];
  if (down == NULL) return 0;
  snprintf(want, sizeof(want), "%s:%d", name, port);
  for (const char* p = down; (p = strstr(p, want)) != NULL; p++) {
    size_t n = strlen(want);
    if ((p == down || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) return 1;
  }
  return 0;
}

FV_EXPORT struct ibv_device** ibv_get_device_list(int* n) {
  if (g_nhcas < 0) fv_load();
  struct ibv_device** list = calloc((size_t)g_nhcas + 1, sizeof(*list));
  if (list == NULL) return NULL;
  for (int i = 0; i < g_nhcas; i++) list[i] = &g_hcas[i].dev;
  if (n) *n = g_nhcas;
  return list;
}

FV_EXPORT void ibv_free_device_list(struct ibv_device** list) {
  free(list);
}

FV_EXPORT const char* ibv_get_device_name(struct ibv_device* dev) {
  return dev->name;
}

int fv_post_send(struct ibv_qp* qp, struct ibv_send_wr* wr, struct ibv_send_wr** bad);
int fv_post_recv(struct ibv_qp* qp, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad);
int fv_poll_cq(struct ibv_cq* cq, int n, struct ibv_wc* wc);
int fv_req_notify_cq(struct ibv_cq* cq, int solicited_only);

/* A context: the data-path verbs (inline in verbs.h) through its ops, and
 * async events through a pipe. */
FV_EXPORT struct ibv_context* ibv_open_device(struct ibv_device* dev) {
  struct fv_context* c = calloc(1, sizeof(*c));
  int fds[2];
  if (c == NULL || pipe2(fds, O_CLOEXEC) != 0) {
    free(c);
    return NULL;
  }
  c->ctx.device = dev;
  c->ctx.async_fd = fds[0];
  c->async_wfd = fds[1];
  c->ctx.ops.post_send = fv_post_send;
  c->ctx.ops.post_recv = fv_post_recv;
  c->ctx.ops.poll_cq = fv_poll_cq;
  c->ctx.ops.req_notify_cq = fv_req_notify_cq;
  c->hca = (struct fv_hca*)dev;
  return &c->ctx;
}

FV_EXPORT int ibv_close_device(struct ibv_context* ctx) {
  struct fv_context* c = (struct fv_context*)ctx;
  close(ctx->async_fd);
  close(c->async_wfd);
  free(ctx);
  return 0;
}

FV_EXPORT int ibv_query_device(struct ibv_context* ctx, struct ibv_device_attr* attr) {
  const struct fv_hca* h = ((struct fv_context*)ctx)->hca;
  memset(attr, 0, sizeof(*attr));
  attr->phys_port_cnt = (uint8_t)h->nports;
  attr->max_qp = 1 << 16;
  attr->max_cqe = 1 << 22;
  attr->max_mr_size = UINT64_MAX;
  return 0;
}

/* verbs.h wraps the library's entry point, whose attributes are the older
 * layout (a prefix of ibv_port_attr up to link_layer), in an inline. */
#undef ibv_query_port
FV_EXPORT int ibv_query_port(struct ibv_context* ctx, uint8_t port,
                             struct _compat_ibv_port_attr* compat) {
  const struct fv_hca* h = ((struct fv_context*)ctx)->hca;
  struct ibv_port_attr* attr = (struct ibv_port_attr*)compat;
  if (port < 1 || port > h->nports) return EINVAL;
  memset(attr, 0, offsetof(struct ibv_port_attr, flags));
  attr->state = port_down(h->dev.name, port) ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
  attr->link_layer = h->eth ? IBV_LINK_LAYER_ETHERNET : IBV_LINK_LAYER_INFINIBAND;
  attr->active_width = 2;  /* 4x */
  attr->active_speed = 32; /* EDR: 25 Gb/s a lane */
  attr->active_mtu = IBV_MTU_4096;
  attr->lid = h->eth ? 0 : (uint16_t)(1 + (h - g_hcas) * 8 + port);
  attr->gid_tbl_len = 4;
  return 0;
}

/* Index 0: link-local (fe80::hca:port). RoCE ports also have, as a NIC
 * with an IPv4 and an IPv6 address shows them: 1 and 2 the IPv4-mapped
 * ::ffff:10.hca.port.1 (RoCE v1 and v2: their types are what sysfs says,
 * FAKEVERBS_SYSFS), 3 fd00::hca:port. */
FV_EXPORT int ibv_query_gid(struct ibv_context* ctx, uint8_t port, int index, union ibv_gid* gid) {
  const struct fv_hca* h = ((struct fv_context*)ctx)->hca;
  uint8_t hca = (uint8_t)(h - g_hcas);
  if (port < 1 || port > h->nports || index < 0 || index >= 4) return EINVAL;
  memset(gid, 0, sizeof(*gid));
  if (index == 0) {
    gid->raw[0] = 0xfe, gid->raw[1] = 0x80;
    gid->raw[14] = hca, gid->raw[15] = port;
  } else if (h->eth && index < 3) {
    gid->raw[10] = gid->raw[11] = 0xff;
    gid->raw[12] = 10, gid->raw[13] = hca, gid->raw[14] = port, gid->raw[15] = 1;
  } else if (h->eth) {
    gid->raw[0] = 0xfd;
    gid->raw[13] = hca, gid->raw[15] = port;
  }
  return 0;
}

int fv_context_is_eth(struct ibv_context* ctx) {
  return ((struct fv_context*)ctx)->hca->eth;
}
