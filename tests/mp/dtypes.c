/* Multi-process tests: reference type traits and converters. Written from the
 * IEEE/OCP definitions, independently of the library's kernels. */
#include "dtypes.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

static const mp_type_info kTypes[ncclNumTypes] = {
    [ncclInt8] = {"int8", 1, 0, 1, 0},
    [ncclUint8] = {"uint8", 1, 0, 0, 0},
    [ncclInt32] = {"int32", 4, 0, 1, 0},
    [ncclUint32] = {"uint32", 4, 0, 0, 0},
    [ncclInt64] = {"int64", 8, 0, 1, 0},
    [ncclUint64] = {"uint64", 8, 0, 0, 0},
    [ncclFloat16] = {"half", 2, 1, 1, 2048.0},
    [ncclFloat32] = {"float", 4, 1, 1, 16777216.0},
    [ncclFloat64] = {"double", 8, 1, 1, 9007199254740992.0},
    [ncclBfloat16] = {"bf16", 2, 1, 1, 256.0},
    [ncclFloat8e4m3] = {"fp8e4m3", 1, 1, 1, 16.0},
    [ncclFloat8e5m2] = {"fp8e5m2", 1, 1, 1, 8.0},
};

const mp_type_info* mp_type(ncclDataType_t t) {
  if ((int)t < 0 || (int)t >= ncclNumTypes) return NULL;
  return &kTypes[t];
}

const char* mp_op_name(ncclRedOp_t op) {
  static const char* const names[] = {"sum", "prod", "max", "min", "avg"};
  if ((int)op >= 0 && (int)op < ncclNumOps) return names[op];
  return "premulsum";
}

/* A small binary float: `mbits` stored mantissa bits, exponent `bias`,
 * `maxfin` the largest finite pattern without sign, `inf` its overflow. */
typedef struct minifloat {
  int mbits;
  int ebits;
  int bias;
  uint32_t maxfin;
  uint32_t inf;
} minifloat;

static const minifloat kHalf = {10, 5, 15, 0x7bff, 0x7c00};
static const minifloat kBf16 = {7, 8, 127, 0x7f7f, 0x7f80};
static const minifloat kE4m3 = {3, 4, 7, 0x7e, 0x7e}; /* saturating, no inf */
static const minifloat kE5m2 = {2, 5, 15, 0x7b, 0x7c};

static uint32_t mini_encode(const minifloat* f, double v) {
  uint32_t sign = signbit(v) ? 1u << (f->mbits + f->ebits) : 0u;
  double a = fabs(v);
  if (a == 0.0) return sign;
  if (isnan(v)) return sign | f->inf | 1u;
  int e;
  frexp(a, &e);
  e -= 1; /* a = m * 2^e, 1 <= m < 2 */
  int emin = 1 - f->bias;
  if (e < emin) e = emin;
  double r = nearbyint(ldexp(a, f->mbits - e)); /* default mode: RNE */
  if (r >= ldexp(1.0, f->mbits + 1)) {
    r /= 2.0;
    e += 1;
  }
  uint32_t mant = (uint32_t)r;
  uint32_t bits;
  if (mant < (1u << f->mbits)) {
    bits = mant; /* subnormal: exponent field 0 */
  } else {
    bits = ((uint32_t)(e + f->bias) << f->mbits) | (mant - (1u << f->mbits));
  }
  if (isinf(a) || bits > f->maxfin) bits = f->inf;
  return sign | bits;
}

static double mini_decode(const minifloat* f, uint32_t b) {
  uint32_t emask = (1u << f->ebits) - 1u;
  uint32_t exp = (b >> f->mbits) & emask;
  uint32_t mant = b & ((1u << f->mbits) - 1u);
  double sign = (b >> (f->mbits + f->ebits)) & 1u ? -1.0 : 1.0;
  if (f != &kE4m3 && exp == emask) return mant ? NAN : sign * INFINITY;
  if (f == &kE4m3 && exp == emask && mant == 7u) return NAN;
  if (exp == 0) return sign * ldexp((double)mant, 1 - f->bias - f->mbits);
  return sign * ldexp((double)(mant | (1u << f->mbits)), (int)exp - f->bias - f->mbits);
}

uint16_t mp_to_half(double v) {
  return (uint16_t)mini_encode(&kHalf, v);
}
uint16_t mp_to_bf16(double v) {
  return (uint16_t)mini_encode(&kBf16, v);
}
uint8_t mp_to_e4m3(double v) {
  return (uint8_t)mini_encode(&kE4m3, v);
}
uint8_t mp_to_e5m2(double v) {
  return (uint8_t)mini_encode(&kE5m2, v);
}

void mp_store_int(ncclDataType_t t, uint64_t v, void* out) {
  memcpy(out, &v, kTypes[t].size);
}

uint64_t mp_load_bits(ncclDataType_t t, const void* p) {
  uint64_t v = 0;
  memcpy(&v, p, kTypes[t].size);
  return v;
}

void mp_store_real(ncclDataType_t t, double v, void* out) {
  uint16_t h;
  uint8_t b;
  float f;
  switch (t) {
    case ncclFloat16:
      h = mp_to_half(v);
      memcpy(out, &h, 2);
      break;
    case ncclBfloat16:
      h = mp_to_bf16(v);
      memcpy(out, &h, 2);
      break;
    case ncclFloat8e4m3:
      b = mp_to_e4m3(v);
      memcpy(out, &b, 1);
      break;
    case ncclFloat8e5m2:
      b = mp_to_e5m2(v);
      memcpy(out, &b, 1);
      break;
    case ncclFloat32:
      f = (float)v;
      memcpy(out, &f, 4);
      break;
    default:
      memcpy(out, &v, 8);
      break;
  }
}

static int64_t sign_extend(uint64_t v, size_t size) {
  if (size == 8) return (int64_t)v;
  unsigned shift = (unsigned)(64 - 8 * size);
  return (int64_t)(v << shift) >> shift;
}

double mp_load_real(ncclDataType_t t, const void* p) {
  uint64_t bits = mp_load_bits(t, p);
  float f;
  double d;
  switch (t) {
    case ncclFloat16:
      return mini_decode(&kHalf, (uint32_t)bits);
    case ncclBfloat16:
      return mini_decode(&kBf16, (uint32_t)bits);
    case ncclFloat8e4m3:
      return mini_decode(&kE4m3, (uint32_t)bits);
    case ncclFloat8e5m2:
      return mini_decode(&kE5m2, (uint32_t)bits);
    case ncclFloat32:
      memcpy(&f, p, 4);
      return f;
    case ncclFloat64:
      memcpy(&d, p, 8);
      return d;
    default:
      break;
  }
  if (kTypes[t].is_signed) return (double)sign_extend(bits, kTypes[t].size);
  return (double)bits;
}

void mp_format(ncclDataType_t t, const void* p, char* buf, size_t n) {
  const mp_type_info* ti = mp_type(t);
  uint64_t bits = mp_load_bits(t, p);
  int hexw = (int)(2 * ti->size);
  if (ti->is_float) {
    snprintf(buf, n, "0x%0*" PRIx64 " (%.9g)", hexw, bits, mp_load_real(t, p));
  } else if (ti->is_signed) {
    snprintf(buf, n, "0x%0*" PRIx64 " (%" PRId64 ")", hexw, bits, sign_extend(bits, ti->size));
  } else {
    snprintf(buf, n, "0x%0*" PRIx64 " (%" PRIu64 ")", hexw, bits, bits);
  }
}
