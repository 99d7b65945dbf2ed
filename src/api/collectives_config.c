/*
 * The per-call configuration forms of the collectives (nccl*Config): the
 * config is checked (NCCL_COLLCONFIG_INITIALIZER's magic, a plausible size),
 * then the plain call runs. Its fields steer GPU scheduling (CTAs,
 * clusters, profiler tags, a launch event) and an algorithm selection
 * string; Braid accepts them and ignores them (NCCL_ALGO chooses the
 * algorithm). A NULL config is the plain call.
 */
#include <stddef.h>

#include "core.h"

static ncclResult_t coll_config_check(const ncclCollConfig_t* config, const char* fn) {
  if (config == NULL) return ncclSuccess;
  if (config->magic != NCCL_API_MAGIC) {
    WARN("%s : ncclCollConfig_t was not initialized with NCCL_COLLCONFIG_INITIALIZER (magic 0x%x)",
         fn, config->magic);
    return ncclInvalidArgument;
  }
  if (config->size < offsetof(ncclCollConfig_t, ext)) {
    WARN("%s : ncclCollConfig_t size %zu is too small", fn, config->size);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

#define CONFIG_CHECK(config)                                 \
  do {                                                       \
    ncclResult_t res_ = coll_config_check(config, __func__); \
    if (res_ != ncclSuccess) return res_;                    \
  } while (0)

NCCL_API(ncclResult_t, ncclAllReduceConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclAllReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

NCCL_API(ncclResult_t, ncclBroadcastConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclBroadcastConfig(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream, const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduceConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclReduceConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclAllGatherConfig, const void* sendbuff, void* recvbuff, size_t sendcount,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclAllGatherConfig(const void* sendbuff, void* recvbuff, size_t sendcount,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                 const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

NCCL_API(ncclResult_t, ncclReduceScatterConfig, const void* sendbuff, void* recvbuff,
         size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
         cudaStream_t stream, const ncclCollConfig_t* config);
ncclResult_t ncclReduceScatterConfig(const void* sendbuff, void* recvbuff, size_t recvcount,
                                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                     cudaStream_t stream, const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
}

NCCL_API(ncclResult_t, ncclAlltoAllConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclAlltoAllConfig(const void* sendbuff, void* recvbuff, size_t count,
                                ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                                const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclAlltoAll(sendbuff, recvbuff, count, datatype, comm, stream);
}

NCCL_API(ncclResult_t, ncclGatherConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclGatherConfig(const void* sendbuff, void* recvbuff, size_t count,
                              ncclDataType_t datatype, int root, ncclComm_t comm,
                              cudaStream_t stream, const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclGather(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

NCCL_API(ncclResult_t, ncclScatterConfig, const void* sendbuff, void* recvbuff, size_t count,
         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
         const ncclCollConfig_t* config);
ncclResult_t ncclScatterConfig(const void* sendbuff, void* recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream, const ncclCollConfig_t* config) {
  CONFIG_CHECK(config);
  return ncclScatter(sendbuff, recvbuff, count, datatype, root, comm, stream);
}
