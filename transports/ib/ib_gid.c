/*
 * GID selection (ib_gid.h).
 */
#include "ib_gid.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core.h"
#include "param.h"

#define IB_GID_MAX 256

int ib_gid_family(const union ibv_gid* g) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  static const uint8_t zero[16] = {0};
  if (memcmp(g->raw, zero, 16) == 0) return 0;
  if (memcmp(g->raw, mapped, 12) == 0) return AF_INET;
  if (g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80) return 0; /* fe80::/10 */
  return AF_INET6;
}

/* The first `bits` bits of a and b agree. */
static int prefix_equal(const uint8_t* a, const uint8_t* b, int bits) {
  int whole = bits / 8, rest = bits % 8;
  if (memcmp(a, b, (size_t)whole) != 0) return 0;
  if (rest == 0) return 1;
  uint8_t mask = (uint8_t)(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

int ib_gid_in_range(const union ibv_gid* gid, const char* range) {
  char addr[64];
  uint8_t net[16];
  const char* slash;
  int bits, family = ib_gid_family(gid);
  if (range == NULL || *range == '\0') return 1;
  slash = strchr(range, '/');
  if (slash == NULL || (size_t)(slash - range) >= sizeof(addr)) return -1;
  snprintf(addr, sizeof(addr), "%.*s", (int)(slash - range), range);
  bits = atoi(slash + 1);
  if (inet_pton(AF_INET, addr, net) == 1) {
    if (bits < 0 || bits > 32) return -1;
    return family == AF_INET && prefix_equal(gid->raw + 12, net, bits);
  }
  if (inet_pton(AF_INET6, addr, net) == 1) {
    if (bits < 0 || bits > 128) return -1;
    return family == AF_INET6 && prefix_equal(gid->raw, net, bits);
  }
  return -1;
}

int ib_gid_pick(const union ibv_gid* gids, const int* versions, int n, int family,
                const char* range, int version) {
  for (int pass = 0; pass < 2; pass++) /* the wanted version first, then any */
    for (int i = 0; i < n; i++)
      if (ib_gid_family(&gids[i]) == family && ib_gid_in_range(&gids[i], range) == 1 &&
          (pass == 1 || versions[i] == version))
        return i;
  return -1;
}

/* The RoCE version sysfs gives GID `index`: 2, 1, or 0 (unreadable). */
static int gid_version(struct ibv_context* ctx, int port, int index) {
  char path[512], type[32] = "";
  snprintf(path, sizeof(path), "%s/ports/%d/gid_attrs/types/%d", ctx->device->ibdev_path, port,
           index);
  FILE* f = fopen(path, "r");
  if (f == NULL) return 0;
  if (fgets(type, sizeof(type), f) == NULL) type[0] = '\0';
  fclose(f);
  return strstr(type, "v2") ? 2 : strstr(type, "v1") ? 1 : 0;
}

static int family_named(const char* name) {
  if (name && strcmp(name, "AF_INET6") == 0) return AF_INET6;
  if (name == NULL || strcmp(name, "AF_INET") == 0) return AF_INET;
  return -1;
}

ncclResult_t ib_gid_select(const struct ib_verbs* v, struct ibv_context* ctx, int port,
                           int link_layer, int table_len, int* index, union ibv_gid* gid) {
  ncclResult_t res = ncclSuccess;
  union ibv_gid gids[IB_GID_MAX];
  int versions[IB_GID_MAX], n = MIN(table_len, IB_GID_MAX),
                            family = family_named(param_ib_addr_family());
  const char* range = param_ib_addr_range();
  *index = param_ib_gid_index();
  if (*index < 0 && link_layer != IBV_LINK_LAYER_ETHERNET) *index = 0; /* routed by LID */
  if (*index >= 0) {
    if (v->query_gid(ctx, (uint8_t)port, *index, gid) != 0)
      FAIL(ncclInvalidUsage, "NET/IB : %s:%d has no GID index %d", ctx->device->name, port, *index);
    return ncclSuccess;
  }
  if (family < 0)
    FAIL(ncclInvalidUsage, "NCCL_IB_ADDR_FAMILY=%s : AF_INET or AF_INET6", param_ib_addr_family());
  for (int i = 0; i < n; i++) {
    if (v->query_gid(ctx, (uint8_t)port, i, &gids[i]) != 0) memset(&gids[i], 0, sizeof(gids[i]));
    versions[i] = gid_version(ctx, port, i);
    if (ib_gid_in_range(&gids[i], range) < 0)
      FAIL(ncclInvalidUsage, "NCCL_IB_ADDR_RANGE=%s : not a CIDR prefix", range);
  }
  *index = ib_gid_pick(gids, versions, n, family, range, (int)param_ib_roce_version());
  if (*index < 0)
    FAIL(ncclInvalidUsage, "NET/IB : %s:%d has no %s GID%s%s (NCCL_IB_ADDR_FAMILY/RANGE)",
         ctx->device->name, port, family == AF_INET ? "IPv4" : "IPv6", range ? " in " : "",
         range ? range : "");
  *gid = gids[*index];
  INFO(SUB_NET, "NET/IB : %s:%d uses GID index %d (RoCE v%d)", ctx->device->name, port, *index,
       versions[*index]);
fail:
  return res;
}
