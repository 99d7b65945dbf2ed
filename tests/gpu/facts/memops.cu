/*
 * Device attributes and stream memory operations: does write/wait value
 * 32/64 and the batch form work on pinned host memory and on device memory,
 * and how long does a host write take to release a waiting stream (the
 * device path's proxy hands work to a stream this way) compared with a
 * kernel that polls the same host flag.
 */
#include <unistd.h>

#include "facts.h"

#define ATTR(name) \
  { #name, CU_DEVICE_ATTRIBUTE_##name }
static const struct {
  const char* name;
  CUdevice_attribute attr;
} attrs[] = {
    ATTR(COMPUTE_CAPABILITY_MAJOR),
    ATTR(COMPUTE_CAPABILITY_MINOR),
    ATTR(MULTIPROCESSOR_COUNT),
    ATTR(CLOCK_RATE),
    ATTR(MEMORY_CLOCK_RATE),
    ATTR(GLOBAL_MEMORY_BUS_WIDTH),
    ATTR(L2_CACHE_SIZE),
    ATTR(COMPUTE_MODE),
    ATTR(MPS_ENABLED),
    ATTR(ECC_ENABLED),
    ATTR(ASYNC_ENGINE_COUNT),
    ATTR(CONCURRENT_KERNELS),
    ATTR(UNIFIED_ADDRESSING),
    ATTR(CAN_MAP_HOST_MEMORY),
    ATTR(HOST_REGISTER_SUPPORTED),
    ATTR(READ_ONLY_HOST_REGISTER_SUPPORTED),
    ATTR(PAGEABLE_MEMORY_ACCESS),
    ATTR(CONCURRENT_MANAGED_ACCESS),
    ATTR(HOST_NATIVE_ATOMIC_SUPPORTED),
    ATTR(CAN_USE_STREAM_MEM_OPS_V1),
    ATTR(CAN_USE_64_BIT_STREAM_MEM_OPS),
    ATTR(CAN_USE_STREAM_WAIT_VALUE_NOR),
    ATTR(CAN_FLUSH_REMOTE_WRITES),
    ATTR(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED),
    ATTR(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED),
    ATTR(HANDLE_TYPE_FABRIC_SUPPORTED),
    ATTR(IPC_EVENT_SUPPORTED),
    ATTR(MEMORY_POOLS_SUPPORTED),
    ATTR(MEMPOOL_SUPPORTED_HANDLE_TYPES),
    ATTR(GPU_DIRECT_RDMA_SUPPORTED),
    ATTR(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED),
    ATTR(GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS),
    ATTR(GPU_DIRECT_RDMA_WRITES_ORDERING),
    ATTR(DMA_BUF_SUPPORTED),
    ATTR(MULTICAST_SUPPORTED),
    ATTR(COOPERATIVE_LAUNCH),
    ATTR(STREAM_PRIORITIES_SUPPORTED),
    ATTR(TIMELINE_SEMAPHORE_INTEROP_SUPPORTED),
    ATTR(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
    ATTR(MAX_THREADS_PER_MULTIPROCESSOR),
    ATTR(PCI_BUS_ID),
    ATTR(PCI_DEVICE_ID),
    ATTR(NUMA_CONFIG),
    ATTR(HOST_NUMA_ID),
};

static void print_device(CUdevice dev) {
  char name[256];
  int drv = 0, rt = 0;
  size_t total = 0;
  CU(cuDeviceGetName(name, sizeof name, dev));
  CU(cuDriverGetVersion(&drv));
  RT(cudaRuntimeGetVersion(&rt));
  CU(cuDeviceTotalMem(&total, dev));
  FACT("device", "%s, %.1f GiB", name, total / 1073741824.0);
  FACT("driver api version", "%d", drv);
  FACT("runtime version", "%d", rt);
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    int v = 0;
    CUresult r = cuDeviceGetAttribute(&v, attrs[i].attr, dev);
    char key[128];
    snprintf(key, sizeof key, "attr %s", attrs[i].name);
    if (r == CUDA_SUCCESS)
      FACT(key, "%d", v);
    else
      FACT(key, "error %s", cu_name(r));
  }
}

/* Each write/wait flavour once, checked by its effect. */
static void check_write_value(CUstream s, volatile uint64_t* host, CUdeviceptr hdev,
                              CUdeviceptr ddev) {
  CUresult r;
  host[0] = 0;
  r = cuStreamWriteValue32(s, hdev, 0x12345678u, 0);
  if (r == CUDA_SUCCESS) CU(cuStreamSynchronize(s));
  FACT("writeValue32 to pinned host", "%s, host reads 0x%x", cu_name(r),
       (unsigned)(uint32_t)host[0]);
  host[1] = 0;
  r = cuStreamWriteValue64(s, hdev + 8, 0x1122334455667788ull, 0);
  if (r == CUDA_SUCCESS) CU(cuStreamSynchronize(s));
  FACT("writeValue64 to pinned host", "%s, host reads 0x%llx", cu_name(r),
       (unsigned long long)host[1]);
  host[1] = 0;
  r = cuStreamWriteValue64(s, hdev + 8, 0x99ull, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER);
  if (r == CUDA_SUCCESS) CU(cuStreamSynchronize(s));
  FACT("writeValue64 to pinned host (NO_MEMORY_BARRIER)", "%s, host reads 0x%llx", cu_name(r),
       (unsigned long long)host[1]);
  const unsigned flags[2] = {0, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER};
  for (int k = 0; k < 2; k++) {
    uint64_t back = 0;
    CU(cuMemsetD8(ddev, 0, 16));
    r = cuStreamWriteValue64(s, ddev, 0xa5a5a5a5deadbeefull, flags[k]);
    if (r == CUDA_SUCCESS) CU(cuStreamSynchronize(s));
    CU(cuMemcpyDtoH(&back, ddev, 8));
    FACT(k ? "writeValue64 to device memory (NO_MEMORY_BARRIER)" : "writeValue64 to device memory",
         "%s, reads 0x%llx", cu_name(r), (unsigned long long)back);
    uint32_t back32 = 0;
    r = cuStreamWriteValue32(s, ddev + 8, 0x5a5a1234u, flags[k]);
    if (r == CUDA_SUCCESS) CU(cuStreamSynchronize(s));
    CU(cuMemcpyDtoH(&back32, ddev + 8, 4));
    FACT(k ? "writeValue32 to device memory (NO_MEMORY_BARRIER)" : "writeValue32 to device memory",
         "%s, reads 0x%x", cu_name(r), back32);
  }
}

/* One stream waits on a device-memory flag that another stream's
 * writeValue sets: stream-to-stream ordering with no event and no host. */
static void check_device_flag_between_streams(CUstream s, volatile uint64_t* host, CUdeviceptr hdev,
                                              CUdeviceptr ddev) {
  CUstream s2;
  CU(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CU(cuMemsetD8(ddev + 64, 0, 8));
  host[10] = 0;
  CUresult w = cuStreamWaitValue64(s, ddev + 64, 5, CU_STREAM_WAIT_VALUE_GEQ);
  CU(cuStreamWriteValue64(s, hdev + 80, 1, 0));
  usleep(20000);
  unsigned before = (unsigned)host[10];
  CUresult r = cuStreamWriteValue64(s2, ddev + 64, 5, 0);
  CU(cuStreamSynchronize(s2));
  double t0 = now_us();
  while (host[10] == 0 && now_us() - t0 < 2e6) {
  }
  FACT("waitValue64 on device memory released by another stream's writeValue64",
       "wait %s, write %s; follower before %u, after %u (%.1f us)", cu_name(w), cu_name(r), before,
       (unsigned)host[10], now_us() - t0);
  CU(cuStreamSynchronize(s));
  CU(cuStreamDestroy(s2));
}

/* A stream blocked on a host flag must not run what follows until the host
 * writes it; a wait on an already-satisfied value must not block. */
static void check_wait_value(CUstream s, volatile uint64_t* host, CUdeviceptr hdev) {
  host[2] = 0;
  host[3] = 0;
  CU(cuStreamWaitValue32(s, hdev + 16, 1, CU_STREAM_WAIT_VALUE_GEQ));
  CU(cuStreamWriteValue32(s, hdev + 24, 1, 0));
  usleep(50000);
  CUresult q = cuStreamQuery(s);
  unsigned before = (unsigned)host[3];
  host[2] = 1;
  CU(cuStreamSynchronize(s));
  FACT("waitValue32 blocks the stream", "%s after 50 ms, follower ran: %u before, %u after release",
       cu_name(q), before, (unsigned)host[3]);
  host[2] = 0;
  CU(cuStreamWaitValue64(s, hdev + 16, 0, CU_STREAM_WAIT_VALUE_GEQ));
  q = cuStreamSynchronize(s);
  FACT("waitValue64 on a satisfied value", "%s", cu_name(q));

  CUstreamBatchMemOpParams ops[2];
  memset(ops, 0, sizeof ops);
  host[4] = 0;
  host[5] = 0;
  ops[0].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  ops[0].waitValue.address = hdev + 32;
  ops[0].waitValue.value64 = 7;
  ops[0].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[1].writeValue.address = hdev + 40;
  ops[1].writeValue.value64 = 9;
  CUresult r = cuStreamBatchMemOp(s, 2, ops, 0);
  usleep(20000);
  unsigned before5 = (unsigned)host[5];
  host[4] = 7;
  if (r == CUDA_SUCCESS) CU(cuStreamSynchronize(s));
  FACT("batchMemOp wait64+write64", "%s, write before release %u, after %u", cu_name(r), before5,
       (unsigned)host[5]);
}

/* Host writes i, the stream's wait releases, its write echoes i back. The
 * ops go in blocks of 64 so that a full command queue can never block the
 * host before it has written the flag the queue waits on. */
static void time_memop_roundtrip(CUstream s, volatile uint64_t* host, CUdeviceptr hdev, int n) {
  double* t = (double*)malloc(n * sizeof(double));
  host[6] = 0;
  host[7] = 0;
  for (int b = 1; b <= n; b += 64) {
    int e = b + 63 < n ? b + 63 : n;
    for (int i = b; i <= e; i++) {
      CU(cuStreamWaitValue64(s, hdev + 48, (uint64_t)i, CU_STREAM_WAIT_VALUE_GEQ));
      CU(cuStreamWriteValue64(s, hdev + 56, (uint64_t)i, 0));
    }
    usleep(1000);
    for (int i = b; i <= e; i++) {
      double t0 = now_us();
      host[6] = (uint64_t)i;
      while (host[7] != (uint64_t)i) {
      }
      t[i - 1] = now_us() - t0;
    }
  }
  CU(cuStreamSynchronize(s));
  fact_times("host write -> stream waitValue64 -> writeValue64 seen by host", t, n);
  free(t);
}

__global__ void poll_echo(volatile unsigned long long* flag, volatile unsigned long long* echo,
                          int n) {
  for (int i = 1; i <= n; i++) {
    while (*flag < (unsigned long long)i) {
    }
    *echo = i;
    __threadfence_system();
  }
}

static void time_kernel_roundtrip(CUstream s, volatile uint64_t* host, uint64_t* hdevptr, int n) {
  double* t = (double*)malloc(n * sizeof(double));
  host[8] = 0;
  host[9] = 0;
  poll_echo<<<1, 1, 0, (cudaStream_t)s>>>((unsigned long long*)(hdevptr + 8),
                                          (unsigned long long*)(hdevptr + 9), n);
  LAUNCHED();
  usleep(10000);
  for (int i = 1; i <= n; i++) {
    double t0 = now_us();
    host[8] = (uint64_t)i;
    while (host[9] != (uint64_t)i) {
    }
    t[i - 1] = now_us() - t0;
  }
  CU(cuStreamSynchronize(s));
  fact_times("host write -> polling kernel -> echo seen by host", t, n);
  free(t);
}

__global__ void empty_kernel(void) {}

static void time_launch(CUstream s, int n) {
  double* t = (double*)malloc(n * sizeof(double));
  for (int i = 0; i < n; i++) {
    double t0 = now_us();
    empty_kernel<<<1, 32, 0, (cudaStream_t)s>>>();
    CU(cuStreamSynchronize(s));
    t[i] = now_us() - t0;
  }
  LAUNCHED();
  fact_times("empty kernel launch + stream sync", t, n);
  free(t);
}

int main(void) {
  CUdevice dev;
  CUstream s;
  RT(cudaFree(0)); /* the runtime's primary context, current for the driver calls */
  CU(cuCtxGetDevice(&dev));
  print_device(dev);
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  volatile uint64_t* host;
  CU(cuMemHostAlloc((void**)&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  memset((void*)host, 0, 4096);
  CUdeviceptr hdev, ddev;
  CU(cuMemHostGetDevicePointer(&hdev, (void*)host, 0));
  FACT("pinned host device pointer equals host pointer (UVA)", "%s",
       hdev == (CUdeviceptr)host ? "yes" : "no");
  CU(cuMemAlloc(&ddev, 4096));
  check_write_value(s, host, hdev, ddev);
  check_wait_value(s, host, hdev);
  check_device_flag_between_streams(s, host, hdev, ddev);
  time_memop_roundtrip(s, host, hdev, 2000);
  time_kernel_roundtrip(s, host, (uint64_t*)hdev, 2000);
  time_launch(s, 2000);
  CU(cuMemFree(ddev));
  CU(cuMemFreeHost((void*)host));
  CU(cuStreamDestroy(s));
  return 0;
}
