/*
 * The end of a communicator's life (comm_teardown.c): besides the API
 * calls, what the rest of the library needs of it.
 */
#ifndef BRAID_COMM_TEARDOWN_H_
#define BRAID_COMM_TEARDOWN_H_

#include "nccl.h"

struct ncclComm;

/* Wait until the work queued on the comm's own streams (a non-blocking
 * comm's, its device proxy's) has run: what ncclCommFinalize waits for. */
ncclResult_t comm_flush(struct ncclComm* comm);

/* ncclCommRevoke's work: stop what runs, refuse new calls, keep the comm. */
ncclResult_t comm_revoke(struct ncclComm* comm);

/* Free everything a comm owns (its own stream's queued work finishes
 * first) and drop the user's reference; the struct itself goes with the
 * last reference (comm_unref). */
void comm_free(struct ncclComm* comm);

#endif /* BRAID_COMM_TEARDOWN_H_ */
