/*
 * What NCCL_NET=IB finds on this host while the verbs transport is not in
 * the table yet (issue 19 builds it): the verbs library, the HCAs, their
 * selected active ports. The table refuses NCCL_NET=IB with one WARN that
 * says which of those is missing, or that the ports are there and the
 * transport is not.
 */
#ifndef BRAID_IB_PROBE_H_
#define BRAID_IB_PROBE_H_

#include "nccl.h"

/* NCCL_NET=IB: always ncclInvalidUsage here, with the WARN above. */
ncclResult_t ib_probe_refuse(void);

#endif /* BRAID_IB_PROBE_H_ */
