/*
 * RC queue pairs as the IB transport sets them up: created on a
 * connection's PD and CQ, taken INIT -> RTR -> RTS from the two ends'
 * ib_qp_info (what each end's blob carries: QP number, LID, GID and its
 * index, MTU) with the knobs NCCL reads: NCCL_IB_TIMEOUT, NCCL_IB_RETRY_CNT,
 * NCCL_IB_SL (InfiniBand), NCCL_IB_TC (RoCE's traffic class). RoCE ports
 * route by GID (a global route header), InfiniBand ports by LID.
 */
#ifndef BRAID_IB_QP_H_
#define BRAID_IB_QP_H_

#include <stdint.h>

#include "ib_verbs.h"
#include "nccl.h"

/* One end of a connection, plain bytes on the wire. */
struct ib_qp_info {
  uint32_t qpn;
  uint16_t lid;
  uint8_t link_layer; /* IBV_LINK_LAYER_* */
  uint8_t mtu;        /* enum ibv_mtu */
  int32_t gid_index;
  union ibv_gid gid;
};

struct ib_qp_knobs {
  int timeout, retry_cnt, sl, tc;
};

/* The knobs as NCCL_IB_* set them. */
void ib_qp_knobs_read(struct ib_qp_knobs* k);

/* An RC QP with room for `depth` work requests each way, moved to INIT on
 * `port` with remote write allowed. */
ncclResult_t ib_qp_create(const struct ib_verbs* v, struct ibv_pd* pd, struct ibv_cq* cq, int port,
                          int depth, struct ibv_qp** out);

/* RTR to `peer`, then RTS: the path MTU the smaller of the two. */
ncclResult_t ib_qp_connect(const struct ib_verbs* v, struct ibv_qp* qp, int port,
                           const struct ib_qp_info* self, const struct ib_qp_info* peer,
                           const struct ib_qp_knobs* k);

#endif /* BRAID_IB_QP_H_ */
