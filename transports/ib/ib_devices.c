/*
 * Finding the usable RDMA ports (ib_devices.h).
 */
#include "ib_devices.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ib_hca.h"

/* Lanes of an ibv_port_attr active_width. */
static int width_lanes(uint8_t w) {
  switch (w) {
    case 1:
      return 1;
    case 2:
      return 4;
    case 4:
      return 8;
    case 8:
      return 12;
    case 16:
      return 2;
    default:
      return 0;
  }
}

/* Mb/s per lane of an ibv_port_attr active_speed (SDR .. NDR; XDR is
 * only in active_speed_ex). */
static uint32_t lane_mbps(uint8_t s) {
  switch (s) {
    case 1:
      return 2500;
    case 2:
      return 5000;
    case 4:
    case 8: /* FDR10 */
      return 10000;
    case 16:
      return 14000;
    case 32:
      return 25000;
    case 64:
      return 50000;
    case 128:
      return 100000;
    default:
      return 0;
  }
}

/* The HCA's NUMA node from sysfs (<ibdev_path>/device/numa_node). */
static int hca_numa(const struct ibv_device* dev) {
  char path[sizeof(dev->ibdev_path) + 32];
  int node = -1;
  snprintf(path, sizeof(path), "%s/device/numa_node", dev->ibdev_path);
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  if (fscanf(f, "%d", &node) != 1) node = -1;
  fclose(f);
  return node;
}

/* The selected active ports of one opened HCA. */
static void hca_ports(const struct ib_verbs* v, struct ibv_device* dev, struct ibv_context* ctx,
                      const char* spec, struct ib_port* out, int max, int* n) {
  struct ibv_device_attr attr;
  const char* name = v->get_device_name(dev);
  if (name == NULL || v->query_device(ctx, &attr) != 0) return;
  int numa = hca_numa(dev);
  for (int p = 1; p <= attr.phys_port_cnt && *n < max; p++) {
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    if (v->query_port(ctx, (uint8_t)p, &pa) != 0 || pa.state != IBV_PORT_ACTIVE) continue;
    if (!ib_hca_match(spec, name, p)) continue;
    struct ib_port* o = &out[(*n)++];
    memset(o, 0, sizeof(*o));
    snprintf(o->dev, sizeof(o->dev), "%s", name);
    o->port = p;
    o->link_layer = pa.link_layer;
    o->mbps = (uint32_t)width_lanes(pa.active_width) * lane_mbps(pa.active_speed);
    o->numa = numa;
    o->lid = pa.lid;
  }
}

void ib_ports_find(const struct ib_verbs* v, const char* hca_spec, struct ib_port* out, int max,
                   int* n, int* nhca) {
  struct ibv_device** list = v->get_device_list(nhca);
  *n = 0;
  if (list == NULL) {
    *nhca = 0;
    return;
  }
  for (int i = 0; i < *nhca && *n < max; i++) {
    struct ibv_context* ctx = v->open_device(list[i]);
    if (ctx == NULL) continue;
    hca_ports(v, list[i], ctx, hca_spec, out, max, n);
    v->close_device(ctx);
  }
  v->free_device_list(list);
}

int ib_port_far(const struct ib_port* p, int numa) {
  return numa >= 0 && p->numa >= 0 && p->numa != numa;
}

static int port_near(const struct ib_port* p, int numa) {
  return numa >= 0 && p->numa == numa;
}

int ib_port_pick(const struct ib_port* ports, int n, int numa) {
  int best = 0;
  for (int i = 1; i < n; i++) {
    int near = port_near(&ports[i], numa), best_near = port_near(&ports[best], numa);
    if (near > best_near || (near == best_near && ports[i].mbps > ports[best].mbps)) best = i;
  }
  return best;
}

void ib_port_describe(const struct ib_port* p, char* buf, size_t len) {
  snprintf(buf, len, "%s:%d %s %u Mb/s NUMA %d", p->dev, p->port,
           p->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "IB", p->mbps, p->numa);
}
