/*
 * The GPU's half/bf16/fp8 conversions and arithmetic against Braid's CPU
 * rules (kernels/kernels.h): every float through each narrowing, every
 * narrow value through widening, every pair of halves and of bf16s through
 * sum, prod, max and min, every pair of fp8s through sum. Each comparison
 * counts mismatches, NaN results apart, and prints the first few.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <pthread.h>
#include <stdint.h>

#include "facts.h"
extern "C" {
#include "kernels.h"
}

#define CHUNK (1u << 26)
#define THREADS 16

enum gpu_fn {
  F2H,
  F2BF,
  F2E4,
  F2E5,
  F2E4_NOSAT,
  F2E5_NOSAT, /* float -> narrow */
  H_SUM,
  H_PROD,
  H_MAX,
  H_MIN,
  H_SUM_VIA_FLOAT, /* half pairs */
  B_SUM,
  B_PROD,
  B_MAX,
  B_MIN,
  B_SUM_VIA_FLOAT, /* bf16 pairs */
  E4_SUM_VIA_HALF,
  E5_SUM_VIA_HALF, /* fp8 pairs, NCCL-style */
};

__device__ unsigned short narrow_f32(float x, int fn) {
  switch (fn) {
    case F2H:
      return __half_as_ushort(__float2half_rn(x));
    case F2BF:
      return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    case F2E4:
      return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    case F2E5:
      return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    case F2E4_NOSAT:
      return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E4M3);
    default:
      return __nv_cvt_float_to_fp8(x, __NV_NOSAT, __NV_E5M2);
  }
}

__device__ unsigned short pair_op(unsigned a, unsigned b, int fn) {
  __half ha = __ushort_as_half((unsigned short)a), hb = __ushort_as_half((unsigned short)b);
  __nv_bfloat16 ba = __ushort_as_bfloat16((unsigned short)a),
                bb = __ushort_as_bfloat16((unsigned short)b);
  switch (fn) {
    case H_SUM:
      return __half_as_ushort(__hadd(ha, hb));
    case H_PROD:
      return __half_as_ushort(__hmul(ha, hb));
    case H_MAX:
      return __half_as_ushort(__hmax(ha, hb));
    case H_MIN:
      return __half_as_ushort(__hmin(ha, hb));
    case H_SUM_VIA_FLOAT:
      return __half_as_ushort(__float2half_rn(__half2float(ha) + __half2float(hb)));
    case B_SUM:
      return __bfloat16_as_ushort(__hadd(ba, bb));
    case B_PROD:
      return __bfloat16_as_ushort(__hmul(ba, bb));
    case B_MAX:
      return __bfloat16_as_ushort(__hmax(ba, bb));
    case B_MIN:
      return __bfloat16_as_ushort(__hmin(ba, bb));
    case B_SUM_VIA_FLOAT:
      return __bfloat16_as_ushort(__float2bfloat16_rn(__bfloat162float(ba) + __bfloat162float(bb)));
    default: {
      __nv_fp8_interpretation_t k = fn == E4_SUM_VIA_HALF ? __NV_E4M3 : __NV_E5M2;
      __half_raw x = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)a, k);
      __half_raw y = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, k);
      __half_raw s = __half(__hadd(__half(x), __half(y)));
      return __nv_cvt_halfraw_to_fp8(s, __NV_SATFINITE, k);
    }
  }
}

/* out[i] = fn applied to input number base + i: a float's bits, or the
 * pair (low, high) of narrow values packed in it. */
__global__ void sweep(uint32_t base, uint32_t n, int fn, int bits, unsigned short* out) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    uint32_t v = base + i;
    if (fn <= F2E5_NOSAT)
      out[i] = narrow_f32(__uint_as_float(v), fn);
    else
      out[i] = pair_op(v & ((1u << bits) - 1), v >> bits, fn);
  }
}

/* ---- the CPU side: Braid's rules ---- */

static int h_nan(unsigned v) {
  return (v & 0x7fffu) > 0x7c00u;
}
static int b_nan(unsigned v) {
  return (v & 0x7fffu) > 0x7f80u;
}
static int e4_nan(unsigned v) {
  return (v & 0x7fu) == 0x7fu;
}
static int e5_nan(unsigned v) {
  return (v & 0x7fu) > 0x7cu;
}

struct sweep_def {
  const char* name;
  int fn, bits;        /* bits: width of each packed operand (pairs), 0 for floats */
  uint64_t count;      /* inputs */
  ncclDataType_t type; /* pairs: the type for kern_reduce */
  enum kern_op op;
  int (*is_nan)(unsigned);
};

struct tally {
  uint64_t mism, mism_nan, shown;
  pthread_mutex_t lock;
};

static unsigned cpu_narrow(int fn, uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  switch (fn) {
    case F2H:
      return kern_float_to_half(f);
    case F2BF:
      return kern_float_to_bf16(f);
    case F2E4:
    case F2E4_NOSAT:
      return kern_float_to_e4m3(f);
    default:
      return kern_float_to_e5m2(f);
  }
}

struct job {
  const struct sweep_def* d;
  uint32_t base, lo, hi;
  const unsigned short* gpu;
  struct tally* t;
};

static void report(struct tally* t, const struct sweep_def* d, uint32_t v, unsigned gpu,
                   unsigned cpu) {
  pthread_mutex_lock(&t->lock);
  if (t->shown < 6) {
    t->shown++;
    if (d->bits)
      printf("  %s: a=0x%x b=0x%x gpu=0x%x braid=0x%x\n", d->name, v & ((1u << d->bits) - 1),
             v >> d->bits, gpu, cpu);
    else
      printf("  %s: x=0x%08x (%g) gpu=0x%x braid=0x%x\n", d->name, v, *(float*)&v, gpu, cpu);
  }
  pthread_mutex_unlock(&t->lock);
}

static void* compare_part(void* arg) {
  struct job* j = (struct job*)arg;
  const struct sweep_def* d = j->d;
  uint32_t n = j->hi - j->lo;
  uint64_t mism = 0, mism_nan = 0;
  unsigned short *a = NULL, *b = NULL, *r = NULL;
  if (d->bits) {
    size_t es = d->bits == 16 ? 2 : 1;
    a = (unsigned short*)malloc(n * 2), b = (unsigned short*)malloc(n * 2),
    r = (unsigned short*)malloc(n * 2);
    uint8_t *a8 = (uint8_t*)a, *b8 = (uint8_t*)b;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t v = j->base + j->lo + i;
      if (es == 2)
        a[i] = v & 0xffffu, b[i] = v >> 16;
      else
        a8[i] = v & 0xffu, b8[i] = (v >> 8) & 0xffu;
    }
    struct kern_redop op;
    memset(&op, 0, sizeof op);
    op.type = d->type;
    op.op = d->op;
    kern_reduce(&op, 0, r, a, b, n);
    if (es == 1) { /* widen the byte results in place, from the top down */
      uint8_t* r8 = (uint8_t*)r;
      for (uint32_t i = n; i-- > 0;) r[i] = r8[i];
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    uint32_t v = j->base + j->lo + i;
    unsigned g = j->gpu[j->lo + i], c = d->bits ? r[i] : cpu_narrow(d->fn, v);
    if (g == c) continue;
    int nan = d->is_nan(g) && d->is_nan(c);
    if (nan)
      mism_nan++;
    else
      mism++;
    if (__atomic_load_n(&j->t->shown, __ATOMIC_RELAXED) < (nan ? 3u : 6u)) report(j->t, d, v, g, c);
  }
  free(a), free(b), free(r);
  pthread_mutex_lock(&j->t->lock);
  j->t->mism += mism;
  j->t->mism_nan += mism_nan;
  pthread_mutex_unlock(&j->t->lock);
  return NULL;
}

static void run_sweep(const struct sweep_def* d, unsigned short* dev, unsigned short* host) {
  struct tally t;
  memset(&t, 0, sizeof t);
  pthread_mutex_init(&t.lock, NULL);
  printf("sweep %s over %llu inputs\n", d->name, (unsigned long long)d->count);
  double t0 = now_us();
  for (uint64_t base = 0; base < d->count; base += CHUNK) {
    uint32_t n = (uint32_t)(d->count - base < CHUNK ? d->count - base : CHUNK);
    sweep<<<1024, 256>>>((uint32_t)base, n, d->fn, d->bits, dev);
    LAUNCHED();
    RT(cudaMemcpy(host, dev, (size_t)n * 2, cudaMemcpyDeviceToHost));
    pthread_t th[THREADS];
    struct job jobs[THREADS];
    for (int k = 0; k < THREADS; k++) {
      jobs[k] = (struct job){d,
                             (uint32_t)base,
                             (uint32_t)((uint64_t)n * k / THREADS),
                             (uint32_t)((uint64_t)n * (k + 1) / THREADS),
                             host,
                             &t};
      pthread_create(&th[k], NULL, compare_part, &jobs[k]);
    }
    for (int k = 0; k < THREADS; k++) pthread_join(th[k], NULL);
  }
  FACT(d->name, "%llu mismatches with non-NaN bits, %llu NaN-vs-NaN bit differences (%.1f s)",
       (unsigned long long)t.mism, (unsigned long long)t.mism_nan, (now_us() - t0) / 1e6);
}

/* Widening every narrow value: the GPU's conversion against Braid's. */
__global__ void widen(int kind, float* out) {
  unsigned v = blockIdx.x * blockDim.x + threadIdx.x;
  if (kind == 0) out[v] = __half2float(__ushort_as_half((unsigned short)v));
  if (kind == 1) out[v] = __bfloat162float(__ushort_as_bfloat16((unsigned short)v));
  if (kind >= 2 && v < 256) {
    __half_raw h =
        __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, kind == 2 ? __NV_E4M3 : __NV_E5M2);
    out[v] = __half2float(__half(h));
  }
}

static void run_widen(void) {
  const char* names[] = {"widen half->float", "widen bf16->float", "widen e4m3->float",
                         "widen e5m2->float"};
  float *dev, *host = (float*)malloc(65536 * 4);
  RT(cudaMalloc(&dev, 65536 * 4));
  for (int k = 0; k < 4; k++) {
    unsigned n = k < 2 ? 65536 : 256, mism = 0, shown = 0;
    widen<<<256, 256>>>(k, dev);
    LAUNCHED();
    RT(cudaMemcpy(host, dev, n * 4, cudaMemcpyDeviceToHost));
    for (unsigned v = 0; v < n; v++) {
      float c = k == 0   ? kern_half_to_float(v)
                : k == 1 ? kern_bf16_to_float(v)
                : k == 2 ? kern_e4m3_to_float(v)
                         : kern_e5m2_to_float(v);
      uint32_t gu, cu;
      memcpy(&gu, &host[v], 4), memcpy(&cu, &c, 4);
      if (gu == cu) continue;
      mism++;
      if (shown++ < 4) printf("  %s: v=0x%x gpu=0x%08x braid=0x%08x\n", names[k], v, gu, cu);
    }
    FACT(names[k], "%u of %u differ in bits", mism, n);
  }
  RT(cudaFree(dev));
  free(host);
}

/* float NaN propagation: which operand's payload survives a + b, a * b and
 * fmaxf on the GPU (Braid's CPU rule: the left NaN, quieted). */
__global__ void float_nan_ops(const uint32_t* a, const uint32_t* b, uint32_t* out, int n) {
  int i = threadIdx.x;
  if (i >= n) return;
  float x = __uint_as_float(a[i]), y = __uint_as_float(b[i]);
  out[3 * i] = __float_as_uint(__fadd_rn(x, y));
  out[3 * i + 1] = __float_as_uint(__fmul_rn(x, y));
  out[3 * i + 2] = __float_as_uint(fmaxf(x, y));
}

static void run_float_nan(void) {
  const uint32_t a[] = {0x7fc00001u, 0x3f800000u, 0x7fa00000u,
                        0xffc12345u, 0x7fc00001u, 0x7f800000u};
  const uint32_t b[] = {0x3f800000u, 0x7fc00002u, 0x3f800000u,
                        0x7fc00002u, 0x7f800000u, 0xff800000u};
  int n = 6;
  uint32_t *da, *db, *dout, out[18];
  RT(cudaMalloc(&da, sizeof a));
  RT(cudaMalloc(&db, sizeof b));
  RT(cudaMalloc(&dout, sizeof out));
  RT(cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice));
  RT(cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice));
  float_nan_ops<<<1, 32>>>(da, db, dout, n);
  LAUNCHED();
  RT(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; i++) {
    float x, y, s, p;
    memcpy(&x, &a[i], 4), memcpy(&y, &b[i], 4);
    struct kern_redop op;
    memset(&op, 0, sizeof op);
    op.type = ncclFloat32;
    op.op = KERN_SUM;
    kern_reduce(&op, 0, &s, &x, &y, 1);
    op.op = KERN_PROD;
    kern_reduce(&op, 0, &p, &x, &y, 1);
    uint32_t su, pu;
    memcpy(&su, &s, 4), memcpy(&pu, &p, 4);
    printf(
        "float a=0x%08x b=0x%08x: gpu add 0x%08x mul 0x%08x fmaxf 0x%08x | braid sum 0x%08x prod "
        "0x%08x\n",
        a[i], b[i], out[3 * i], out[3 * i + 1], out[3 * i + 2], su, pu);
  }
  RT(cudaFree(da));
  RT(cudaFree(db));
  RT(cudaFree(dout));
}

int main(int argc, char** argv) {
  int full = argc < 2 || strcmp(argv[1], "quick") != 0;
  uint64_t all32 = full ? (1ull << 32) : (1ull << 28);
  const struct sweep_def defs[] = {
      {"float->half (rn)", F2H, 0, all32, ncclFloat16, KERN_SUM, h_nan},
      {"float->bf16 (rn)", F2BF, 0, all32, ncclBfloat16, KERN_SUM, b_nan},
      {"float->e4m3 (satfinite)", F2E4, 0, all32, ncclFloat8e4m3, KERN_SUM, e4_nan},
      {"float->e5m2 (satfinite)", F2E5, 0, all32, ncclFloat8e5m2, KERN_SUM, e5_nan},
      {"float->e4m3 (nosat) vs Braid's saturating", F2E4_NOSAT, 0, all32, ncclFloat8e4m3, KERN_SUM,
       e4_nan},
      {"float->e5m2 (nosat) vs Braid's saturating", F2E5_NOSAT, 0, all32, ncclFloat8e5m2, KERN_SUM,
       e5_nan},
      {"half __hadd", H_SUM, 16, all32, ncclFloat16, KERN_SUM, h_nan},
      {"half via float add", H_SUM_VIA_FLOAT, 16, all32, ncclFloat16, KERN_SUM, h_nan},
      {"half __hmul", H_PROD, 16, all32, ncclFloat16, KERN_PROD, h_nan},
      {"half __hmax", H_MAX, 16, all32, ncclFloat16, KERN_MAX, h_nan},
      {"half __hmin", H_MIN, 16, all32, ncclFloat16, KERN_MIN, h_nan},
      {"bf16 __hadd", B_SUM, 16, all32, ncclBfloat16, KERN_SUM, b_nan},
      {"bf16 via float add", B_SUM_VIA_FLOAT, 16, all32, ncclBfloat16, KERN_SUM, b_nan},
      {"bf16 __hmul", B_PROD, 16, all32, ncclBfloat16, KERN_PROD, b_nan},
      {"bf16 __hmax", B_MAX, 16, all32, ncclBfloat16, KERN_MAX, b_nan},
      {"bf16 __hmin", B_MIN, 16, all32, ncclBfloat16, KERN_MIN, b_nan},
      {"e4m3 sum via half (satfinite)", E4_SUM_VIA_HALF, 8, 1u << 16, ncclFloat8e4m3, KERN_SUM,
       e4_nan},
      {"e5m2 sum via half (satfinite)", E5_SUM_VIA_HALF, 8, 1u << 16, ncclFloat8e5m2, KERN_SUM,
       e5_nan},
  };
  unsigned short *dev, *host;
  RT(cudaMalloc(&dev, (size_t)CHUNK * 2));
  RT(cudaMallocHost(&host, (size_t)CHUNK * 2));
  FACT("braid cpu kernels isa", "%s", kern_isa_name());
  run_widen();
  run_float_nan();
  for (size_t i = 0; i < sizeof defs / sizeof defs[0]; i++) run_sweep(&defs[i], dev, host);
  RT(cudaFree(dev));
  RT(cudaFreeHost(host));
  return 0;
}
