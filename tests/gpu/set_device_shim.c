/* LD_PRELOAD shim for nccl-tests without MPI on one GPU: nccl-tests puts
 * thread t on device t and checks that there are as many; this reports
 * SHIM_DEVICES devices (default 2) and maps every device number onto the
 * ones there are, so -t 2 runs two ranks on one GPU as threads. Only the
 * device choice changes; nccl-tests itself is run unchanged.
 *   cc -shared -fPIC -o set_device_shim.so set_device_shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>

#include <stdlib.h>

typedef int (*set_fn)(int);
typedef int (*count_fn)(int*);

static count_fn real_count(void) {
  static count_fn fn;
  if (fn == 0) fn = (count_fn)dlsym(RTLD_NEXT, "cudaGetDeviceCount");
  return fn;
}

int cudaGetDeviceCount(int* count) {
  int r = real_count()(count);
  const char* want = getenv("SHIM_DEVICES");
  if (r == 0 && *count > 0) *count = want ? atoi(want) : 2;
  return r;
}

int cudaSetDevice(int device) {
  static set_fn real_set;
  int n = 1;
  if (real_set == 0) real_set = (set_fn)dlsym(RTLD_NEXT, "cudaSetDevice");
  if (real_count()(&n) == 0 && n > 0) device %= n;
  return real_set(device);
}

/* nccl-tests prints each rank's device properties (cudaGetDeviceProperties
 * is cudaGetDeviceProperties_v2 in CUDA 12 and later headers). */
typedef int (*props_fn)(void*, int);

static int mapped(int device) {
  int n = 1;
  return real_count()(&n) == 0 && n > 0 ? device % n : device;
}

int cudaGetDeviceProperties_v2(void* prop, int device) {
  static props_fn real;
  if (real == 0) real = (props_fn)dlsym(RTLD_NEXT, "cudaGetDeviceProperties_v2");
  return real(prop, mapped(device));
}

int cudaGetDeviceProperties(void* prop, int device) {
  static props_fn real;
  if (real == 0) real = (props_fn)dlsym(RTLD_NEXT, "cudaGetDeviceProperties");
  return real(prop, mapped(device));
}

typedef int (*attr_fn)(int*, int, int);

int cudaDeviceGetAttribute(int* value, int attr, int device) {
  static attr_fn real;
  if (real == 0) real = (attr_fn)dlsym(RTLD_NEXT, "cudaDeviceGetAttribute");
  return real(value, attr, mapped(device));
}
