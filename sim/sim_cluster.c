/*
 * The simulated cluster (sim_cluster.h): defaults, "name=value" settings,
 * and the layout a comm spanning it would build.
 */
#include "sim_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "layout.h"

void sim_cluster_defaults(struct sim_cluster* c) {
  memset(c, 0, sizeof(*c));
  c->nranks = 16;
  c->per_node = 8;
  c->nics = 1;
  c->nic_gbps = 100;
  c->net_lat_us = 5;
  c->intra_gbps = 80;
  c->intra_lat_us = 1;
  c->msg_us = 2;
  c->intra_msg_us = 0.5;
  c->reduce_gbps = 60;
  c->copy_gbps = 80;
  c->oversub = 1;
  c->fabric = SIM_FAT_TREE;
  c->rail_cross_us = 1;
  c->wire_gbps = 10;
  c->window = 16;
  c->slot_bytes = 64 << 10;
}

/* The numeric settings, by name. */
#define SIM_INT(f) \
  { #f, offsetof(struct sim_cluster, f), 'i' }
#define SIM_DBL(f) \
  { #f, offsetof(struct sim_cluster, f), 'd' }
#define SIM_SIZE(f) \
  { #f, offsetof(struct sim_cluster, f), 'z' }
static const struct {
  const char* name;
  size_t off;
  char kind;
} k_fields[] = {
    SIM_INT(nranks),        SIM_INT(per_node),    SIM_INT(nics),         SIM_DBL(nic_gbps),
    SIM_DBL(net_lat_us),    SIM_DBL(intra_gbps),  SIM_DBL(intra_lat_us), SIM_DBL(msg_us),
    SIM_DBL(intra_msg_us),  SIM_DBL(reduce_gbps), SIM_DBL(copy_gbps),    SIM_DBL(oversub),
    SIM_DBL(rail_cross_us), SIM_INT(window),      SIM_SIZE(slot_bytes),  SIM_SIZE(burst_bytes),
    SIM_DBL(wire_gbps),     SIM_INT(tune_links),  SIM_INT(host_cores),   SIM_DBL(sock_gbps),
};

static ncclResult_t set_number(struct sim_cluster* c, int i, const char* value) {
  char* end;
  double v = strtod(value, &end);
  if (end == value || *end != '\0' || !(v >= 0) || v > 1e15) {
    WARN("braid-sim: %s=%s is not a non-negative number", k_fields[i].name, value);
    return ncclInvalidArgument;
  }
  char* p = (char*)c + k_fields[i].off;
  if (k_fields[i].kind == 'd') *(double*)p = v;
  if (k_fields[i].kind == 'i') *(int*)p = (int)v;
  if (k_fields[i].kind == 'z') *(size_t*)p = (size_t)v;
  return ncclSuccess;
}

ncclResult_t sim_cluster_set(struct sim_cluster* c, const char* assignment) {
  const char* eq = strchr(assignment, '=');
  size_t len = eq ? (size_t)(eq - assignment) : 0;
  if (eq && len == 6 && strncmp(assignment, "fabric", 6) == 0) {
    if (strcmp(eq + 1, "fat") == 0) return c->fabric = SIM_FAT_TREE, ncclSuccess;
    if (strcmp(eq + 1, "rails") == 0) return c->fabric = SIM_RAILS, ncclSuccess;
    WARN("braid-sim: fabric=%s: fat or rails", eq + 1);
    return ncclInvalidArgument;
  }
  for (int i = 0; eq && i < (int)(sizeof(k_fields) / sizeof(k_fields[0])); i++)
    if (strlen(k_fields[i].name) == len && strncmp(assignment, k_fields[i].name, len) == 0)
      return set_number(c, i, eq + 1);
  WARN("braid-sim: '%s' names no setting of the cluster (name=value)", assignment);
  return ncclInvalidArgument;
}

ncclResult_t sim_cluster_check(struct sim_cluster* c) {
  if (c->nranks < 2 || c->per_node < 1 || c->nranks % c->per_node != 0) {
    WARN("braid-sim: %d ranks do not fill nodes of %d", c->nranks, c->per_node);
    return ncclInvalidArgument;
  }
  if (c->nics < 1 || c->nic_gbps <= 0 || c->intra_gbps <= 0 || c->reduce_gbps <= 0 ||
      c->copy_gbps <= 0 || c->oversub < 1 || c->window < 1 || c->slot_bytes < 4096) {
    WARN(
        "braid-sim: NICs, bandwidths and the window must be positive, oversub >= 1, "
        "slot_bytes >= 4096");
    return ncclInvalidArgument;
  }
  c->nnodes = c->nranks / c->per_node;
  return ncclSuccess;
}

void sim_cluster_describe(const struct sim_cluster* c, char* out, size_t size) {
  char fabric[48];
  if (c->fabric == SIM_RAILS)
    snprintf(fabric, sizeof(fabric), "rails (+%.1f us across)", c->rail_cross_us);
  else
    snprintf(fabric, sizeof(fabric), "fat tree 1:%.2g", c->oversub);
  snprintf(out, size,
           "%d ranks = %d nodes x %d; %d x %.0f Gbit/s NIC, %.1f us, %s; intra %.0f Gbit/s "
           "%.1f us; %.1f us/msg (%.1f inside); reduce %.0f Gbit/s",
           c->nranks, c->nnodes, c->per_node, c->nics, c->nic_gbps, c->net_lat_us, fabric,
           c->intra_gbps, c->intra_lat_us, c->msg_us, c->intra_msg_us, c->reduce_gbps);
}

ncclResult_t sim_cluster_layout(const struct sim_cluster* c, struct sched_topo* t) {
  ncclResult_t res = ncclSuccess;
  uint64_t* host = NULL;
  CHECK(braid_calloc(&host, (size_t)c->nranks, sizeof(*host)));
  for (int r = 0; r < c->nranks; r++) host[r] = (uint64_t)(r / c->per_node);
  CHECK(sched_topo_init(t, c->nranks, host));
fail:
  free(host);
  return res;
}
