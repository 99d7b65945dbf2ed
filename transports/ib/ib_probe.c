/*
 * NCCL_NET=IB's probe (ib_probe.h).
 */
#include "ib_probe.h"

#include <stdio.h>
#include <string.h>

#include "core.h"
#include "ib_devices.h"
#include "ib_hca.h"
#include "param.h"

#define PROBE_MAX_PORTS 16

ncclResult_t ib_probe(void) {
  const char *why = NULL, *hca = param_ib_hca();
  struct ib_port ports[PROBE_MAX_PORTS];
  char list[PROBE_MAX_PORTS * 48] = "";
  int n = 0, nhca = 0;
  if (param_ib_disable()) {
    WARN("NCCL_NET=IB, but NCCL_IB_DISABLE=1 turns InfiniBand off");
    return ncclInvalidUsage;
  }
  if (!ib_hca_valid(hca, &why)) {
    WARN("NCCL_IB_HCA=%s is malformed: %s", hca, why);
    return ncclInvalidUsage;
  }
  const struct ib_verbs* v = ib_verbs_get(&why);
  if (v == NULL) {
    WARN("NCCL_NET=IB: no usable RDMA device: %s", why);
    return ncclInvalidUsage;
  }
  ib_ports_find(v, hca, ports, PROBE_MAX_PORTS, &n, &nhca);
  if (n == 0) {
    WARN("NCCL_NET=IB: no usable RDMA device: %d HCA(s), no active port%s%s", nhca,
         hca ? " selected by NCCL_IB_HCA=" : "", hca ? hca : "");
    return ncclInvalidUsage;
  }
  for (int i = 0; i < n; i++) {
    size_t o = strlen(list);
    if (i) o += (size_t)snprintf(list + o, sizeof(list) - o, ", ");
    ib_port_describe(&ports[i], list + o, sizeof(list) - o);
  }
  INFO(SUB_INIT | SUB_NET, "NCCL_NET=IB: %s", list);
  return ncclSuccess;
}
