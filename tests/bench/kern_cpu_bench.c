/*
 * Time of the CPU reduction kernels per type and ISA path next to memcpy,
 * for perf/kern_cpu_bench.sh (a timing tool, not a test: nothing is
 * asserted). Each row is a two-source sum (kern_reduce, out of place, the
 * everyday call) on buffers of the same size in bytes for every type, so
 * per-byte times compare directly; the best of `reps` runs. Then, per
 * path, a float fold of FOLD_SRCS sources (kern_task_run) without and with
 * swap bits (the deterministic mode's chains): what putting a source first
 * costs.
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

/* A kern_task over FOLD_SRCS sources of `bytes` each. */
#define FOLD_SRCS 4
struct fold_job {
  struct kern_task t;
  size_t bytes;
};

static void run_fold(void* p) {
  kern_task_run(&((struct fold_job*)p)->t);
}

/* ns per element of the fold with the swap bits `swap`. */
static double fold_ns(struct fold_job* f, unsigned swap, int reps) {
  f->t.swap = swap;
  return best_ns(reps, run_fold, f) / (double)f->t.n;
}

static int fold_setup(struct fold_job* f, size_t bytes, void* dst) {
  memset(f, 0, sizeof *f);
  f->bytes = bytes;
  f->t.redop = (struct kern_redop){ncclFloat32, KERN_SUM, 0, 0};
  f->t.nsrcs = FOLD_SRCS, f->t.ndsts = 1, f->t.n = bytes / 4;
  f->t.dsts[0] = dst;
  for (int k = 0; k < FOLD_SRCS; k++) {
    unsigned char* b = aligned_alloc(64, bytes);
    if (!b) return -1;
    fill(ncclFloat32, b, f->t.n);
    f->t.srcs[k] = b;
  }
  return 0;
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
  struct fold_job fold;
  if (fold_setup(&fold, bytes, j.d) != 0) return 1;
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
    double plain = fold_ns(&fold, 0u, reps), one = fold_ns(&fold, 0x2u, reps),
           two = fold_ns(&fold, 0xau, reps);
    printf(
        "  float fold of %d sources, ns/elem: no swaps %.3f, step 1 swapped %.3f (%.2fx), "
        "steps 1 and 3 %.3f (%.2fx)\n",
        FOLD_SRCS, plain, one, one / plain, two, two / plain);
  }
  kern_force_isa(NULL);
  return 0;
}
