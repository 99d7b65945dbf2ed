/*
 * Time of the CPU reduction kernels per type and ISA path next to memcpy,
 * for perf/kern_cpu_bench.sh (a timing tool, not a test: nothing is
 * asserted). Each row is a two-source sum (kern_reduce, out of place, the
 * everyday call) on buffers of the same size in bytes for every type, so
 * per-byte times compare directly; the best of `reps` runs.
 *
 *   kern_cpu_bench [bytes per buffer] [reps]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels.h"
#include "cpu/kern_dispatch.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}

/* Finite values in [-4, 4) in the type's encoding (random bits for
 * integers): the rate of the common case, not of NaN fix-ups. */
static void fill(ncclDataType_t type, unsigned char* p, size_t n) {
  size_t es = kern_type_size(type);
  for (size_t i = 0; i < n; i++) {
    uint64_t v = rnd();
    float f = (float)((double)(v >> 11) / (double)(1ull << 53) * 8.0 - 4.0);
    double d = f;
    switch (type) {
      case ncclFloat16:
        v = kern_float_to_half(f);
        break;
      case ncclBfloat16:
        v = kern_float_to_bf16(f);
        break;
      case ncclFloat8e4m3:
        v = kern_float_to_e4m3(f);
        break;
      case ncclFloat8e5m2:
        v = kern_float_to_e5m2(f);
        break;
      case ncclFloat32:
        memcpy(&v, &f, 4);
        break;
      case ncclFloat64:
        memcpy(&v, &d, 8);
        break;
      default:
        break;
    }
    memcpy(p + i * es, &v, es);
  }
}

static double best_ns(int reps, void (*fn)(void*), void* arg) {
  double best = 1e300;
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    fn(arg);
    double t = now_ns() - t0;
    if (t < best) best = t;
  }
  return best;
}

struct job {
  struct kern_redop r;
  unsigned char *a, *b, *d;
  size_t n, bytes;
};

static void run_sum(void* p) {
  struct job* j = p;
  kern_reduce(&j->r, 0, j->d, j->a, j->b, j->n);
}

static void run_memcpy(void* p) {
  struct job* j = p;
  memcpy(j->d, j->a, j->bytes);
}

static const char* k_names[] = {"int8", "uint8", "int32",  "uint32", "int64", "uint64",
                                "half", "float", "double", "bf16",   "e4m3",  "e5m2"};

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : (size_t)64 << 20;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  struct job j = {.bytes = bytes};
  j.a = aligned_alloc(64, bytes), j.b = aligned_alloc(64, bytes), j.d = aligned_alloc(64, bytes);
  if (!j.a || !j.b || !j.d) return 1;
  memset(j.d, 0, bytes);
  double mc = best_ns(reps, run_memcpy, &j) / (double)bytes;
  printf("buffers of %zu bytes, best of %d; memcpy %.4f ns/byte (%.1f GB/s read + written)\n",
         bytes, reps, mc, 2.0 / mc);
  static const char* isas[] = {"portable", "avx2", "avx512"};
  for (int i = 0; i < 3; i++) {
    if (!kern_force_isa(isas[i])) {
      printf("%s: not on this CPU\n", isas[i]);
      continue;
    }
    double ne[12];
    for (int t = 0; t < 12; t++) {
      size_t es = kern_type_size((ncclDataType_t)t);
      j.n = bytes / es;
      j.r = (struct kern_redop){(ncclDataType_t)t, KERN_SUM, 0, 0};
      fill((ncclDataType_t)t, j.a, j.n), fill((ncclDataType_t)t, j.b, j.n);
      ne[t] = best_ns(reps, run_sum, &j) / (double)j.n;
    }
    double float_nb = ne[ncclFloat32] / 4.0;
    printf("%s, two-source sum:\n  type     ns/elem   ns/byte  x float/byte  memcpy ns/elem\n",
           isas[i]);
    for (int t = 0; t < 12; t++) {
      double es = (double)kern_type_size((ncclDataType_t)t);
      printf("  %-7s %8.3f  %8.4f  %12.2f  %14.3f\n", k_names[t], ne[t], ne[t] / es,
             ne[t] / es / float_nb, mc * es);
    }
  }
  kern_force_isa(NULL);
  return 0;
}
