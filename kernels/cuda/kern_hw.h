/*
 * The GPU's own arithmetic and conversions for the reduce-copy kernel's
 * fast path (kern_body.h), each with a host fallback that gives the GPU's
 * bits, canonical NaNs included, so that the CPU grid emulation runs the
 * same path and reaches the same NaN fix-ups as the GPU.
 *
 * On every result that is a number these give Braid's bits: the H200's
 * narrowing (round to nearest even, subnormals, satfinite for fp8) and its
 * half/bf16 add and multiply were compared with kern_convert.h on every
 * input (docs/gpu-validation.md, section 1). Where a NaN is, the GPU's
 * canonical NaN differs from Braid's payload-keeping one: kern_body.h tests
 * for NaN lanes and recomputes those vectors with kern_convert.h's rules.
 */
#ifndef BRAID_KERN_HW_H_
#define BRAID_KERN_HW_H_

#include <stdint.h>
#include <string.h>

#include "kern_convert.h"

/* The fp8 conversion instructions exist from sm_89 on; sm_80 converts fp8
 * with kern_convert.h's integer code. The host emulates the instructions,
 * or, with KB_EMULATE_SM80, sm_80's code (tests/common). */
#if defined(__CUDA_ARCH__) ? __CUDA_ARCH__ >= 890 : !defined(KB_EMULATE_SM80)
#define KB_HW_FP8 1
#else
#define KB_HW_FP8 0
#endif

/* ---- 16 bytes in registers ---- */

struct kb_v16 {
  uint32_t w[4];
};

KERN_HD struct kb_v16 kb_ld16(const void* p) {
  struct kb_v16 v;
#ifdef __CUDA_ARCH__
  uint4 u = *(const uint4*)p; /* one 128-bit load: p is 16-byte aligned */
  v.w[0] = u.x, v.w[1] = u.y, v.w[2] = u.z, v.w[3] = u.w;
#else
  memcpy(v.w, p, 16);
#endif
  return v;
}

KERN_HD void kb_st16(void* p, struct kb_v16 v) {
#ifdef __CUDA_ARCH__
  *(uint4*)p = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
#else
  memcpy(p, v.w, 16);
#endif
}

/* ---- what the GPU returns for a NaN (host side of the emulation) ---- */

KERN_HD int kb_isnan_f(float x) {
  return (kc_f2u(x) & 0x7fffffffu) > 0x7f800000u;
}

#ifndef __CUDA_ARCH__
static inline float kb_gpu_f(float r) {
  return kb_isnan_f(r) ? kc_u2f(0x7fffffffu) : r;
}
static inline double kb_gpu_d(double r) {
  const uint64_t nan = 0x7fffffffffffffffull;
  if (r == r) return r;
  memcpy(&r, &nan, sizeof r);
  return r;
}
static inline uint32_t kb_gpu_h(float f) {
  return kb_isnan_f(f) ? 0x7fffu : kc_float_to_half(f);
}
static inline uint32_t kb_gpu_bf(float f) {
  return kb_isnan_f(f) ? 0x7fffu : kc_float_to_bf16(f);
}
#endif

/* ---- float and double arithmetic: explicit round-to-nearest, so that no
 * flag can contract it into a fused multiply-add ---- */

KERN_HD float kb_hw_fadd(float x, float y) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(x, y);
#else
  return kb_gpu_f(x + y);
#endif
}

KERN_HD float kb_hw_fmul(float x, float y) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(x, y);
#else
  return kb_gpu_f(x * y);
#endif
}

KERN_HD float kb_hw_fdiv(float x, float y) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(x, y);
#else
  return kb_gpu_f(x / y);
#endif
}

KERN_HD double kb_hw_dadd(double x, double y) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(x, y);
#else
  return kb_gpu_d(x + y);
#endif
}

KERN_HD double kb_hw_dmul(double x, double y) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(x, y);
#else
  return kb_gpu_d(x * y);
#endif
}

KERN_HD double kb_hw_ddiv(double x, double y) {
#ifdef __CUDA_ARCH__
  return __ddiv_rn(x, y);
#else
  return kb_gpu_d(x / y);
#endif
}

/* ---- half: one lane widened, two lanes narrowed (lo in the low half) ---- */

KERN_HD float kb_hw_h2f(uint32_t h) {
#ifdef __CUDA_ARCH__
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
#else
  return kb_gpu_f(kc_half_to_float((uint16_t)h));
#endif
}

KERN_HD uint32_t kb_hw_f2h2(float lo, float hi) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return kb_gpu_h(lo) | kb_gpu_h(hi) << 16;
#endif
}

/* bf16 widens exactly by a shift, the same code on both sides. */
KERN_HD float kb_hw_bf2f(uint32_t h) {
  return kc_u2f(h << 16);
}

KERN_HD uint32_t kb_hw_f2bf2(float lo, float hi) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
#else
  return kb_gpu_bf(lo) | kb_gpu_bf(hi) << 16;
#endif
}

/* ---- paired half and bf16 arithmetic (two lanes per 32-bit word) ---- */

#ifndef __CUDA_ARCH__
/* Lane by lane through float: double rounding is harmless at these
 * widths (the GPU facts: __hadd and __hmul equal widen-op-narrow). */
static inline uint32_t kb_host_pair(uint32_t a, uint32_t b, int mul, int bf) {
  uint32_t out = 0;
  for (int l = 0; l < 2; l++) {
    uint16_t x = (uint16_t)(a >> 16 * l), y = (uint16_t)(b >> 16 * l);
    float fx = bf ? kc_bf16_to_float(x) : kc_half_to_float(x);
    float fy = bf ? kc_bf16_to_float(y) : kc_half_to_float(y);
    float r = mul ? fx * fy : fx + fy;
    out |= (bf ? kb_gpu_bf(r) : kb_gpu_h(r)) << 16 * l;
  }
  return out;
}
#endif

KERN_HD uint32_t kb_hw_hadd2(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return kb_host_pair(a, b, 0, 0);
#endif
}

KERN_HD uint32_t kb_hw_hmul2(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  return kb_host_pair(a, b, 1, 0);
#endif
}

/* sm_80 has no bf16x2 add or mul: a * 1 + b and a * b + (-0) in one
 * rounding are the same results (signed zeros included). */
KERN_HD uint32_t kb_hw_bfadd2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#elif defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3f803f80u), "r"(b));
  return d;
#else
  return kb_host_pair(a, b, 0, 1);
#endif
}

KERN_HD uint32_t kb_hw_bfmul2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#elif defined(__CUDA_ARCH__)
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
#else
  return kb_host_pair(a, b, 1, 1);
#endif
}

/* ---- fp8 (sm_89 and up, and the host), four lanes per 32-bit word:
 * widened to two half pairs exactly (h0: bytes 0-1, h1: bytes 2-3), and
 * narrowed from two half pairs or four floats with saturation to the
 * largest finite value (Braid's rule; a NaN gives 0x7f) ---- */

#ifdef __CUDA_ARCH__
#define KB_FP8_HW(T, PTX)                                                 \
  KERN_HD void kb_hw_##T##x4_h2(uint32_t w, uint32_t* h0, uint32_t* h1) { \
    asm("{ .reg .b16 l, h;\n\t"                                           \
        "mov.b32 {l, h}, %2;\n\t"                                         \
        "cvt.rn.f16x2." PTX                                               \
        "x2 %0, l;\n\t"                                                   \
        "cvt.rn.f16x2." PTX "x2 %1, h; }"                                 \
        : "=r"(*h0), "=r"(*h1)                                            \
        : "r"(w));                                                        \
  }                                                                       \
  KERN_HD uint32_t kb_hw_h2_##T##x4(uint32_t h0, uint32_t h1) {           \
    uint32_t w;                                                           \
    asm("{ .reg .b16 l, h;\n\t"                                           \
        "cvt.rn.satfinite." PTX                                           \
        "x2.f16x2 l, %1;\n\t"                                             \
        "cvt.rn.satfinite." PTX                                           \
        "x2.f16x2 h, %2;\n\t"                                             \
        "mov.b32 %0, {l, h}; }"                                           \
        : "=r"(w)                                                         \
        : "r"(h0), "r"(h1));                                              \
    return w;                                                             \
  }                                                                       \
  KERN_HD uint32_t kb_hw_f4_##T##x4(const float* f) {                     \
    uint32_t w;                                                           \
    asm("{ .reg .b16 l, h;\n\t"                                           \
        "cvt.rn.satfinite." PTX                                           \
        "x2.f32 l, %2, %1;\n\t"                                           \
        "cvt.rn.satfinite." PTX                                           \
        "x2.f32 h, %4, %3;\n\t"                                           \
        "mov.b32 %0, {l, h}; }"                                           \
        : "=r"(w)                                                         \
        : "f"(f[0]), "f"(f[1]), "f"(f[2]), "f"(f[3]));                    \
    return w;                                                             \
  }
#else
#define KB_FP8_HW(T, PTX)                                                                        \
  static inline uint32_t kb_gpu_##T(float f) {                                                   \
    return kb_isnan_f(f) ? 0x7fu : kc_float_to_##T(f);                                           \
  }                                                                                              \
  static inline uint32_t kb_gpu_h_##T##x2(uint32_t b) { /* exact but the NaN */                  \
    return kb_gpu_h(kc_##T##_to_float((uint8_t)b)) |                                             \
           kb_gpu_h(kc_##T##_to_float((uint8_t)(b >> 8))) << 16;                                 \
  }                                                                                              \
  static inline void kb_hw_##T##x4_h2(uint32_t w, uint32_t* h0, uint32_t* h1) {                  \
    *h0 = kb_gpu_h_##T##x2(w), *h1 = kb_gpu_h_##T##x2(w >> 16);                                  \
  }                                                                                              \
  static inline uint32_t kb_hw_h2_##T##x4(uint32_t h0, uint32_t h1) {                            \
    uint32_t w = 0;                                                                              \
    for (int l = 0; l < 4; l++)                                                                  \
      w |= kb_gpu_##T(kc_half_to_float((uint16_t)((l < 2 ? h0 : h1) >> 16 * (l & 1)))) << 8 * l; \
    return w;                                                                                    \
  }                                                                                              \
  static inline uint32_t kb_hw_f4_##T##x4(const float* f) {                                      \
    uint32_t w = 0;                                                                              \
    for (int l = 0; l < 4; l++) w |= kb_gpu_##T(f[l]) << 8 * l;                                  \
    return w;                                                                                    \
  }
#endif

#if KB_HW_FP8
KB_FP8_HW(e4m3, "e4m3")
KB_FP8_HW(e5m2, "e5m2")
#endif

/* ---- is some lane of 16 bytes NaN? (one test for the whole vector) ---- */

KERN_HD int kb_nan_f32x4(struct kb_v16 v) {
#ifdef __CUDA_ARCH__
  uint32_t any; /* setp.nan is true when either operand is NaN */
  asm("{ .reg .pred p;\n\t"
      "setp.nan.f32 p, %1, %2;\n\t"
      "setp.nan.or.f32 p, %3, %4, p;\n\t"
      "selp.u32 %0, 1, 0, p; }"
      : "=r"(any)
      : "f"(kc_u2f(v.w[0])), "f"(kc_u2f(v.w[1])), "f"(kc_u2f(v.w[2])), "f"(kc_u2f(v.w[3])));
  return (int)any;
#else
  int any = 0;
  for (int l = 0; l < 4; l++) any |= kb_isnan_f(kc_u2f(v.w[l]));
  return any;
#endif
}

KERN_HD int kb_nan_f64x2(struct kb_v16 v) {
  double d[2];
  memcpy(d, v.w, 16);
#ifdef __CUDA_ARCH__
  uint32_t any;
  asm("{ .reg .pred p;\n\t"
      "setp.nan.f64 p, %1, %2;\n\t"
      "selp.u32 %0, 1, 0, p; }"
      : "=r"(any)
      : "d"(d[0]), "d"(d[1]));
  return (int)any;
#else
  return (d[0] != d[0]) | (d[1] != d[1]);
#endif
}

/* Either of two numbers NaN: one setp.nan on the GPU. */
KERN_HD int kb_nan2_f(float x, float y) {
#ifdef __CUDA_ARCH__
  uint32_t any;
  asm("{ .reg .pred p;\n\tsetp.nan.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p; }"
      : "=r"(any)
      : "f"(x), "f"(y));
  return (int)any;
#else
  return kb_isnan_f(x) | kb_isnan_f(y);
#endif
}

KERN_HD int kb_nan2_d(double x, double y) {
#ifdef __CUDA_ARCH__
  uint32_t any;
  asm("{ .reg .pred p;\n\tsetp.nan.f64 p, %1, %2;\n\tselp.u32 %0, 1, 0, p; }"
      : "=r"(any)
      : "d"(x), "d"(y));
  return (int)any;
#else
  return (x != x) | (y != y);
#endif
}

/* 16-bit lanes: NaN when the magnitude passes the infinity's (0x7c00
 * half, 0x7f80 bf16); adding the gap to 0x8000 sets a lane's top bit. The
 * GPU first folds the four words with min.NaN (NaN where either is). */
#ifdef __CUDA_ARCH__
#define KB_MIN_NAN(PTX, d, a, b) asm("min.NaN." PTX " %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b))
#endif

KERN_HD int kb_nan16(struct kb_v16 v, uint32_t gap, int bf) {
#ifdef __CUDA_ARCH__
  uint32_t m01, m23, m;
  if (bf) {
    KB_MIN_NAN("bf16x2", m01, v.w[0], v.w[1]);
    KB_MIN_NAN("bf16x2", m23, v.w[2], v.w[3]);
    KB_MIN_NAN("bf16x2", m, m01, m23);
  } else {
    KB_MIN_NAN("f16x2", m01, v.w[0], v.w[1]);
    KB_MIN_NAN("f16x2", m23, v.w[2], v.w[3]);
    KB_MIN_NAN("f16x2", m, m01, m23);
  }
  return (((m & 0x7fff7fffu) + gap) & 0x80008000u) != 0;
#else
  uint32_t m = 0;
  (void)bf;
  for (int l = 0; l < 4; l++) m |= (v.w[l] & 0x7fff7fffu) + gap;
  return (m & 0x80008000u) != 0;
#endif
}

KERN_HD int kb_nan_f16x8(struct kb_v16 v) {
  return kb_nan16(v, 0x03ff03ffu, 0);
}

KERN_HD int kb_nan_bf16x8(struct kb_v16 v) {
  return kb_nan16(v, 0x007f007fu, 1);
}

/* Narrowed fp8 (both kinds): a NaN result is S.1111111, the only one
 * with all seven low bits set (saturation never gives e5m2's inf). */
KERN_HD int kb_nan_f8x16(struct kb_v16 v) {
  uint32_t m = 0;
  for (int l = 0; l < 4; l++) m |= (v.w[l] & 0x7f7f7f7fu) + 0x01010101u;
  return (m & 0x80808080u) != 0;
}

#endif /* BRAID_KERN_HW_H_ */
