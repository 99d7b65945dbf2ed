/* Encodings of --compress (compress.h). The conversions round as Braid's kernels do: to
 * nearest even, fp8 saturating at 448, so a value's encoding here and in a reduction agree. */
#include "compress.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define E4M3_MAX 448.0f
#define FP8_HEADROOM 2.0f /* the sum may grow this much over the last one before saturating */

int compress_parse(const char* s, compress_spec_t* out) {
  static const char* const kNames[] = {"none", "fp16", "bf16", "fp8"};
  memset(out, 0, sizeof(*out));
  for (int i = 0; i < 4; i++)
    if (strcmp(s, kNames[i]) == 0) {
      out->kind = (compress_kind_t)i;
      return 0;
    }
  char* end;
  if (strncmp(s, "topk:", 5) != 0) return -1;
  double f = strtod(s + 5, &end);
  if (end == s + 5 || *end || !(f > 0.0 && f <= 1.0)) return -1;
  out->kind = COMPRESS_TOPK;
  out->fraction = f;
  return 0;
}

void compress_format(const compress_spec_t* c, char* out, size_t outlen) {
  static const char* const kNames[] = {"none", "fp16", "bf16", "fp8", "topk"};
  if (c->kind == COMPRESS_TOPK)
    snprintf(out, outlen, "topk:%g", c->fraction);
  else
    snprintf(out, outlen, "%s", kNames[c->kind]);
}

ncclDataType_t compress_nccl_type(compress_kind_t kind) {
  switch (kind) {
    case COMPRESS_FP16:
      return ncclFloat16;
    case COMPRESS_BF16:
      return ncclBfloat16;
    case COMPRESS_FP8:
      return ncclFloat8e4m3;
    default:
      return ncclFloat32;
  }
}

size_t compress_elem_bytes(compress_kind_t kind) {
  return kind == COMPRESS_FP8 ? 1 : kind == COMPRESS_FP16 || kind == COMPRESS_BF16 ? 2 : 4;
}

/* ---- the element conversions ---- */

static uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x40); /* stays a (quiet) NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}

/* e4m3 (OCP "E4M3FN"): bias 7, no infinities, 0x7f NaN; saturating at 448. */
static uint8_t to_e4m3(float x) {
  uint8_t sign = signbit(x) ? 0x80 : 0;
  float a = fabsf(x);
  int e;
  if (isnan(x)) return sign | 0x7f;
  if (a >= E4M3_MAX) return sign | 0x7e;
  if (a < 0x1p-6f) /* subnormal: multiples of 2^-9 (8 of them reach the first normal) */
    return sign | (uint8_t)nearbyintf(a * 0x1p9f);
  frexpf(a, &e); /* a = m 2^e, m in [0.5, 1) */
  int q = (int)nearbyintf((ldexpf(a, 1 - e) - 1.0f) * 8.0f), biased = e - 1 + 7;
  if (q == 8) q = 0, biased++;
  int bits = biased << 3 | q;
  return sign | (uint8_t)(bits > 0x7e ? 0x7e : bits);
}

static float from_e4m3(uint8_t b) {
  int exp = (b >> 3) & 0xf, man = b & 7;
  float a;
  if ((b & 0x7f) == 0x7f) return NAN;
  a = exp == 0 ? ldexpf((float)man, -9) : ldexpf(1.0f + (float)man / 8.0f, exp - 7);
  return b & 0x80 ? -a : a;
}

/* One value encoded and decoded back (in the encoding's units). */
static float encode_one(compress_kind_t kind, float v, void* out, size_t i) {
  switch (kind) {
    case COMPRESS_FP16: {
      _Float16 h = (_Float16)v;
      ((_Float16*)out)[i] = h;
      return (float)h;
    }
    case COMPRESS_BF16: {
      uint16_t h = to_bf16(v);
      ((uint16_t*)out)[i] = h;
      return from_bf16(h);
    }
    case COMPRESS_FP8: {
      uint8_t b = to_e4m3(v);
      ((uint8_t*)out)[i] = b;
      return from_e4m3(b);
    }
    default:
      ((float*)out)[i] = v;
      return v;
  }
}

void compress_encode(compress_kind_t kind, const float* x, float* r, void* out, size_t n,
                     float scale) {
  for (size_t i = 0; i < n; i++) {
    float want = x[i] + (r ? r[i] : 0.0f);
    float sent = encode_one(kind, want * scale, out, i) / scale;
    if (r) r[i] = want - sent;
  }
}

void compress_decode(compress_kind_t kind, const void* in, float* out, size_t n, float scale) {
  for (size_t i = 0; i < n; i++) {
    float v;
    switch (kind) {
      case COMPRESS_FP16:
        v = (float)((const _Float16*)in)[i];
        break;
      case COMPRESS_BF16:
        v = from_bf16(((const uint16_t*)in)[i]);
        break;
      case COMPRESS_FP8:
        v = from_e4m3(((const uint8_t*)in)[i]);
        break;
      default:
        v = ((const float*)in)[i];
    }
    out[i] = v / scale;
  }
}

float compress_amax(const float* x, const float* r, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(x[i] + (r ? r[i] : 0.0f));
    if (a > m) m = a;
  }
  return m;
}

float compress_fp8_scale(float amax) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 0.0f;
  return E4M3_MAX / (FP8_HEADROOM * amax);
}

/* ---- topk ---- */

size_t compress_topk_count(double fraction, size_t n) {
  size_t k = (size_t)ceil(fraction * (double)n);
  return k < 1 ? 1 : k > n ? n : k;
}

/* The bits of |v|: for floats that are not negative, their order as unsigned words is their
 * order as numbers, so selection can count instead of sort. */
static uint32_t magnitude_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u & 0x7fffffffu;
}

/* The k-th largest of n words (1 <= k <= n): a radix select, 16 bits at a time; hist holds
 * 65536 counters. */
static uint32_t kth_largest(const uint32_t* w, size_t n, size_t k, uint32_t* hist) {
  uint32_t prefix = 0;
  for (int shift = 16; shift >= 0; shift -= 16) {
    uint32_t mask = shift ? 0 : 0xffff0000u; /* the second pass: only words with the prefix */
    memset(hist, 0, 65536 * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
      if ((w[i] & mask) == prefix) hist[(w[i] >> shift) & 0xffffu]++;
    int d = 65535;
    for (; d > 0 && hist[d] < k; d--) k -= hist[d];
    prefix |= (uint32_t)d << shift;
  }
  return prefix;
}

void compress_topk_encode(const float* x, float* r, size_t n, size_t k, uint32_t base,
                          uint32_t* pairs, uint32_t* scratch) {
  uint32_t* bits = scratch;
  for (size_t i = 0; i < n; i++) {
    r[i] += x[i];
    bits[i] = magnitude_bits(r[i]);
  }
  uint32_t cut = kth_largest(bits, n, k, scratch + n);
  size_t ties = k, taken = 0;
  for (size_t i = 0; i < n; i++) ties -= bits[i] > cut;
  for (size_t i = 0; i < n && taken < k; i++) { /* above the cut, and the first ties */
    if (bits[i] < cut || (bits[i] == cut && ties == 0)) continue;
    if (bits[i] == cut) ties--;
    pairs[2 * taken] = base + (uint32_t)i;
    memcpy(&pairs[2 * taken + 1], &r[i], sizeof(float));
    r[i] = 0.0f;
    taken++;
  }
}

void compress_topk_add(const uint32_t* pairs, size_t k, float* out) {
  for (size_t j = 0; j < k; j++) {
    float v;
    memcpy(&v, &pairs[2 * j + 1], sizeof(v));
    out[pairs[2 * j]] += v;
  }
}
