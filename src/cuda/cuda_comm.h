/*
 * A communicator's device state (device_comm.h): made at its first call on
 * a CUDA stream, freed with the comm; and what names this process's
 * devices and tells which peers share its process.
 */
#ifndef BRAID_CUDA_COMM_H_
#define BRAID_CUDA_COMM_H_

#include <stdint.h>

#include "device_comm.h"
#include "nccl.h"

struct ncclComm;

/* Whether another rank of the comm lives in this process (ranks as
 * threads, ncclCommInitAll): their streams share one CUDA context, where a
 * stream waiting on a host flag that depends on another stream of the same
 * context may hold that stream back (the driver's warning on stream memory
 * operations; seen on the H200 with 4 ranks as threads). Such comms order
 * device calls by synchronizing instead. -1 while the peers are unknown
 * (a non-blocking init still running): treated as shared. */
int cuda_comm_shares_process(const struct ncclComm* comm);
/* Whether rank p of the comm lives in this process (the peer table must
 * be known). */
int cuda_peer_in_process(const struct ncclComm* comm, int p);

/* The comm's device state, made at first need (thread-safe). */
ncclResult_t cuda_comm_get(struct ncclComm* comm, struct device_comm** out);

#endif /* BRAID_CUDA_COMM_H_ */
