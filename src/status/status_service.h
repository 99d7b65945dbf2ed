/*
 * The status service (status_service.c): one thread per process, started
 * with its first communicator (BRAID_STATUS, on by default), so that a
 * job can be asked what it is doing while every rank is stuck in a call.
 * It serves
 *   - a Unix socket of this process, an abstract name with a random part
 *     ("braid-status-<pid>-<hex>": found by pid, never taken first), used
 *     by braid-status and only by this user (SO_PEERCRED);
 *   - every comm's control listener (comm_ctrl.h): a member's status
 *     request is answered at once with this rank's recorder; its shrink and
 *     grow messages go to the comm's mailbox for ctrl_recv.
 */
#ifndef BRAID_STATUS_SERVICE_H_
#define BRAID_STATUS_SERVICE_H_

#include <pthread.h>
#include <stdint.h>

#include "nccl.h"

struct ncclComm;

/* Start serving comm (its control listener open): the service starts with
 * the process's first comm. Without the service (BRAID_STATUS=0, or it
 * could not start) ctrl_recv serves the listener itself, as before. */
void status_register(struct ncclComm* comm);
/* Stop serving comm; when this returns the service no longer touches it.
 * Before its control listener closes. */
void status_unregister(struct ncclComm* comm);

#endif /* BRAID_STATUS_SERVICE_H_ */
