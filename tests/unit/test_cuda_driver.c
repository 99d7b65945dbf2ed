/*
 * The driver shim (src/cuda) on the simulated driver (build/tests/
 * libcudasim.so, BRAID_CUDA_LIB): entry points resolve, mem_query tells
 * device from host memory by pointer attributes, mem_copy crosses kinds,
 * and the embedded fatbin's kernel, loaded and launched as on a GPU,
 * computes what the CPU kernels compute. Without a loadable driver there
 * is no device path and every pointer is host memory (in a child: the
 * driver is opened once per process). With BRAID_CUDA_LIB set (a real
 * libcuda.so.1) the same tests run on a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/kern_inputs.h"
#include "common/cudasim_path.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_kernels.h"
#include "kernels.h"
#include "engine/mem.h"
#include "nccl.h"
#include "param.h"

static const struct cuda_api* g_cu;

static void* dev_alloc(size_t bytes) {
  CUdeviceptr p = 0;
  assert_int_equal(g_cu->cuMemAlloc(&p, bytes), CUDA_SUCCESS);
  return (void*)(uintptr_t)p;
}

/* A thread without a current context copies device memory too: mem_copy
 * takes the owning device's primary context (as a progress thread must). */
static void* copy_without_context(void* p) {
  char host[16] = {0};
  return mem_copy(host, p, sizeof(host)) == ncclSuccess && host[15] == 7 ? p : NULL;
}

/* The calling thread's context: allocations need one. */
static int context_setup(void** state) {
  CUcontext ctx;
  CUdevice d;
  (void)state;
  if (g_cu == NULL || g_cu->cuDeviceGet(&d, 0) != CUDA_SUCCESS ||
      g_cu->cuDevicePrimaryCtxRetain(&ctx, d) != CUDA_SUCCESS)
    return -1;
  return g_cu->cuCtxSetCurrent(ctx) == CUDA_SUCCESS ? 0 : -1;
}

static void test_driver_and_kinds(void** state) {
  (void)state;
  assert_non_null(g_cu);
  char host[64];
  void* dev = dev_alloc(4096);
  assert_int_equal(mem_query(dev), MEM_DEVICE);
  assert_int_equal(mem_query((char*)dev + 4000), MEM_DEVICE);
  assert_int_equal(mem_query(host), MEM_HOST);
  assert_int_equal(mem_query(NULL), MEM_HOST);
  memset(host, 7, sizeof(host));
  assert_int_equal(mem_copy(dev, host, sizeof(host)), ncclSuccess);
  memset(host, 0, sizeof(host));
  assert_int_equal(mem_copy(host, dev, sizeof(host)), ncclSuccess);
  assert_int_equal(host[63], 7);
  pthread_t th;
  void* ok = NULL;
  assert_int_equal(pthread_create(&th, NULL, copy_without_context, dev), 0);
  assert_int_equal(pthread_join(th, &ok), 0);
  assert_ptr_equal(ok, dev);
  assert_int_equal(g_cu->cuMemFree((CUdeviceptr)(uintptr_t)dev), CUDA_SUCCESS);
  assert_int_equal(mem_query(dev), MEM_HOST); /* freed: the driver no longer knows it */
}

/* The library's launch path (module per context, grid from the SM count)
 * against kern_task_run, for a few types and shapes. */
/* ncclMemAlloc: cuMem memory (its handle retrievable, as CUDA IPC will
 * export it), a whole granule, device memory to mem_query, copies both
 * ways, and freed by ncclMemFree (cuMemFree refuses it, as the driver). */
static void test_mem_alloc_vmm(void** state) {
  (void)state;
  void* p = NULL;
  char in[5000], out[5000];
  CUmemGenericAllocationHandle h;
  CUdeviceptr base = 0;
  size_t size = 0;
  assert_int_equal(ncclMemAlloc(&p, sizeof(in)), ncclSuccess);
  assert_int_equal(mem_query(p), MEM_DEVICE);
  assert_int_equal(g_cu->cuMemRetainAllocationHandle(&h, p), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuMemRelease(h), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p),
                   CUDA_SUCCESS);
  assert_true(base == (CUdeviceptr)(uintptr_t)p && size >= sizeof(in));
  for (size_t i = 0; i < sizeof(in); i++) in[i] = (char)(i * 7);
  assert_int_equal(mem_copy(p, in, sizeof(in)), ncclSuccess);
  assert_int_equal(mem_copy(out, p, sizeof(out)), ncclSuccess);
  assert_memory_equal(in, out, sizeof(in));
  assert_int_not_equal(g_cu->cuMemFree((CUdeviceptr)(uintptr_t)p), CUDA_SUCCESS);
  assert_int_equal(ncclMemFree(p), ncclSuccess);
  assert_int_equal(mem_query(p), MEM_HOST); /* unmapped: unknown to the driver again */
}

static void test_kernel_launch(void** state) {
  (void)state;
  static const ncclDataType_t types[] = {ncclFloat32, ncclBfloat16, ncclInt64, ncclFloat8e4m3};
  const size_t n = 100003;
  for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
    size_t es = kern_type_size(types[ti]);
    unsigned char *a = dev_alloc(n * es), *b = dev_alloc(n * es), *out = dev_alloc(n * es);
    unsigned char *ha = malloc(n * es), *hb = malloc(n * es), *want = malloc(n * es);
    unsigned char* got = malloc(n * es);
    fill(types[ti], ha, n), fill(types[ti], hb, n);
    /* through mem_copy: a real GPU's memory is not the host's to write */
    assert_int_equal(mem_copy(a, ha, n * es), ncclSuccess);
    assert_int_equal(mem_copy(b, hb, n * es), ncclSuccess);
    struct kern_task t = {{types[ti], KERN_SUM, 0, 0}, 0, 0, 2, 1, n, {ha, hb}, {want}, 0};
    kern_task_run(&t);
    struct kern_dev_task k;
    memset(&k, 0, sizeof(k));
    k.type = (int32_t)types[ti], k.op = KB_SUM, k.nsrcs = 2, k.ndsts = 1, k.n = n;
    k.srcs[0] = a, k.srcs[1] = b, k.dsts[0] = out;
    assert_int_equal(cuda_reduce_copy(&k, NULL), ncclSuccess);
    assert_int_equal(g_cu->cuStreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(mem_copy(got, out, n * es), ncclSuccess);
    if (memcmp(got, want, n * es) != 0) fail_msg("type %d: the launched kernel differs", types[ti]);
    g_cu->cuMemFree((CUdeviceptr)(uintptr_t)a);
    g_cu->cuMemFree((CUdeviceptr)(uintptr_t)b);
    g_cu->cuMemFree((CUdeviceptr)(uintptr_t)out);
    free(ha), free(hb), free(want), free(got);
  }
}

/* The ordering the device path is built on (docs/architecture.md 4): a stream waits
 * on a flag in pinned host memory before a kernel, then writes a "done"
 * flag; nothing of it runs until the host writes the first flag, and an
 * event recorded after it reports when it has. It reads device memory
 * while the stream waits, so it needs streams side by side: not a test
 * for CUDASIM_ONE_QUEUE, which is meant for the device path's own tests. */
static void test_stream_ordering(void** state) {
  (void)state;
  CUstream s;
  CUevent ev;
  volatile uint64_t* flags;
  CUdeviceptr dflags;
  const size_t n = 4099;
  assert_int_equal(g_cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuMemHostAlloc((void**)&flags, 64, CU_MEMHOSTALLOC_DEVICEMAP),
                   CUDA_SUCCESS);
  assert_int_equal(g_cu->cuMemHostGetDevicePointer(&dflags, (void*)flags, 0), CUDA_SUCCESS);
  flags[0] = flags[1] = 0;
  float *a = dev_alloc(n * 4), *out = dev_alloc(n * 4), host[4099], got[4099];
  for (size_t i = 0; i < n; i++) host[i] = (float)i;
  assert_int_equal(mem_copy(a, host, n * 4), ncclSuccess);
  for (size_t i = 0; i < n; i++) host[i] = -1.0f;
  assert_int_equal(mem_copy(out, host, n * 4), ncclSuccess);
  struct kern_dev_task k;
  memset(&k, 0, sizeof(k));
  k.type = KB_FLOAT, k.op = KB_SUM, k.nsrcs = 2, k.ndsts = 1, k.n = n;
  k.srcs[0] = a, k.srcs[1] = a, k.dsts[0] = out;
  assert_int_equal(g_cu->cuStreamWaitValue64(s, dflags, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  assert_int_equal(cuda_reduce_copy(&k, s), ncclSuccess);
  assert_int_equal(g_cu->cuStreamWriteValue64(s, dflags + 8, 7, 0), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuEventRecord(ev, s), CUDA_SUCCESS);
  usleep(50000);
  assert_int_equal(g_cu->cuEventQuery(ev), CUDA_ERROR_NOT_READY);
  assert_int_equal(g_cu->cuStreamQuery(s), CUDA_ERROR_NOT_READY);
  /* the flags are shared with the stream's thread, as pinned memory is with
   * a GPU: read and written atomically */
  assert_int_equal(__atomic_load_n(&flags[1], __ATOMIC_ACQUIRE), 0);
  assert_int_equal(mem_copy(got, out, n * 4), ncclSuccess); /* the kernel has not run */
  assert_true(got[n - 1] == -1.0f);
  __atomic_store_n(&flags[0], 1, __ATOMIC_RELEASE); /* release */
  assert_int_equal(g_cu->cuEventSynchronize(ev), CUDA_SUCCESS);
  assert_int_equal(__atomic_load_n(&flags[1], __ATOMIC_ACQUIRE), 7);
  assert_int_equal(mem_copy(got, out, n * 4), ncclSuccess);
  for (size_t i = 0; i < n; i++)
    if (got[i] != 2.0f * (float)i) fail_msg("[%zu] = %g after the release", i, got[i]);
  assert_int_equal(g_cu->cuStreamSynchronize(s), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuEventDestroy(ev), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuStreamDestroy(s), CUDA_SUCCESS);
  assert_int_equal(g_cu->cuMemFreeHost((void*)flags), CUDA_SUCCESS);
  g_cu->cuMemFree((CUdeviceptr)(uintptr_t)a);
  g_cu->cuMemFree((CUdeviceptr)(uintptr_t)out);
}

/* No driver at BRAID_CUDA_LIB: no device path, host memory everywhere. */
static void test_without_driver(void** state) {
  (void)state;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char x;
    setenv("BRAID_CUDA_LIB", "/nonexistent/libcuda.so.1", 1);
    param_cache_reset();
    _exit(cuda_driver() == NULL && mem_query(&x) == MEM_HOST ? 0 : 1);
  }
  int st = 0;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char** argv) {
  (void)argc;
  char lib[4096];
  cudasim_path_beside(argv[0], lib, sizeof(lib));
  const struct CMUnitTest without[] = {cmocka_unit_test(test_without_driver)};
  int failed = cmocka_run_group_tests_name("no driver", without, NULL, NULL);
  /* BRAID_CUDA_LIB=libcuda.so.1 runs the same tests on a real GPU */
  setenv("BRAID_CUDA_LIB", lib, 0);
  param_cache_reset();
  g_cu = cuda_driver();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_driver_and_kinds),
      cmocka_unit_test(test_mem_alloc_vmm),
      cmocka_unit_test(test_kernel_launch),
      cmocka_unit_test(test_stream_ordering),
  };
  return failed + cmocka_run_group_tests_name("simulated driver", tests, context_setup, NULL);
}
