/*
 * Whether NCCL_NET=IB can be served on this host: the verbs library, an
 * HCA, an active port NCCL_IB_HCA selects. If not, init fails with
 * ncclInvalidUsage and one WARN saying which of those is missing.
 */
#ifndef BRAID_IB_PROBE_H_
#define BRAID_IB_PROBE_H_

#include "nccl.h"

/* ncclSuccess (an INFO line names the ports) or ncclInvalidUsage (WARN). */
ncclResult_t ib_probe(void);

#endif /* BRAID_IB_PROBE_H_ */
