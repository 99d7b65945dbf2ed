/*
 * Shared helpers of the GPU fact probes (docs/gpu-validation.md): every CUDA
 * call checked, a monotonic clock, medians, and one "key: value" line per
 * fact so that the run's log is the record.
 */
#ifndef BRAID_GPU_FACTS_H_
#define BRAID_GPU_FACTS_H_

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CU(call)                                                                       \
  do {                                                                                 \
    CUresult r_ = (call);                                                              \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char* s_ = NULL;                                                           \
      cuGetErrorName(r_, &s_);                                                         \
      fprintf(stderr, "%s:%d: %s failed: %d %s\n", __FILE__, __LINE__, #call, (int)r_, \
              s_ ? s_ : "?");                                                          \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

#define RT(call)                                                           \
  do {                                                                     \
    cudaError_t e_ = (call);                                               \
    if (e_ != cudaSuccess) {                                               \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, \
              cudaGetErrorString(e_));                                     \
      exit(2);                                                             \
    }                                                                      \
  } while (0)

/* A launch is checked twice: its own error, then the kernel's when it ends. */
#define LAUNCHED() RT(cudaGetLastError())

/* The result of a call that may legitimately fail: the fact is the code. */
static inline const char* cu_name(CUresult r) {
  const char* s = NULL;
  cuGetErrorName(r, &s);
  return s ? s : "?";
}

static inline double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Sorts v in place; prints "key: median p10 p90 (n)" in microseconds. */
static inline void fact_times(const char* key, double* v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  printf("%s: median %.2f us, p10 %.2f, p90 %.2f, max %.2f (n=%d)\n", key, v[n / 2], v[n / 10],
         v[n * 9 / 10], v[n - 1], n);
}

#define FACT(key, ...)   \
  do {                   \
    printf("%s: ", key); \
    printf(__VA_ARGS__); \
    printf("\n");        \
    fflush(stdout);      \
  } while (0)

#endif
