/*
 * The narrow float formats (half, bfloat16, fp8 e4m3/e5m2): exact widening
 * and round-to-nearest-even narrowing in integer arithmetic, one source for
 * the CPU kernels (kernels/cpu/convert.c) and the CUDA kernels
 * (kernels/cuda/kern_body.h), so that both give the same bits on every
 * input: a GPU's own conversions canonicalize NaNs (docs/gpu-validation.md).
 */
#ifndef BRAID_KERN_CONVERT_H_
#define BRAID_KERN_CONVERT_H_

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define KERN_HD static __host__ __device__ __forceinline__
#else
#define KERN_HD static inline
#endif

KERN_HD uint32_t kc_f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

KERN_HD float kc_u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* v / 2^s rounded to nearest, ties to even; 1 <= s <= 31. */
KERN_HD uint32_t kc_rne_shift(uint32_t v, unsigned s) {
  uint32_t q = v >> s, rem = v & ((1u << s) - 1u), half = 1u << (s - 1);
  return q + (rem > half || (rem == half && (q & 1u)));
}

/*
 * Magnitude encoding (exponent and mantissa bits) of the finite float with
 * absolute bits x in a format with `mbits` mantissa bits and exponent bias
 * `bias`, rounded to nearest even. A carry out of the mantissa moves into the
 * exponent, which is exactly the next binade; values past the format's range
 * come back above its largest encoding, and the callers clamp them.
 */
KERN_HD uint32_t kc_narrow_mag(uint32_t x, unsigned mbits, int bias) {
  int e = (int)(x >> 23);
  /* Float subnormals lie far below half of every target's smallest step. */
  if (e == 0) return 0;
  int te = e - 127 + bias; /* biased exponent in the target */
  uint32_t m = x & 0x7fffffu;
  if (te >= 1) return kc_rne_shift(((uint32_t)te << 23) | m, 23 - mbits);
  /* Target subnormal: count units of the smallest subnormal. */
  unsigned s = (unsigned)(24 - (int)mbits - te);
  if (s > 24) return 0; /* below half a unit */
  return kc_rne_shift(m | 0x800000u, s);
}

KERN_HD float kc_half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return kc_u2f(sign | 0x7f800000u | (m << 13));  /* inf; NaN keeps payload */
  if (e == 0) return kc_u2f(sign | kc_f2u((float)m * 0x1p-24f)); /* exact: m < 2^10 */
  return kc_u2f(sign | ((e + 112u) << 23) | (m << 13));
}

KERN_HD uint16_t kc_float_to_half(float f) {
  uint32_t x = kc_f2u(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  /* NaN: quiet it and keep the top payload bits, as F16C's vcvtps2ph does,
   * so the SIMD path produces the same bits. */
  if (ax > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  if (ax >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 2^16 and inf */
  return (uint16_t)(sign | kc_narrow_mag(ax, 10, 15));      /* [65520, 2^16) carries to inf */
}

KERN_HD float kc_bf16_to_float(uint16_t h) {
  return kc_u2f((uint32_t)h << 16);
}

KERN_HD uint16_t kc_float_to_bf16(float f) {
  uint32_t x = kc_f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
  /* Same exponent range as float: rounding the low half is all there is, and
   * a carry past the largest finite value gives inf as RNE requires. */
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

KERN_HD float kc_e4m3_to_float(uint8_t v) {
  uint32_t sign = (uint32_t)(v & 0x80u) << 24, e = (v >> 3) & 0xfu, m = v & 7u;
  if ((v & 0x7fu) == 0x7fu) return kc_u2f(sign | 0x7fc00000u); /* the only NaN; no inf */
  if (e == 0) return kc_u2f(sign | kc_f2u((float)m * 0x1p-9f));
  return kc_u2f(sign | ((e + 120u) << 23) | (m << 20));
}

KERN_HD uint8_t kc_float_to_e4m3(float f) {
  uint32_t x = kc_f2u(f), ax = x & 0x7fffffffu;
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  if (ax > 0x7f800000u) return sign | 0x7fu;
  if (ax >= 0x43e00000u) return sign | 0x7eu; /* >= 448 and inf saturate */
  uint32_t r = kc_narrow_mag(ax, 3, 7);
  return sign | (uint8_t)(r > 0x7eu ? 0x7eu : r); /* 0x7f would be NaN: saturate */
}

/* e5m2 is the top byte of a half, so widening goes through it exactly. */
KERN_HD float kc_e5m2_to_float(uint8_t v) {
  return kc_half_to_float((uint16_t)(v << 8));
}

KERN_HD uint8_t kc_float_to_e5m2(float f) {
  uint32_t x = kc_f2u(f), ax = x & 0x7fffffffu;
  uint8_t sign = (uint8_t)((x >> 24) & 0x80u);
  if (ax > 0x7f800000u) return sign | 0x7fu;
  if (ax >= 0x47600000u) return sign | 0x7bu; /* >= 57344 and inf saturate */
  uint32_t r = kc_narrow_mag(ax, 2, 15);
  return sign | (uint8_t)(r > 0x7bu ? 0x7bu : r);
}

#endif /* BRAID_KERN_CONVERT_H_ */
