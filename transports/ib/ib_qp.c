/*
 * Queue pair setup (ib_qp.h).
 */
#include "ib_qp.h"

#include <errno.h>
#include <string.h>

#include "core.h"
#include "param.h"

#define IB_MIN_RNR_TIMER 12 /* 0.64 ms before a receiver-not-ready retry */
#define IB_RNR_RETRY 7      /* 7: retry without limit (receives are posted ahead) */

void ib_qp_knobs_read(struct ib_qp_knobs* k) {
  k->timeout = (int)param_ib_timeout();
  k->retry_cnt = (int)param_ib_retry_cnt();
  k->sl = (int)param_ib_sl();
  k->tc = (int)param_ib_tc();
}

ncclResult_t ib_qp_create(const struct ib_verbs* v, struct ibv_pd* pd, struct ibv_cq* cq, int port,
                          int depth, struct ibv_qp** out) {
  ncclResult_t res = ncclSuccess;
  struct ibv_qp_init_attr ia;
  struct ibv_qp_attr a;
  struct ibv_qp* qp;
  memset(&ia, 0, sizeof(ia));
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = (uint32_t)depth;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  qp = v->create_qp(pd, &ia);
  if (qp == NULL) FAIL(ncclSystemError, "NET/IB : ibv_create_qp failed: %s", strerror(errno));
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = (uint8_t)port;
  a.pkey_index = 0;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  int rc =
      v->modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) {
    v->destroy_qp(qp);
    FAIL(ncclSystemError, "NET/IB : QP to INIT failed: %s", strerror(rc));
  }
  *out = qp;
fail:
  return res;
}

/* The route to the peer: its LID on InfiniBand, its GID on RoCE. */
static void qp_route(struct ibv_qp_attr* a, int port, const struct ib_qp_info* self,
                     const struct ib_qp_info* peer, const struct ib_qp_knobs* k) {
  a->ah_attr.port_num = (uint8_t)port;
  a->ah_attr.sl = (uint8_t)k->sl;
  if (self->link_layer != IBV_LINK_LAYER_ETHERNET) {
    a->ah_attr.dlid = peer->lid;
    return;
  }
  a->ah_attr.is_global = 1;
  a->ah_attr.grh.dgid = peer->gid;
  a->ah_attr.grh.sgid_index = (uint8_t)self->gid_index;
  a->ah_attr.grh.hop_limit = 255;
  a->ah_attr.grh.traffic_class = (uint8_t)k->tc;
}

ncclResult_t ib_qp_connect(const struct ib_verbs* v, struct ibv_qp* qp, int port,
                           const struct ib_qp_info* self, const struct ib_qp_info* peer,
                           const struct ib_qp_knobs* k) {
  ncclResult_t res = ncclSuccess;
  struct ibv_qp_attr a;
  int rc;
  if (self->link_layer != peer->link_layer)
    FAIL(ncclInvalidUsage, "NET/IB : QP %u is %s, its peer QP %u %s", self->qpn,
         self->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", peer->qpn,
         peer->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = (enum ibv_mtu)MIN(self->mtu, peer->mtu);
  a.dest_qp_num = peer->qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = IB_MIN_RNR_TIMER;
  qp_route(&a, port, self, peer, k);
  rc = v->modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) FAIL(ncclSystemError, "NET/IB : QP %u to RTR failed: %s", self->qpn, strerror(rc));
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = (uint8_t)k->timeout;
  a.retry_cnt = (uint8_t)k->retry_cnt;
  a.rnr_retry = IB_RNR_RETRY;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  rc = v->modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) FAIL(ncclSystemError, "NET/IB : QP %u to RTS failed: %s", self->qpn, strerror(rc));
fail:
  return res;
}
