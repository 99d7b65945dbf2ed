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

/* ---- the element conversions (bit by bit: the codes run over every gradient each step) ---- */

static uint32_t bits_of(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return u;
}

static float float_of(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}

/* float -> IEEE half, to nearest even; from 65520 on, infinity. */
static uint16_t to_half(float x) {
  uint32_t u = bits_of(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) /* half subnormal: adding 0.5 rounds at 2^-24, the float unit does it */
    return (uint16_t)(sign | (bits_of(float_of(a) + 0.5f) - 0x3f000000u));
  a += 0xc8000fffu + ((a >> 13) & 1u); /* exponent rebias, and round to nearest even */
  return (uint16_t)(sign | (a >> 13));
}

static float from_half(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));
  if (e) return float_of(sign | ((e + 112u) << 23) | (m << 13));
  return float_of(sign | bits_of((float)m * 0x1p-24f)); /* zero or subnormal */
}

static uint16_t to_bf16(float x) {
  uint32_t u = bits_of(x);
  if (isnan(x)) return (uint16_t)((u >> 16) | 0x40); /* stays a (quiet) NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h) {
  return float_of((uint32_t)h << 16);
}

/* e4m3 (OCP "E4M3FN"): bias 7, no infinities, 0x7f NaN; saturating at 448. */
static uint8_t to_e4m3(float x) {
  uint32_t u = bits_of(x), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7eu); /* 448 and past, infinity too */
  if (a < 0x3c800000u) /* below 2^-6: multiples of 2^-9; adding 2^14 rounds there */
    return (uint8_t)(sign | (bits_of(float_of(a) + 0x1p14f) - 0x46800000u));
  a += 0x7ffffu + ((a >> 20) & 1u); /* round to nearest even at 3 mantissa bits */
  uint32_t code = ((a >> 23) - 120u) << 3 | ((a >> 20) & 7u);
  return (uint8_t)(sign | (code > 0x7eu ? 0x7eu : code));
}

static float from_e4m3(uint8_t b) {
  uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xfu, m = b & 7u;
  if ((b & 0x7fu) == 0x7fu) return NAN;
  if (e) return float_of(sign | ((e + 120u) << 23) | (m << 20));
  return float_of(sign | bits_of((float)m * 0x1p-9f));
}

/* Each code's loop: the value asked (x + r, times scale), its code, and what is kept (the
 * code's value, divided back as the decoder does: times 1 / scale). */
#define ENCODE_LOOP(type, to, value)          \
  do {                                        \
    type* o = out;                            \
    for (size_t i = 0; i < n; i++) {          \
      float want = x[i] + (r ? r[i] : 0.0f);  \
      o[i] = to(want * scale);                \
      if (r) r[i] = want - value(o[i]) * inv; \
    }                                         \
  } while (0)

/* e4m3's 256 values, made per call: cheaper to index than to rebuild bit by bit. */
static void e4m3_table(float* t) {
  for (int b = 0; b < 256; b++) t[b] = from_e4m3((uint8_t)b);
}
#define E4M3_VALUE(b) e4m3[b]

void compress_encode(compress_kind_t kind, const float* x, float* r, void* out, size_t n,
                     float scale) {
  const float inv = 1.0f / scale;
  float e4m3[256];
  switch (kind) {
    case COMPRESS_FP16:
      ENCODE_LOOP(uint16_t, to_half, from_half);
      break;
    case COMPRESS_BF16:
      ENCODE_LOOP(uint16_t, to_bf16, from_bf16);
      break;
    default: /* fp8 */
      e4m3_table(e4m3);
      ENCODE_LOOP(uint8_t, to_e4m3, E4M3_VALUE);
  }
}

void compress_decode(compress_kind_t kind, const void* in, float* out, size_t n, float scale) {
  const float inv = 1.0f / scale;
  float e4m3[256];
  switch (kind) {
    case COMPRESS_FP16:
      for (size_t i = 0; i < n; i++) out[i] = from_half(((const uint16_t*)in)[i]) * inv;
      break;
    case COMPRESS_BF16:
      for (size_t i = 0; i < n; i++) out[i] = from_bf16(((const uint16_t*)in)[i]) * inv;
      break;
    default: /* fp8 */
      e4m3_table(e4m3);
      for (size_t i = 0; i < n; i++) out[i] = e4m3[((const uint8_t*)in)[i]] * inv;
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
