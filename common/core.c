/*
 * The small helpers of core.h that every layer uses: allocation that logs
 * and reports its failure, the monotonic clock, bounded condition waits.
 */
#include "core.h"

#include <sched.h>
#include <stdlib.h>
#include <time.h>

ncclResult_t braid_calloc(void* ptrp, size_t nelem, size_t elem_size) {
  void* p = calloc(nelem ? nelem : 1, elem_size);
  if (p == NULL) {
    WARN("Out of memory allocating %zu x %zu bytes", nelem, elem_size);
    return ncclSystemError;
  }
  *(void**)ptrp = p;
  return ncclSuccess;
}

/* realloc's own failure leaves the old block valid, so on failure the
 * caller's pointer is left as it was and stays the caller's to free. */
ncclResult_t braid_realloc(void* ptrp, size_t nelem, size_t elem_size) {
  if (elem_size != 0 && nelem > SIZE_MAX / elem_size) {
    WARN("Allocation of %zu x %zu bytes overflows", nelem, elem_size);
    return ncclSystemError;
  }
  size_t bytes = nelem * elem_size;
  void* p = realloc(*(void**)ptrp, bytes > 0 ? bytes : 1); /* realloc(p, 0) may free p */
  if (p == NULL) {
    WARN("Out of memory reallocating %zu x %zu bytes", nelem, elem_size);
    return ncclSystemError;
  }
  *(void**)ptrp = p;
  return ncclSuccess;
}

uint64_t braid_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int braid_backoff(long* nap_ns) {
  if (*nap_ns < 1000) {
    *nap_ns += 50;
    sched_yield();
    return 0;
  }
  struct timespec ts = {0, *nap_ns};
  nanosleep(&ts, NULL);
  *nap_ns = *nap_ns < 100000 ? *nap_ns * 2 : 100000;
  return 1;
}

void braid_cond_wait_ms(pthread_cond_t* cond, pthread_mutex_t* mutex, int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += ms / 1000;
  ts.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
  pthread_cond_timedwait(cond, mutex, &ts);
}

uint64_t braid_fnv1a(uint64_t h, const void* data, size_t len) {
  const unsigned char* p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

const char* braid_result_name(ncclResult_t res) {
  static const char* const names[] = {
      "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
      "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
  return (unsigned)res < sizeof(names) / sizeof(names[0]) ? names[res] : "an unknown result";
}
