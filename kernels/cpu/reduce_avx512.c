/*
 * AVX-512 (F + BW) path: the 512-bit vector primitives; the loops themselves
 * are in reduce_simd.h, shared with the AVX2 path.
 */
#include <immintrin.h>

#include "kern_dispatch.h"

#define SIMD_ENTRY kern_simd_avx512
#define VF_N 16
#define VD_N 8
#define VI_BYTES 64
typedef __m512 vf_t;
typedef __m512d vd_t;
typedef __m512i vi_t;
typedef __m256i vh_t; /* VF_N narrow (16-bit) elements */

/* ---- float ---- */
KERN_INLINE vf_t vf_load(const char* p) {
  return _mm512_loadu_ps(p);
}
KERN_INLINE void vf_store(char* p, vf_t v) {
  _mm512_storeu_ps(p, v);
}
KERN_INLINE void vf_stream(char* p, vf_t v) {
  _mm512_stream_ps((float*)(void*)p, v);
}
KERN_INLINE vf_t vf_set1(float x) {
  return _mm512_set1_ps(x);
}
KERN_INLINE vf_t vf_add(vf_t x, vf_t y) {
  return _mm512_add_ps(x, y);
}
KERN_INLINE vf_t vf_mul(vf_t x, vf_t y) {
  return _mm512_mul_ps(x, y);
}
KERN_INLINE vf_t vf_div(vf_t x, vf_t y) {
  return _mm512_div_ps(x, y);
}
/* maxps/minps return the second operand on NaN or equality: x > y ? x : y. */
KERN_INLINE vf_t vf_max(vf_t x, vf_t y) {
  return _mm512_max_ps(x, y);
}
KERN_INLINE vf_t vf_min(vf_t x, vf_t y) {
  return _mm512_min_ps(x, y);
}
KERN_INLINE vf_t vf_nansel(vf_t x, vf_t r) {
  return _mm512_mask_add_ps(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x, x);
}

/* vcvtph2ps is exact; vcvtps2ph rounds by the immediate (RNE). */
KERN_INLINE vf_t vf_load_f16(const char* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(const void*)p));
}
KERN_INLINE vh_t vf_to_f16(vf_t v) {
  return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
}
KERN_INLINE vf_t vf_rt_f16(vf_t v) {
  return _mm512_cvtph_ps(vf_to_f16(v));
}

/* bf16 is the top half of a float. A whole vector of bf16 is widened by
 * interleaving with zeros; the lanes come out permuted within each 128-bit
 * quarter, and packus in vf_to_bf16x2 puts them back in order. */
KERN_INLINE vf_t vf_bf16_lo(vi_t w) {
  return _mm512_castsi512_ps(_mm512_unpacklo_epi16(_mm512_setzero_si512(), w));
}
KERN_INLINE vf_t vf_bf16_hi(vi_t w) {
  return _mm512_castsi512_ps(_mm512_unpackhi_epi16(_mm512_setzero_si512(), w));
}
/* RNE on the low 16 bits (as kern_float_to_bf16), NaN forced quiet; the
 * result sits in the low half of each 32-bit lane. */
KERN_INLINE vi_t bf16_round(vf_t v) {
  __m512i x = _mm512_castps_si512(v);
  __m512i hi = _mm512_srli_epi32(x, 16);
  __m512i bias =
      _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7fff));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(x, bias), 16);
  __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, isnan, hi, _mm512_set1_epi32(0x40));
}
/* Lanes are <= 0xffff, so the saturating pack just narrows. */
KERN_INLINE vi_t vf_to_bf16x2(vf_t lo, vf_t hi) {
  return _mm512_packus_epi32(bf16_round(lo), bf16_round(hi));
}
/* The rounded bf16 widened back in place: a float whose low half is zero. */
KERN_INLINE vf_t vf_rt_bf16(vf_t v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_round(v), 16));
}
KERN_INLINE void vh_store(char* p, vh_t h) {
  _mm256_storeu_si256((__m256i*)(void*)p, h);
}
KERN_INLINE void vh_stream(char* p, vh_t h) {
  _mm256_stream_si256((__m256i*)(void*)p, h);
}

/* ---- double ---- */
KERN_INLINE vd_t vd_load(const char* p) {
  return _mm512_loadu_pd(p);
}
KERN_INLINE void vd_store(char* p, vd_t v) {
  _mm512_storeu_pd(p, v);
}
KERN_INLINE void vd_stream(char* p, vd_t v) {
  _mm512_stream_pd((double*)(void*)p, v);
}
KERN_INLINE vd_t vd_set1(double x) {
  return _mm512_set1_pd(x);
}
KERN_INLINE vd_t vd_add(vd_t x, vd_t y) {
  return _mm512_add_pd(x, y);
}
KERN_INLINE vd_t vd_mul(vd_t x, vd_t y) {
  return _mm512_mul_pd(x, y);
}
KERN_INLINE vd_t vd_div(vd_t x, vd_t y) {
  return _mm512_div_pd(x, y);
}
KERN_INLINE vd_t vd_max(vd_t x, vd_t y) {
  return _mm512_max_pd(x, y);
}
KERN_INLINE vd_t vd_min(vd_t x, vd_t y) {
  return _mm512_min_pd(x, y);
}
KERN_INLINE vd_t vd_nansel(vd_t x, vd_t r) {
  return _mm512_mask_add_pd(r, _mm512_cmp_pd_mask(x, x, _CMP_UNORD_Q), x, x);
}

/* ---- integers (8-bit forms need BW) ---- */
KERN_INLINE vi_t vi_load(const char* p) {
  return _mm512_loadu_si512(p);
}
KERN_INLINE void vi_store(char* p, vi_t v) {
  _mm512_storeu_si512(p, v);
}
KERN_INLINE void vi_stream(char* p, vi_t v) {
  _mm512_stream_si512((__m512i*)(void*)p, v);
}
KERN_INLINE vi_t vi_add8(vi_t x, vi_t y) {
  return _mm512_add_epi8(x, y);
}
KERN_INLINE vi_t vi_add32(vi_t x, vi_t y) {
  return _mm512_add_epi32(x, y);
}
KERN_INLINE vi_t vi_add64(vi_t x, vi_t y) {
  return _mm512_add_epi64(x, y);
}
KERN_INLINE vi_t vi_max_s8(vi_t x, vi_t y) {
  return _mm512_max_epi8(x, y);
}
KERN_INLINE vi_t vi_min_s8(vi_t x, vi_t y) {
  return _mm512_min_epi8(x, y);
}
KERN_INLINE vi_t vi_max_u8(vi_t x, vi_t y) {
  return _mm512_max_epu8(x, y);
}
KERN_INLINE vi_t vi_min_u8(vi_t x, vi_t y) {
  return _mm512_min_epu8(x, y);
}
KERN_INLINE vi_t vi_max_s32(vi_t x, vi_t y) {
  return _mm512_max_epi32(x, y);
}
KERN_INLINE vi_t vi_min_s32(vi_t x, vi_t y) {
  return _mm512_min_epi32(x, y);
}
KERN_INLINE vi_t vi_max_u32(vi_t x, vi_t y) {
  return _mm512_max_epu32(x, y);
}
KERN_INLINE vi_t vi_min_u32(vi_t x, vi_t y) {
  return _mm512_min_epu32(x, y);
}
KERN_INLINE vi_t vi_max_s64(vi_t x, vi_t y) {
  return _mm512_max_epi64(x, y);
}
KERN_INLINE vi_t vi_min_s64(vi_t x, vi_t y) {
  return _mm512_min_epi64(x, y);
}
KERN_INLINE vi_t vi_max_u64(vi_t x, vi_t y) {
  return _mm512_max_epu64(x, y);
}
KERN_INLINE vi_t vi_min_u64(vi_t x, vi_t y) {
  return _mm512_min_epu64(x, y);
}

/* ---- 32-bit lanes for fp8 (reduce_simd.h): VF_N lanes, one per element ---- */
KERN_INLINE vi_t vi_load_u8x(const char* p) { /* VF_N bytes, zero-extended */
  return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(const void*)p));
}
KERN_INLINE void vi_store_u8x(char* p, vi_t v) { /* the low byte of each lane */
  _mm_storeu_si128((__m128i*)(void*)p, _mm512_cvtepi32_epi8(v));
}
KERN_INLINE vi_t vi_set1_32(uint32_t x) {
  return _mm512_set1_epi32((int)x);
}
KERN_INLINE vi_t vi_sub32(vi_t x, vi_t y) {
  return _mm512_sub_epi32(x, y);
}
KERN_INLINE vi_t vi_and(vi_t x, vi_t y) {
  return _mm512_and_si512(x, y);
}
KERN_INLINE vi_t vi_or(vi_t x, vi_t y) {
  return _mm512_or_si512(x, y);
}
KERN_INLINE vi_t vi_srlv32(vi_t x, vi_t s) {
  return _mm512_srlv_epi32(x, s);
}
KERN_INLINE vi_t vi_sllv32(vi_t x, vi_t s) {
  return _mm512_sllv_epi32(x, s);
}
/* a > b (signed) ? x : y, and a == b ? x : y, lane by lane */
KERN_INLINE vi_t vi_sel_gt32(vi_t a, vi_t b, vi_t x, vi_t y) {
  return _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(a, b), y, x);
}
KERN_INLINE vi_t vi_sel_eq32(vi_t a, vi_t b, vi_t x, vi_t y) {
  return _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(a, b), y, x);
}
KERN_INLINE vf_t vi_to_f(vi_t x) {
  return _mm512_cvtepi32_ps(x);
}
KERN_INLINE vf_t vi_as_f(vi_t x) {
  return _mm512_castsi512_ps(x);
}
KERN_INLINE vi_t vf_as_i(vf_t x) {
  return _mm512_castps_si512(x);
}

/* ---- 16-bit lanes for the fp8 sums (reduce_simd.h): halves ---- */
KERN_INLINE vi_t vi_set1_8(uint8_t x) {
  return _mm512_set1_epi8((char)x);
}
KERN_INLINE vi_t vi_set1_16(uint16_t x) {
  return _mm512_set1_epi16((short)x);
}
KERN_INLINE vi_t vi_add16(vi_t x, vi_t y) {
  return _mm512_add_epi16(x, y);
}
KERN_INLINE vi_t vi_slli16(vi_t x, int s) {
  return _mm512_slli_epi16(x, (unsigned)s);
}
KERN_INLINE vi_t vi_srli16(vi_t x, int s) {
  return _mm512_srli_epi16(x, (unsigned)s);
}
KERN_INLINE vi_t vi_srai16(vi_t x, int s) {
  return _mm512_srai_epi16(x, (unsigned)s);
}
KERN_INLINE vi_t vi_min_s16(vi_t x, vi_t y) {
  return _mm512_min_epi16(x, y);
}
KERN_INLINE vi_t vi_min_u16(vi_t x, vi_t y) {
  return _mm512_min_epu16(x, y);
}
/* Whether some byte of x is greater (signed) than y's. */
KERN_INLINE int vi_any_gt_s8(vi_t x, vi_t y) {
  return _mm512_cmpgt_epi8_mask(x, y) != 0;
}
/* vcvtph2ps from memory: no shuffle micro-op, no extract (as in
 * reduce_avx2.c, whose comment says why this is asm). */
KERN_INLINE __m512 f16c_widen_mem(const __m256i* p) {
  __m512 r;
  __asm__("vcvtph2ps %1, %0" : "=v"(r) : "m"(*p));
  return r;
}
/* The halves in x and y summed lane by lane, rounded to half (nearest
 * even): in float, where the sum of two halves rounds to the same half
 * (24 >= 2 * 11 + 2 bits); widened from a stack copy. */
KERN_INLINE vi_t vi_add_f16(vi_t x, vi_t y) {
  __m512i xy[2] = {x, y};
  const __m256i* h = (const __m256i*)(const void*)xy;
  __m512 lo = _mm512_add_ps(f16c_widen_mem(h + 0), f16c_widen_mem(h + 2));
  __m512 hi = _mm512_add_ps(f16c_widen_mem(h + 1), f16c_widen_mem(h + 3));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT)),
                            _mm512_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT), 1);
}

#include "reduce_simd.h"
