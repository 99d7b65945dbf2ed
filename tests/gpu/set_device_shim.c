/* LD_PRELOAD shim for nccl-tests without MPI on one GPU: nccl-tests puts
 * thread t on device t (-t 2 needs two GPUs); this maps every device number
 * onto the devices there are, so -t 2 runs two ranks on one GPU as threads.
 * Only the device choice changes; nccl-tests itself is run unchanged.
 *   cc -shared -fPIC -o set_device_shim.so set_device_shim.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>

typedef int (*set_fn)(int);
typedef int (*count_fn)(int*);

int cudaSetDevice(int device) {
  static set_fn real_set;
  static count_fn real_count;
  int n = 1;
  if (real_set == 0) {
    real_set = (set_fn)dlsym(RTLD_NEXT, "cudaSetDevice");
    real_count = (count_fn)dlsym(RTLD_NEXT, "cudaGetDeviceCount");
  }
  if (real_count && real_count(&n) == 0 && n > 0) device %= n;
  return real_set(device);
}
