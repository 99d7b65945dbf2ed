/*
 * Which GID a port's QPs use, by NCCL's rules. InfiniBand routes by LID:
 * GID index 0. RoCE needs a GID: NCCL_IB_GID_INDEX where set, else the
 * first GID of the address family NCCL_IB_ADDR_FAMILY (AF_INET: an
 * IPv4-mapped GID; AF_INET6: another, not link-local), inside
 * NCCL_IB_ADDR_RANGE where set, of RoCE version NCCL_IB_ROCE_VERSION_NUM
 * (sysfs gid_attrs/types); failing the version, the first of that family
 * and range of any version.
 */
#ifndef BRAID_IB_GID_H_
#define BRAID_IB_GID_H_

#include "ib_verbs.h"
#include "nccl.h"

/* A GID's family: AF_INET (IPv4-mapped), AF_INET6, or 0 (unset: zero,
 * or link-local, which RoCE cannot route). */
int ib_gid_family(const union ibv_gid* gid);

/* Whether gid lies in `range` (a CIDR prefix of its family; NULL: any).
 * -1: range is malformed. */
int ib_gid_in_range(const union ibv_gid* gid, const char* range);

/* The choice among n GIDs of versions[] (1, 2, 0 unknown): index or -1. */
int ib_gid_pick(const union ibv_gid* gids, const int* versions, int n, int family,
                const char* range, int version);

/* A port's GID index and GID (its link layer and table size from
 * ibv_query_port; its sysfs directory the device's ibdev_path), from the
 * knobs; ncclInvalidUsage with a WARN when no GID fits. */
ncclResult_t ib_gid_select(const struct ib_verbs* v, struct ibv_context* ctx, int port,
                           int link_layer, int table_len, int* index, union ibv_gid* gid);

#endif /* BRAID_IB_GID_H_ */
