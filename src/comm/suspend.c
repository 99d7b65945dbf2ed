/*
 * ncclCommSuspend/Resume: a suspended comm refuses calls until it is
 * resumed. NCCL_SUSPEND_MEM releases the GPU memory a comm can rebuild;
 * the host path holds none, so there is nothing to release yet (the device
 * path will), and ncclCommMemStats says so.
 */
#include "comm/comm.h"
#include "core.h"
#include "engine/stream.h"

NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  ncclResult_t res = ncclSuccess;
  if (flags & ~NCCL_SUSPEND_MEM)
    FAIL(ncclInvalidArgument, "ncclCommSuspend : unknown flags 0x%x", flags);
  CHECK(comm_call_enter(comm, "ncclCommSuspend", COMM_CALL_WORKING));
  /* Work already issued finishes first: suspending is not aborting. */
  if (comm->internal_stream) res = stream_sync(comm->internal_stream);
  if (res == ncclSuccess) {
    atomic_store(&comm->suspended, 1);
    INFO(SUB_INIT, "comm %p rank %d suspended (flags 0x%x)", (void*)comm, comm->rank, flags);
  }
  comm_call_leave(comm);
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm);
ncclResult_t ncclCommResume(ncclComm_t comm) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check(comm, "ncclCommResume"));
  if (!atomic_exchange(&comm->suspended, 0))
    FAIL(ncclInvalidUsage, "ncclCommResume : comm %p is not suspended", (void*)comm);
  INFO(SUB_INIT, "comm %p rank %d resumed", (void*)comm, comm->rank);
fail:
  return res;
}
