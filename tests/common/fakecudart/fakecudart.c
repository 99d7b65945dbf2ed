/*
 * A stand-in CUDA runtime (libcudart.so) for hosts without a GPU, so that
 * a net plugin that insists on one at init can load there: aws-ofi-nccl,
 * built with --enable-cudart-dynamic, opens libcudart.so, asks its version
 * and resolves driver functions through it, and gives up if any of that
 * fails, though it never touches a GPU for host memory. Here the version
 * is 13.0, cuDriverGetVersion answers, and every other driver function
 * says there is no device (CUDA_ERROR_NO_DEVICE), so nothing believes one
 * exists. Test-only: tests/cluster/net_plugin.sh puts it on the library
 * path of the plugin's ranks.
 */
#include <string.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100
#define FAKE_CUDA_VERSION 13000

#define EXPORT __attribute__((visibility("default")))

static int driver_version(int* v) {
  *v = FAKE_CUDA_VERSION;
  return CUDA_SUCCESS;
}

static int error_text(int err, const char** s) {
  (void)err;
  *s = "no GPU (stand-in CUDA runtime)";
  return CUDA_SUCCESS;
}

/* Whatever its arguments: the x86-64 and aarch64 calling conventions let a
 * caller pass arguments a callee ignores. */
static int no_device(void) {
  return CUDA_ERROR_NO_DEVICE;
}

EXPORT int cudaRuntimeGetVersion(int* v) {
  *v = FAKE_CUDA_VERSION;
  return 0;
}

static void* driver_function(const char* symbol) {
  if (strcmp(symbol, "cuDriverGetVersion") == 0) return (void*)driver_version;
  if (strcmp(symbol, "cuGetErrorString") == 0 || strcmp(symbol, "cuGetErrorName") == 0)
    return (void*)error_text;
  return (void*)no_device;
}

EXPORT int cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned version,
                                            unsigned long long flags, int* status) {
  (void)version, (void)flags;
  *fn = driver_function(symbol);
  if (status) *status = 0; /* cudaDriverEntryPointSuccess */
  return 0;
}

EXPORT int cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                   int* status) {
  return cudaGetDriverEntryPointByVersion(symbol, fn, FAKE_CUDA_VERSION, flags, status);
}
