/*
 * The NIC list of a topology (topo_nic.h).
 */
#include "topo/topo_nic.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "topo/topo_shaping.h"
#include "topo/topo_sysfs.h"

#define TOPO_SYSFS_NET "/sys/class/net"

/* What the interface can send: sysfs's link speed, or less when a tbf
 * qdisc shapes it (an emulated cluster's 2 Gb/s veth says 10000). */
static int topo_nic_speed_read(const char* ifname) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), TOPO_SYSFS_NET "/%s/speed", ifname);
  long v = topo_sysfs_read_long(path, 0);
  int link = (v > 0 && v <= INT_MAX) ? (int)v : 0;
  int shaped = topo_nic_shaped_mbps(ifname);
  if (shaped <= 0 || (link > 0 && link <= shaped)) return link;
  INFO(TOPO_LOG_SUB, "Topology: %s shaped by tbf to %d Mb/s (link %d Mb/s); using the shaped rate",
       ifname, shaped, link);
  return shaped;
}

const struct topo_nic* topo_nic_find(const struct topo_system* sys, const char* ifname) {
  if (sys == NULL || ifname == NULL) return NULL;
  for (int i = 0; i < sys->nnics; i++)
    if (strcmp(sys->nics[i].name, ifname) == 0) return &sys->nics[i];
  return NULL;
}

struct topo_nic* topo_nic_add(struct topo_system* sys, const char* ifname) {
  if (sys->nnics >= TOPO_MAX_NICS) {
    INFO(TOPO_LOG_SUB, "Topology: more than %d NICs, leaving out %s", TOPO_MAX_NICS, ifname);
    return NULL;
  }
  struct topo_nic* nic = &sys->nics[sys->nnics++];
  snprintf(nic->name, sizeof(nic->name), "%s", ifname);
  nic->numa = -1;
  nic->speed_mbps = topo_nic_speed_read(ifname);
  return nic;
}
