/*
 * What a comm says of itself: its rank, size and device, its asynchronous
 * error, ncclCommQueryProperties (an honest "no" to every device-side
 * capability: Braid provides no device API, no GIN, no multimem, no CFT)
 * and ncclCommMemStats (the GPU memory the comm holds: none on the host
 * path); and its deterministic mode (braid.h), which it sets as well. Each holds the comm for the
 * query (comm_call_hold): a watchdog thread may ask while another aborts it.
 */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "braid.h"
#include "comm/comm.h"
#include "core.h"
#include "engine/stream.h"

/* ncclCommProperties_t of NCCL 2.32's nccl_device/host.h (152 bytes; its
 * layout is ABI). Older headers made prefixes; fields past the caller's
 * size are not written. */
struct comm_properties {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int rank;
  int nRanks;
  int cudaDev;
  int nvmlDev;
  bool deviceApiSupport;
  bool multimemSupport;
  int ginType; /* ncclGinType_t: NCCL_GIN_TYPE_NONE = 0 */
  int nLsaTeams;
  bool hostRmaSupport;
  int railedGinType;
  uint64_t commHash;
  int ginMinStride;
  int ginConnectionType; /* NCCL_GIN_CONNECTION_NONE = 0 */
  bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
  bool cftSupport;
  bool cftMulticastSupport;
  bool cftCountedSupport;
};

_Static_assert(sizeof(struct comm_properties) == 152, "ncclCommProperties_t is 152 bytes");
_Static_assert(offsetof(struct comm_properties, commHash) == 56, "ncclCommProperties_t layout");
_Static_assert(offsetof(struct comm_properties, cftSupport) == 144, "ncclCommProperties_t layout");

NCCL_API(ncclResult_t, ncclCommQueryProperties, ncclComm_t comm, void* props);
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, void* props) {
  ncclResult_t res = ncclSuccess;
  struct comm_properties* user = props;
  CHECK(comm_check(comm, "ncclCommQueryProperties"));
  if (user == NULL || user->magic != NCCL_API_MAGIC ||
      user->size < offsetof(struct comm_properties, rank))
    FAIL(ncclInvalidArgument,
         "ncclCommQueryProperties : props not initialized with NCCL_COMM_PROPERTIES_INITIALIZER");
  struct comm_properties p;
  memset(&p, 0, sizeof(p));
  p.size = user->size;
  p.magic = user->magic;
  p.version = user->version;
  p.rank = comm->rank;
  p.nRanks = comm->nranks;
  p.cudaDev = comm->cuda_dev;
  p.nvmlDev = comm->cuda_dev;
  p.nLsaTeams = 0; /* no rank reaches another's memory by load and store */
  p.commHash = comm->ids.first.key;
  memcpy((char*)user + offsetof(struct comm_properties, rank),
         (const char*)&p + offsetof(struct comm_properties, rank),
         MIN(user->size, sizeof(p)) - offsetof(struct comm_properties, rank));
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check(comm, "ncclCommMemStats"));
  if (value == NULL) FAIL(ncclInvalidArgument, "ncclCommMemStats : value is NULL");
  switch (stat) {
    case ncclStatGpuMemSuspended:
      *value = (uint64_t)atomic_load(&comm->suspended);
      break;
    case ncclStatGpuMemSuspend: /* the host path allocates no GPU memory */
    case ncclStatGpuMemPersist:
    case ncclStatGpuMemTotal:
      *value = 0;
      break;
    default:
      FAIL(ncclInvalidArgument, "ncclCommMemStats : unknown statistic %d", (int)stat);
  }
fail:
  return res;
}

/* A watchdog thread asks while another aborts: the comm is held. */
NCCL_API(ncclResult_t, ncclCommGetAsyncError, ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclResult_t res = comm_call_hold(comm, "ncclCommGetAsyncError");
  if (res != ncclSuccess) return res;
  if (asyncError == NULL) {
    WARN("ncclCommGetAsyncError : asyncError is NULL");
    res = ncclInvalidArgument;
  } else {
    *asyncError = (ncclResult_t)atomic_load(&comm->error);
    if (*asyncError == ncclSuccess && comm->internal_stream)
      *asyncError = stream_query(comm->internal_stream);
  }
  comm_call_leave(comm);
  return res;
}

/* The three queries share one shape: hold, then read one int field (at
 * `field`, an offset: a refused handle may be freed memory, never read). */
static ncclResult_t comm_query(ncclComm_t comm, int* out, const char* fn, size_t field) {
  ncclResult_t res = comm_call_hold(comm, fn);
  if (res != ncclSuccess) return res;
  if (out == NULL) {
    WARN("%s : output pointer is NULL", fn);
    res = ncclInvalidArgument;
  } else {
    memcpy(out, (const char*)comm + field, sizeof(*out));
  }
  comm_call_leave(comm);
  return res;
}

NCCL_API(ncclResult_t, ncclCommCount, const ncclComm_t comm, int* count);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return comm_query(comm, count, "ncclCommCount", offsetof(struct ncclComm, nranks));
}

NCCL_API(ncclResult_t, ncclCommUserRank, const ncclComm_t comm, int* rank);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return comm_query(comm, rank, "ncclCommUserRank", offsetof(struct ncclComm, rank));
}

NCCL_API(ncclResult_t, ncclCommCuDevice, const ncclComm_t comm, int* device);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return comm_query(comm, device, "ncclCommCuDevice", offsetof(struct ncclComm, cuda_dev));
}

BRAID_API(ncclResult_t, braidCommSetDeterministic, ncclComm_t comm, int enable);
ncclResult_t braidCommSetDeterministic(ncclComm_t comm, int enable) {
  ncclResult_t res = comm_call_hold(comm, "braidCommSetDeterministic");
  if (res != ncclSuccess) return res;
  if (enable != 0 && enable != 1) {
    WARN("braidCommSetDeterministic : enable %d is neither 0 nor 1", enable);
    res = ncclInvalidArgument;
  } else {
    atomic_store(&comm->deterministic, enable);
    INFO(SUB_INIT, "comm %p rank %d: deterministic reductions %s", (void*)comm, comm->rank,
         enable ? "on" : "off");
  }
  comm_call_leave(comm);
  return res;
}

BRAID_API(ncclResult_t, braidCommSetBlocking, ncclComm_t comm, int blocking);
ncclResult_t braidCommSetBlocking(ncclComm_t comm, int blocking) {
  ncclResult_t res = comm_call_hold(comm, "braidCommSetBlocking");
  if (res != ncclSuccess) return res;
  if (blocking != 0 && blocking != 1) {
    WARN("braidCommSetBlocking : blocking %d is neither 0 nor 1", blocking);
    res = ncclInvalidArgument;
  } else if (comm->internal_stream == NULL) { /* nowhere to queue non-blocking calls */
    WARN(
        "braidCommSetBlocking : comm %p was made blocking; only a comm made non-blocking "
        "(config.blocking 0) can change its mode",
        (void*)comm);
    res = ncclInvalidUsage;
  } else if (!atomic_load(&comm->init_done)) {
    WARN(
        "braidCommSetBlocking : comm %p is still being made (ncclCommGetAsyncError says when "
        "it is ready)",
        (void*)comm);
    res = ncclInvalidUsage;
  } else {
    atomic_store(&comm->nonblocking, !blocking);
    INFO(SUB_INIT, "comm %p rank %d: calls on a NULL stream %s", (void*)comm, comm->rank,
         blocking ? "block" : "return ncclInProgress");
  }
  comm_call_leave(comm);
  return res;
}

BRAID_API(ncclResult_t, braidCommGetDeterministic, ncclComm_t comm, int* enabled);
ncclResult_t braidCommGetDeterministic(ncclComm_t comm, int* enabled) {
  ncclResult_t res = comm_call_hold(comm, "braidCommGetDeterministic");
  if (res != ncclSuccess) return res;
  if (enabled == NULL) {
    WARN("braidCommGetDeterministic : enabled is NULL");
    res = ncclInvalidArgument;
  } else {
    *enabled = atomic_load(&comm->deterministic);
  }
  comm_call_leave(comm);
  return res;
}
