/*
 * AVX2 + F16C path: the 256-bit vector primitives; the loops themselves are
 * in reduce_simd.h, shared with the AVX-512 path.
 */
#include <immintrin.h>

#include "kern_dispatch.h"

#define SIMD_ENTRY kern_simd_avx2
#define VF_N 8
#define VD_N 4
#define VI_BYTES 32
typedef __m256 vf_t;
typedef __m256d vd_t;
typedef __m256i vi_t;
typedef __m128i vh_t; /* VF_N narrow (16-bit) elements */

/* ---- float ---- */
KERN_INLINE vf_t vf_load(const char* p) {
  return _mm256_loadu_ps((const float*)(const void*)p);
}
KERN_INLINE void vf_store(char* p, vf_t v) {
  _mm256_storeu_ps((float*)(void*)p, v);
}
KERN_INLINE void vf_stream(char* p, vf_t v) {
  _mm256_stream_ps((float*)(void*)p, v);
}
KERN_INLINE vf_t vf_set1(float x) {
  return _mm256_set1_ps(x);
}
KERN_INLINE vf_t vf_add(vf_t x, vf_t y) {
  return _mm256_add_ps(x, y);
}
KERN_INLINE vf_t vf_mul(vf_t x, vf_t y) {
  return _mm256_mul_ps(x, y);
}
KERN_INLINE vf_t vf_div(vf_t x, vf_t y) {
  return _mm256_div_ps(x, y);
}
/* maxps/minps return the second operand on NaN or equality: x > y ? x : y. */
KERN_INLINE vf_t vf_max(vf_t x, vf_t y) {
  return _mm256_max_ps(x, y);
}
KERN_INLINE vf_t vf_min(vf_t x, vf_t y) {
  return _mm256_min_ps(x, y);
}
KERN_INLINE vf_t vf_nansel(vf_t x, vf_t r) {
  return _mm256_blendv_ps(r, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* F16C converts exactly one way and with the immediate RNE the other. */
KERN_INLINE vf_t vf_load_f16(const char* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(const void*)p));
}
KERN_INLINE vh_t vf_to_f16(vf_t v) {
  return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}
KERN_INLINE vf_t vf_rt_f16(vf_t v) {
  return _mm256_cvtph_ps(vf_to_f16(v));
}

/* bf16 is the top half of a float. A whole vector of bf16 is widened by
 * interleaving with zeros; the lanes come out permuted within each 128-bit
 * half (lo: 0-3 and 8-11, hi: 4-7 and 12-15), and packus in vf_to_bf16x2
 * puts them back in order, so no cross-lane shuffle is needed. */
KERN_INLINE vf_t vf_bf16_lo(vi_t w) {
  return _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), w));
}
KERN_INLINE vf_t vf_bf16_hi(vi_t w) {
  return _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), w));
}
/* RNE on the low 16 bits (as kern_float_to_bf16), NaN forced quiet; the
 * result sits in the low half of each 32-bit lane. */
KERN_INLINE vi_t bf16_round(vf_t v) {
  __m256i x = _mm256_castps_si256(v);
  __m256i hi = _mm256_srli_epi32(x, 16);
  __m256i bias =
      _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7fff));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, bias), 16);
  __m256i qnan = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
  __m256 isnan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(rounded, qnan, _mm256_castps_si256(isnan));
}
/* Lanes are <= 0xffff, so the saturating pack just narrows. */
KERN_INLINE vi_t vf_to_bf16x2(vf_t lo, vf_t hi) {
  return _mm256_packus_epi32(bf16_round(lo), bf16_round(hi));
}
/* The rounded bf16 widened back in place: a float whose low half is zero. */
KERN_INLINE vf_t vf_rt_bf16(vf_t v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_round(v), 16));
}
KERN_INLINE void vh_store(char* p, vh_t h) {
  _mm_storeu_si128((__m128i*)(void*)p, h);
}
KERN_INLINE void vh_stream(char* p, vh_t h) {
  _mm_stream_si128((__m128i*)(void*)p, h);
}

/* ---- double ---- */
KERN_INLINE vd_t vd_load(const char* p) {
  return _mm256_loadu_pd((const double*)(const void*)p);
}
KERN_INLINE void vd_store(char* p, vd_t v) {
  _mm256_storeu_pd((double*)(void*)p, v);
}
KERN_INLINE void vd_stream(char* p, vd_t v) {
  _mm256_stream_pd((double*)(void*)p, v);
}
KERN_INLINE vd_t vd_set1(double x) {
  return _mm256_set1_pd(x);
}
KERN_INLINE vd_t vd_add(vd_t x, vd_t y) {
  return _mm256_add_pd(x, y);
}
KERN_INLINE vd_t vd_mul(vd_t x, vd_t y) {
  return _mm256_mul_pd(x, y);
}
KERN_INLINE vd_t vd_div(vd_t x, vd_t y) {
  return _mm256_div_pd(x, y);
}
KERN_INLINE vd_t vd_max(vd_t x, vd_t y) {
  return _mm256_max_pd(x, y);
}
KERN_INLINE vd_t vd_min(vd_t x, vd_t y) {
  return _mm256_min_pd(x, y);
}
KERN_INLINE vd_t vd_nansel(vd_t x, vd_t r) {
  return _mm256_blendv_pd(r, _mm256_add_pd(x, x), _mm256_cmp_pd(x, x, _CMP_UNORD_Q));
}

/* ---- integers ---- */
KERN_INLINE vi_t vi_load(const char* p) {
  return _mm256_loadu_si256((const __m256i*)(const void*)p);
}
KERN_INLINE void vi_store(char* p, vi_t v) {
  _mm256_storeu_si256((__m256i*)(void*)p, v);
}
KERN_INLINE void vi_stream(char* p, vi_t v) {
  _mm256_stream_si256((__m256i*)(void*)p, v);
}
KERN_INLINE vi_t vi_add8(vi_t x, vi_t y) {
  return _mm256_add_epi8(x, y);
}
KERN_INLINE vi_t vi_add32(vi_t x, vi_t y) {
  return _mm256_add_epi32(x, y);
}
KERN_INLINE vi_t vi_add64(vi_t x, vi_t y) {
  return _mm256_add_epi64(x, y);
}
KERN_INLINE vi_t vi_max_s8(vi_t x, vi_t y) {
  return _mm256_max_epi8(x, y);
}
KERN_INLINE vi_t vi_min_s8(vi_t x, vi_t y) {
  return _mm256_min_epi8(x, y);
}
KERN_INLINE vi_t vi_max_u8(vi_t x, vi_t y) {
  return _mm256_max_epu8(x, y);
}
KERN_INLINE vi_t vi_min_u8(vi_t x, vi_t y) {
  return _mm256_min_epu8(x, y);
}
KERN_INLINE vi_t vi_max_s32(vi_t x, vi_t y) {
  return _mm256_max_epi32(x, y);
}
KERN_INLINE vi_t vi_min_s32(vi_t x, vi_t y) {
  return _mm256_min_epi32(x, y);
}
KERN_INLINE vi_t vi_max_u32(vi_t x, vi_t y) {
  return _mm256_max_epu32(x, y);
}
KERN_INLINE vi_t vi_min_u32(vi_t x, vi_t y) {
  return _mm256_min_epu32(x, y);
}
/* AVX2 has no 64-bit max/min: compare and blend. */
KERN_INLINE vi_t vi_max_s64(vi_t x, vi_t y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(x, y));
}
KERN_INLINE vi_t vi_min_s64(vi_t x, vi_t y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(y, x));
}
/* Unsigned order is signed order with the top bit flipped. */
KERN_INLINE vi_t flip64(vi_t x) {
  return _mm256_xor_si256(x, _mm256_set1_epi64x(INT64_MIN));
}
KERN_INLINE vi_t vi_max_u64(vi_t x, vi_t y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(flip64(x), flip64(y)));
}
KERN_INLINE vi_t vi_min_u64(vi_t x, vi_t y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi64(flip64(y), flip64(x)));
}

/* ---- 32-bit lanes for fp8 (reduce_simd.h): VF_N lanes, one per element ---- */
KERN_INLINE vi_t vi_load_u8x(const char* p) { /* VF_N bytes, zero-extended */
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(const void*)p));
}
KERN_INLINE void vi_store_u8x(char* p, vi_t v) { /* the low byte of each lane */
  const __m256i pick =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  __m256i b = _mm256_shuffle_epi8(v, pick);
  __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
  _mm_storel_epi64((__m128i*)(void*)p, _mm_unpacklo_epi32(lo, hi));
}
KERN_INLINE vi_t vi_set1_32(uint32_t x) {
  return _mm256_set1_epi32((int)x);
}
KERN_INLINE vi_t vi_sub32(vi_t x, vi_t y) {
  return _mm256_sub_epi32(x, y);
}
KERN_INLINE vi_t vi_and(vi_t x, vi_t y) {
  return _mm256_and_si256(x, y);
}
KERN_INLINE vi_t vi_or(vi_t x, vi_t y) {
  return _mm256_or_si256(x, y);
}
KERN_INLINE vi_t vi_srlv32(vi_t x, vi_t s) {
  return _mm256_srlv_epi32(x, s);
}
KERN_INLINE vi_t vi_sllv32(vi_t x, vi_t s) {
  return _mm256_sllv_epi32(x, s);
}
/* a > b (signed) ? x : y, and a == b ? x : y, lane by lane */
KERN_INLINE vi_t vi_sel_gt32(vi_t a, vi_t b, vi_t x, vi_t y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpgt_epi32(a, b));
}
KERN_INLINE vi_t vi_sel_eq32(vi_t a, vi_t b, vi_t x, vi_t y) {
  return _mm256_blendv_epi8(y, x, _mm256_cmpeq_epi32(a, b));
}
KERN_INLINE vf_t vi_to_f(vi_t x) {
  return _mm256_cvtepi32_ps(x);
}
KERN_INLINE vf_t vi_as_f(vi_t x) {
  return _mm256_castsi256_ps(x);
}
KERN_INLINE vi_t vf_as_i(vf_t x) {
  return _mm256_castps_si256(x);
}

/* ---- 16-bit lanes for the fp8 sums (reduce_simd.h): halves ---- */
KERN_INLINE vi_t vi_set1_8(uint8_t x) {
  return _mm256_set1_epi8((char)x);
}
KERN_INLINE vi_t vi_set1_16(uint16_t x) {
  return _mm256_set1_epi16((short)x);
}
KERN_INLINE vi_t vi_add16(vi_t x, vi_t y) {
  return _mm256_add_epi16(x, y);
}
KERN_INLINE vi_t vi_slli16(vi_t x, int s) {
  return _mm256_slli_epi16(x, s);
}
KERN_INLINE vi_t vi_srli16(vi_t x, int s) {
  return _mm256_srli_epi16(x, s);
}
KERN_INLINE vi_t vi_srai16(vi_t x, int s) {
  return _mm256_srai_epi16(x, s);
}
KERN_INLINE vi_t vi_min_s16(vi_t x, vi_t y) {
  return _mm256_min_epi16(x, y);
}
KERN_INLINE vi_t vi_min_u16(vi_t x, vi_t y) {
  return _mm256_min_epu16(x, y);
}
/* Whether some byte of x is greater (signed) than y's. */
KERN_INLINE int vi_any_gt_s8(vi_t x, vi_t y) {
  return _mm256_movemask_epi8(_mm256_cmpgt_epi8(x, y)) != 0; /* vptest: one more micro-op */
}
/* vcvtph2ps from memory. The register form is two micro-ops, one on the
 * shuffle port; from memory it is one and a load, and the upper half of a
 * vector needs no extract either. Written in asm: the compilers turn a
 * store and reload back into the register form. */
KERN_INLINE __m256 f16c_widen_mem(const __m128i* p) {
  __m256 r;
  __asm__("vcvtph2ps %1, %0" : "=x"(r) : "m"(*p));
  return r;
}
/* The halves in x and y summed lane by lane, rounded to half (nearest
 * even): in float, where the sum of two halves rounds to the same half
 * (24 >= 2 * 11 + 2 bits), through F16C; widened from a stack copy
 * (about 15% faster for fp8 sums than widening registers). */
KERN_INLINE vi_t vi_add_f16(vi_t x, vi_t y) {
  __m256i xy[2] = {x, y};
  const __m128i* h = (const __m128i*)(const void*)xy;
  __m256 lo = _mm256_add_ps(f16c_widen_mem(h + 0), f16c_widen_mem(h + 2));
  __m256 hi = _mm256_add_ps(f16c_widen_mem(h + 1), f16c_widen_mem(h + 3));
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT)),
      _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT), 1);
}

#include "reduce_simd.h"
