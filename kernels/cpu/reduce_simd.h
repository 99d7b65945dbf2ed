/*
 * Loops shared by the SIMD paths, written once over the vector primitives
 * that reduce_avx2.c and reduce_avx512.c define before including this file.
 */
/* No include guard on purpose: one inclusion per ISA translation unit.
 *
 * The includer defines:
 *   SIMD_ENTRY            name of the entry point (see kern_dispatch.h)
 *   vf_t, VF_N            float vector and its lane count
 *   vd_t, VD_N            double vector and its lane count
 *   vi_t, VI_BYTES        integer vector and its width in bytes
 *   vh_t                  VF_N 16-bit elements (half or bf16)
 *   vf_load, vf_store     unaligned, on char addresses; vf_set1
 *   vf_stream, vd_stream, vi_stream, vh_stream: non-temporal stores to
 *                         addresses aligned to their width
 *   vf_add, vf_mul, vf_div
 *   vf_max(x, y)          exactly x > y ? x : y (NaN or equal: y)
 *   vf_min(x, y)          exactly x < y ? x : y
 *   vf_nansel(x, r)       x is NaN ? x + x (x quieted) : r
 *   vf_load_f16, vf_to_f16: VF_N halves widened from / rounded (RNE, NaN
 *                         quieted) to a vh_t; vh_store
 *   vf_rt_f16(x)          x rounded to half and widened back (what storing
 *                         and reloading a half gives)
 *   vf_bf16_lo, vf_bf16_hi, vf_to_bf16x2: a vi_t of 2 * VF_N bf16 widened
 *                         to two float vectors (in any lane order) and back
 *   vf_rt_bf16(x)         x rounded to bf16 and widened back, lane by lane
 *   vd_*                  as vf_* for double
 *   vi_load, vi_store, vi_add{8,32,64}, vi_{max,min}_{s,u}{8,32,64}
 *   vi_load_u8x, vi_store_u8x: VF_N bytes to and from 32-bit lanes (fp8)
 *   vi_set1_32, vi_sub32, vi_and, vi_or, vi_srlv32, vi_sllv32 (per-lane
 *                         shift counts), vi_sel_gt32(a, b, x, y) (a > b
 *                         signed ? x : y), vi_sel_eq32, vi_to_f (convert),
 *                         vi_as_f, vf_as_i (reinterpret)
 *   vi_set1_8, vi_set1_16, vi_add16, vi_slli16, vi_srli16, vi_srai16,
 *                         vi_min_s16, vi_min_u16: 16-bit lanes (fp8 sums)
 *   vi_any_gt_s8(x, y)    whether some byte of x > y's (signed)
 *   vi_add_f16(x, y)      16-bit lanes holding halves, summed and rounded
 *                         to half (nearest even)
 */

/*
 * One vector of a float or double expression, mirroring the portable
 * expr_f32/expr_f64 in reduce.c operation by operation: same rounding steps,
 * no FMA, and the NaN of the left operand wins explicitly (vf_nansel), so
 * the bits match the portable path whatever order the compiler picks.
 */
#define SIMD_FP_EXPR(NAME, V, P)                                 \
  KERN_INLINE V NAME(V x, V y, int op, unsigned fl, V s, V dv) { \
    if (fl & KERN_PRE) y = P##_nansel(y, P##_mul(y, s));         \
    V r = y;                                                     \
    if (op == KERN_SUM) r = P##_nansel(x, P##_add(x, y));        \
    if (op == KERN_PROD) r = P##_nansel(x, P##_mul(x, y));       \
    if (op == KERN_MAX) r = P##_max(x, y);                       \
    if (op == KERN_MIN) r = P##_min(x, y);                       \
    if (fl & KERN_POST) r = P##_div(r, dv);                      \
    return r;                                                    \
  }

SIMD_FP_EXPR(vf_expr, vf_t, vf)
SIMD_FP_EXPR(vd_expr, vd_t, vd)

/* A source's pre-multiplication, as the expressions above do it. */
KERN_INLINE vf_t vf_premul(vf_t x, vf_t s) {
  return vf_nansel(x, vf_mul(x, s));
}
KERN_INLINE vd_t vd_premul(vd_t x, vd_t s) {
  return vd_nansel(x, vd_mul(x, s));
}

/* Float and double need no rounding between the steps of a chain. */
#define SIMD_RT_NONE(v) (v)

/* The sources and destinations of a call from element `off` on, in
 * locals: the stores (through char pointers) then cannot make the compiler
 * reload them. ES is the element size. */
#define SIMD_LOCAL_PTRS(ES)                                                           \
  const char* src[KERN_TASK_MAX_SRCS];                                                \
  char* dst[KERN_TASK_MAX_DSTS];                                                      \
  for (int k_ = 0; k_ < ns; k_++) src[k_] = (const char*)sp[k_] + off * (size_t)(ES); \
  for (int j_ = 0; j_ < nd; j_++) dst[j_] = (char*)dp[j_] + off * (size_t)(ES)

/* One step of a chain: source k's vector y into the partial acc, first
 * where its swap bit says (read as it is), else second, pre-multiplied
 * where its pre bit says. Reads op, pm, sw, s and dv of the loop it is
 * in; with pm and sw constant the branches fold away. */
#define SIMD_CHAIN_STEP(P, acc, y, k)        \
  ((sw >> (k)) & 1u                          \
       ? P##_expr((y), (acc), op, 0u, s, dv) \
       : P##_expr((acc), ((pm >> (k)) & 1u) ? P##_premul((y), s) : (y), op, 0u, s, dv))

/* A fold's (swap bits set) four vectors from element i: every vector of
 * a step takes its sources in the same order, so the step's order is
 * tested once per four vectors; tested per vector, with the sources'
 * loop around it, the fold took 1.4x the loop without swaps. */
#define SIMD_FP_FOLD4(NAME, V, P, N, ES, LOAD, STORE, RT)                                  \
  KERN_INLINE void NAME(int op, unsigned fl, int ns, int nd, unsigned pm, unsigned sw,     \
                        const char* const* src, char* const* dst, size_t i, V s, V dv) {   \
    V a[4];                                                                                \
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                  \
      a[u] = LOAD(src[0] + (i + (size_t)u * (N)) * (ES));                                  \
      if (pm & 1u) a[u] = RT(P##_premul(a[u], s));                                         \
    }                                                                                      \
    for (int k = 1; k < ns; k++) {                                                         \
      const char* sk = src[k] + i * (ES);                                                  \
      _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a[u] =                           \
          SIMD_CHAIN_STEP(P, a[u], LOAD(sk + (size_t)u * (N) * (ES)), k);                  \
      if (k < ns - 1) _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) a[u] = RT(a[u]); \
    }                                                                                      \
    _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {                                  \
      if (fl & KERN_POST) a[u] = P##_div(a[u], dv);                                        \
      for (int j = 0; j < nd; j++) STORE(dst[j] + (i + (size_t)u * (N)) * (ES), a[u]);     \
    }                                                                                      \
  }

/*
 * Whole vectors of a float-computed type, all sources in one pass: the
 * chain of kernels.h held in a register, rounded to the type (RT) between
 * steps where a chain of stored results would round, and stored once per
 * destination. ES is the stored element size. With op, fl, ns, nd and pre
 * constant (KERN_DEF_SHAPES) the branches and the source loop fold away:
 * the pair shape is exactly EXPR(LOAD(a), LOAD(b), op, fl). The loop counts
 * whole vectors, fixed before it starts, instead of testing i + N <= n: no
 * index is then needed after it, and gcc keeps one induction variable
 * whichever function it lands in (with the index live after the loop, it
 * sometimes kept two, one more instruction per vector).
 */
#define SIMD_FP_LOOP(NAME, V, P, N, ES, LOAD, STORE, RT)                                      \
  SIMD_FP_FOLD4(NAME##_x4, V, P, N, ES, LOAD, STORE, RT)                                      \
  KERN_INLINE size_t NAME(int op, unsigned fl, int ns, int nd, unsigned pre, void* const* dp, \
                          const void* const* sp, size_t off, size_t n, V s, V dv) {           \
    SIMD_LOCAL_PTRS(ES);                                                                      \
    unsigned pm = (fl & KERN_PRE) ? pre : 0u, sw = pre >> KERN_SWAP_SHIFT;                    \
    size_t nv = n / (N), v = 0;                                                               \
    if (sw)                                                                                   \
      for (; v + 4 <= nv; v += 4) NAME##_x4(op, fl, ns, nd, pm, sw, src, dst, v*(N), s, dv);  \
    for (; v < nv; v++) {                                                                     \
      size_t i = v * (N);                                                                     \
      V acc = LOAD(src[0] + i * (ES));                                                        \
      if (pm & 1u) acc = P##_premul(acc, s);                                                  \
      if ((pm & 1u) && ns > 1) acc = RT(acc);                                                 \
      for (int k = 1; k < ns; k++) {                                                          \
        acc = SIMD_CHAIN_STEP(P, acc, LOAD(src[k] + i * (ES)), k);                            \
        if (k < ns - 1) acc = RT(acc);                                                        \
      }                                                                                       \
      if (fl & KERN_POST) acc = P##_div(acc, dv);                                             \
      for (int j = 0; j < nd; j++) STORE(dst[j] + i * (ES), acc);                             \
    }                                                                                         \
    return nv * (N);                                                                          \
  }

/* Stores of the narrow types, plain and streaming. */
KERN_INLINE void st_f16(char* p, vf_t v) {
  vh_store(p, vf_to_f16(v));
}
KERN_INLINE void st_f16_nt(char* p, vf_t v) {
  vh_stream(p, vf_to_f16(v));
}

SIMD_FP_LOOP(loop_f32, vf_t, vf, VF_N, 4, vf_load, vf_store, SIMD_RT_NONE)
SIMD_FP_LOOP(loop_f32_nt, vf_t, vf, VF_N, 4, vf_load, vf_stream, SIMD_RT_NONE)
SIMD_FP_LOOP(loop_f16, vf_t, vf, VF_N, 2, vf_load_f16, st_f16, vf_rt_f16)
SIMD_FP_LOOP(loop_f16_nt, vf_t, vf, VF_N, 2, vf_load_f16, st_f16_nt, vf_rt_f16)
SIMD_FP_LOOP(loop_f64, vd_t, vd, VD_N, 8, vd_load, vd_store, SIMD_RT_NONE)
SIMD_FP_LOOP(loop_f64_nt, vd_t, vd, VD_N, 8, vd_load, vd_stream, SIMD_RT_NONE)

/* One bf16 source step on both halves of a vector. */
#define SIMD_BF16_STEP(lo, hi, w, k)                            \
  do {                                                          \
    vi_t w_ = (w);                                              \
    lo = SIMD_CHAIN_STEP(vf, lo, vf_bf16_lo(w_), k);            \
    hi = SIMD_CHAIN_STEP(vf, hi, vf_bf16_hi(w_), k);            \
    if ((k) < ns - 1) lo = vf_rt_bf16(lo), hi = vf_rt_bf16(hi); \
  } while (0)

/* bf16 goes a whole integer vector at a time: widening and narrowing are
 * integer shuffles that work best on full registers. Every source is
 * widened with the same lane order, so the chain pairs the right lanes.
 * Counted as SIMD_FP_LOOP is. */
#define SIMD_BF16_LOOP(NAME, STORE)                                                           \
  KERN_INLINE size_t NAME(int op, unsigned fl, int ns, int nd, unsigned pre, void* const* dp, \
                          const void* const* sp, size_t off, size_t n, vf_t s, vf_t dv) {     \
    SIMD_LOCAL_PTRS(2);                                                                       \
    unsigned pm = (fl & KERN_PRE) ? pre : 0u, sw = pre >> KERN_SWAP_SHIFT;                    \
    size_t nv = n / (2 * VF_N);                                                               \
    for (size_t v = 0; v < nv; v++) {                                                         \
      size_t i = v * (2 * VF_N);                                                              \
      vi_t x = vi_load(src[0] + 2 * i);                                                       \
      vf_t lo = vf_bf16_lo(x), hi = vf_bf16_hi(x);                                            \
      if (pm & 1u) lo = vf_premul(lo, s), hi = vf_premul(hi, s);                              \
      if ((pm & 1u) && ns > 1) lo = vf_rt_bf16(lo), hi = vf_rt_bf16(hi);                      \
      for (int k = 1; k < ns; k++) SIMD_BF16_STEP(lo, hi, vi_load(src[k] + 2 * i), k);        \
      if (fl & KERN_POST) lo = vf_div(lo, dv), hi = vf_div(hi, dv);                           \
      vi_t out = vf_to_bf16x2(lo, hi);                                                        \
      for (int j = 0; j < nd; j++) STORE(dst[j] + 2 * i, out);                                \
    }                                                                                         \
    return nv * 2 * VF_N;                                                                     \
  }

SIMD_BF16_LOOP(loop_bf16, vi_store)
SIMD_BF16_LOOP(loop_bf16_nt, vi_stream)

/*
 * fp8 through 32-bit integer lanes, one element per lane: the bit recipes
 * of kern_convert.h written lane-parallel, so every result is kc_*'s.
 */

/* e4m3: bias 7, S.1111.111 the only NaN (quiet, sign kept), no inf. */
KERN_INLINE vf_t v8_widen_e4m3(vi_t b) {
  vi_t mag = vi_and(b, vi_set1_32(0x7f)),
       sign = vi_sllv32(vi_and(b, vi_set1_32(0x80)), vi_set1_32(24));
  vi_t normal = vi_add32(vi_sllv32(mag, vi_set1_32(20)), vi_set1_32(120u << 23));
  vi_t sub = vf_as_i(vf_mul(vi_to_f(mag), vf_set1(0x1p-9f))); /* exact: mag < 8 */
  vi_t r = vi_sel_gt32(vi_set1_32(8), mag, sub, normal);
  r = vi_sel_eq32(mag, vi_set1_32(0x7f), vi_set1_32(0x7fc00000u), r);
  return vi_as_f(vi_or(r, sign));
}

/* e5m2: the top byte of a half; exponent 31 is inf, or NaN with its payload. */
KERN_INLINE vf_t v8_widen_e5m2(vi_t b) {
  vi_t mag = vi_and(b, vi_set1_32(0x7f)),
       sign = vi_sllv32(vi_and(b, vi_set1_32(0x80)), vi_set1_32(24));
  vi_t bits = vi_sllv32(mag, vi_set1_32(21));
  vi_t normal = vi_add32(bits, vi_set1_32(112u << 23));
  vi_t special = vi_add32(bits, vi_set1_32(224u << 23));       /* exponent 31 to 255 */
  vi_t sub = vf_as_i(vf_mul(vi_to_f(mag), vf_set1(0x1p-16f))); /* exact: mag < 4 */
  vi_t r = vi_sel_gt32(vi_set1_32(4), mag, sub, normal);
  r = vi_sel_gt32(mag, vi_set1_32(0x7b), special, r);
  return vi_as_f(vi_or(r, sign));
}

/* kc_rne_shift lane by lane: v / 2^s to nearest, ties to even (v < 2^31,
 * 1 <= s <= 31, so the signed comparisons hold). */
KERN_INLINE vi_t v8_rne_shift(vi_t v, vi_t s) {
  vi_t one = vi_set1_32(1), q = vi_srlv32(v, s);
  vi_t rem = vi_sub32(v, vi_sllv32(q, s)), half = vi_sllv32(one, vi_sub32(s, one));
  vi_t tie_up = vi_sel_eq32(rem, half, vi_and(q, one), vi_set1_32(0));
  return vi_add32(q, vi_sel_gt32(rem, half, one, tie_up));
}

/* kc_float_to_e4m3 / kc_float_to_e5m2 lane by lane: the magnitude of
 * kc_narrow_mag (mbits mantissa bits, exponent bias), clamped to `sat`
 * from `sat_mag` on (and inf), NaN to 0x7f, the sign on top. */
KERN_INLINE vi_t v8_narrow(vf_t f, unsigned mbits, int bias, uint32_t sat_mag, uint32_t sat) {
  vi_t x = vf_as_i(f), ax = vi_and(x, vi_set1_32(0x7fffffffu));
  vi_t sign = vi_and(vi_srlv32(x, vi_set1_32(24)), vi_set1_32(0x80));
  vi_t e = vi_srlv32(ax, vi_set1_32(23));
  /* the target's normals: ax less the exponent bias difference, s fixed;
   * its subnormals (and below): the implicit-one mantissa, s from e */
  vi_t v_norm = vi_sub32(ax, vi_set1_32((uint32_t)(127 - bias) << 23));
  vi_t v_sub = vi_or(vi_and(ax, vi_set1_32(0x7fffffu)), vi_set1_32(0x800000u));
  vi_t s_sub = vi_sub32(vi_set1_32(151u - mbits - (uint32_t)bias), e);
  s_sub = vi_min_u32(s_sub, vi_set1_32(31));         /* below half a unit: 0 */
  vi_t is_norm = vi_set1_32((uint32_t)(127 - bias)); /* e > this: normal */
  vi_t v = vi_sel_gt32(e, is_norm, v_norm, v_sub);
  vi_t s = vi_sel_gt32(e, is_norm, vi_set1_32(23 - mbits), s_sub);
  vi_t r = vi_min_u32(v8_rne_shift(v, s), vi_set1_32(sat));
  r = vi_sel_gt32(vi_set1_32(sat_mag), ax, r, vi_set1_32(sat));
  r = vi_sel_gt32(ax, vi_set1_32(0x7f800000u), vi_set1_32(0x7f), r);
  return vi_or(r, sign);
}

KERN_INLINE vi_t v8_to_e4m3(vf_t f) {
  return v8_narrow(f, 3, 7, 0x43e00000u, 0x7e);
}
KERN_INLINE vi_t v8_to_e5m2(vf_t f) {
  return v8_narrow(f, 2, 15, 0x47600000u, 0x7b);
}

/* Loads, stores and the round trip of fp8 type T, and its loops: VF_N
 * bytes per store, so no streaming variant (the _nt loop stores plainly). */
#define SIMD_FP8(T)                                                 \
  KERN_INLINE vf_t ld_##T(const char* p) {                          \
    return v8_widen_##T(vi_load_u8x(p));                            \
  }                                                                 \
  KERN_INLINE void st_##T(char* p, vf_t v) {                        \
    vi_store_u8x(p, v8_to_##T(v));                                  \
  }                                                                 \
  KERN_INLINE vf_t rt_##T(vf_t v) {                                 \
    return v8_widen_##T(v8_to_##T(v));                              \
  }                                                                 \
  SIMD_FP_LOOP(loop_##T, vf_t, vf, VF_N, 1, ld_##T, st_##T, rt_##T) \
  SIMD_FP_LOOP(loop_##T##_nt, vf_t, vf, VF_N, 1, ld_##T, st_##T, rt_##T)

SIMD_FP8(e4m3)
SIMD_FP8(e5m2)

/*
 * A plain fp8 sum (no premul, no division: the everyday call and its
 * chains) in 16-bit lanes that hold halves. The loops above widen and
 * narrow one element per 32-bit lane with the integer recipes, about nine
 * operations per element; here an fp8 value becomes a half with a shift or
 * two, vi_add_f16 adds the halves, and the rounding to fp8 is one
 * round-to-nearest-even on the half's bits. Exact: the sum of two fp8
 * values rounded to half and then to fp8 is the fp8 rounding of their
 * float sum (11 >= 2 * 4 + 2 bits: the GPU facts' "sum via half", and
 * test_kernels' every pair). e4m3 goes scaled by 2^-8, where its bits are
 * a half's shifted by 7 (subnormals included); a sum scales exactly.
 *
 * A vector of VI_BYTES fp8 values splits into its even and its odd bytes,
 * each a vector of halves, with masks and shifts: no shuffles, since the
 * half/float conversions need the same port (docs/performance.md, "The
 * CPU reduction kernels").
 */

/* The plain path's constants for one type, made once per call and kept
 * opaque (KERN_OPAQUE): otherwise GCC builds each again in every iteration
 * (a move and a broadcast, on the port the conversions need). */
struct f8_consts {
  vi_t half_mask;        /* the bits a half takes from a shifted fp8 byte */
  vi_t sat_pos, sat_neg; /* the largest finite fp8 as a half, + and - */
  vi_t one, bias;        /* the rounding: bias + the kept part's low bit */
  vi_t keep;             /* a rounded half's bits */
  vi_t low15;            /* 0x7fff */
  vi_t mag, special;     /* an fp8 byte's magnitude, the largest plain one */
};

KERN_INLINE struct f8_consts f8_consts_make(int e4m3) {
  struct f8_consts k = {
      .half_mask = vi_set1_16(e4m3 ? 0xbf80 : 0xff00),
      .sat_pos = vi_set1_16(e4m3 ? 0x3f00 : 0x7b00),
      .sat_neg = vi_set1_16(e4m3 ? 0xbf00 : 0xfb00),
      .one = vi_set1_16(1),
      .bias = vi_set1_16(e4m3 ? 0x3f : 0x7f),
      .keep = vi_set1_16(e4m3 ? 0xff80 : 0xff00),
      .low15 = vi_set1_16(0x7fff),
      .mag = vi_set1_8(0x7f),
      .special = vi_set1_8(e4m3 ? 0x7e : 0x7b),
  };
  KERN_OPAQUE(k.half_mask);
  KERN_OPAQUE(k.sat_pos);
  KERN_OPAQUE(k.sat_neg);
  KERN_OPAQUE(k.one);
  KERN_OPAQUE(k.bias);
  KERN_OPAQUE(k.keep);
  KERN_OPAQUE(k.low15);
  KERN_OPAQUE(k.mag);
  KERN_OPAQUE(k.special);
  return k;
}

/* The even bytes of v (the low one of each 16-bit lane) as halves: e5m2
 * is the top byte of a half; e4m3 keeps its sign and moves its magnitude
 * down one bit (bit 14 cleared). */
KERN_INLINE vi_t f8_half_even(vi_t v, int e4m3, const struct f8_consts* k) {
  vi_t top = vi_slli16(v, 8);
  if (!e4m3) return top;
  return vi_and(vi_srai16(top, 1), k->half_mask);
}
/* The odd bytes of v (the high one of each lane) as halves. */
KERN_INLINE vi_t f8_half_odd(vi_t v, int e4m3, const struct f8_consts* k) {
  return vi_and(e4m3 ? vi_srai16(v, 1) : v, k->half_mask);
}

/* Halves rounded to the nearest fp8 (ties to even) and saturated to the
 * largest finite one, as halves again (the bits below the fp8 mantissa
 * cleared). No NaN may be there; an infinity (the sum overflowed)
 * saturates. Signed order caps the positive halves, unsigned order the
 * negative ones; the rounding's carry may run into the exponent, as it
 * should, but never into the sign. */
KERN_INLINE vi_t f8_round(vi_t h, int e4m3, const struct f8_consts* k) {
  h = vi_min_u16(vi_min_s16(h, k->sat_pos), k->sat_neg);
  vi_t odd = vi_and(vi_srli16(h, e4m3 ? 7 : 8), k->one);
  return vi_and(vi_add16(vi_add16(h, odd), k->bias), k->keep);
}

/* Rounded halves back to fp8 bytes, the even and the odd interleaved. An
 * e4m3 magnitude moves up one bit, beside its sign again. */
KERN_INLINE vi_t f8_bytes(vi_t even, vi_t odd, int e4m3, const struct f8_consts* k) {
  if (e4m3) {
    even = vi_add16(even, vi_and(even, k->low15));
    odd = vi_add16(odd, vi_and(odd, k->low15));
  }
  return vi_or(vi_srli16(even, 8), odd);
}

/* Whether a block of ns sources holds a value the plain path cannot take:
 * a NaN (e4m3: magnitude 0x7f) or, for e5m2, an infinity or a NaN
 * (magnitude above 0x7b). A sum may then be a NaN, which the plain
 * rounding does not keep; a sum that overflows saturates either way. */
KERN_INLINE int f8_block_special(int ns, const char* const* src, size_t i,
                                 const struct f8_consts* k) {
  vi_t mag = vi_and(vi_load(src[0] + i), k->mag);
  for (int s = 1; s < ns; s++) mag = vi_max_u8(mag, vi_and(vi_load(src[s] + i), k->mag));
  return vi_any_gt_s8(mag, k->special);
}

/* The sum of one block of VI_BYTES elements without a special value: the
 * chain acc = fp8(acc + src[s]), each step rounded. */
KERN_INLINE vi_t f8_block_plain(int e4m3, int ns, const char* const* src, size_t i,
                                const struct f8_consts* k) {
  vi_t v = vi_load(src[0] + i);
  vi_t even = f8_half_even(v, e4m3, k), odd = f8_half_odd(v, e4m3, k);
  for (int s = 1; s < ns; s++) {
    v = vi_load(src[s] + i);
    even = f8_round(vi_add_f16(even, f8_half_even(v, e4m3, k)), e4m3, k);
    odd = f8_round(vi_add_f16(odd, f8_half_odd(v, e4m3, k)), e4m3, k);
  }
  return f8_bytes(even, odd, e4m3, k);
}

/*
 * Blocks with a special value: 32 elements at a time with 256-bit AVX2 and
 * F16C intrinsics (the AVX-512 file compiles them too), every NaN kept as
 * the portable rounding keeps it. The bytes widen to 16-bit lanes by
 * interleaving with zeros (bytes 0-7 and 16-23, 8-15 and 24-31), which the
 * final pack puts back in order.
 */
#define F8_HALF_NAN 0x7e00

/* 16 fp8 values (zero-extended to 16-bit lanes) as halves, e4m3's NaN made
 * a half NaN. */
KERN_INLINE __m256i f8_nan_to_half(__m256i w, int e4m3) {
  if (!e4m3) return _mm256_slli_epi16(w, 8);
  __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7f));
  __m256i sign = _mm256_and_si256(_mm256_slli_epi16(w, 8), _mm256_set1_epi16((short)0x8000));
  __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7), sign);
  __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f));
  return _mm256_blendv_epi8(h, _mm256_or_si256(sign, _mm256_set1_epi16(F8_HALF_NAN)), nan);
}

/* The halves' rounding to fp8 (in the low byte of each 16-bit lane):
 * nearest even on the bits below the fp8 mantissa, saturated to the
 * largest finite value, NaN to 0x7f, the sign on top. */
KERN_INLINE __m256i f8_nan_from_half(__m256i h, int e4m3) {
  const int s = e4m3 ? 7 : 8;
  __m256i mag = _mm256_and_si256(h, _mm256_set1_epi16(0x7fff));
  __m256i odd = _mm256_and_si256(_mm256_srli_epi16(mag, s), _mm256_set1_epi16(1));
  __m256i r = _mm256_add_epi16(mag, _mm256_set1_epi16((short)((1 << (s - 1)) - 1)));
  r = _mm256_srli_epi16(_mm256_add_epi16(r, odd), s);
  r = _mm256_min_epu16(r, _mm256_set1_epi16(e4m3 ? 0x7e : 0x7b));
  __m256i nan = _mm256_cmpgt_epi16(mag, _mm256_set1_epi16(0x7c00));
  r = _mm256_or_si256(r, _mm256_and_si256(nan, _mm256_set1_epi16(0x7f)));
  return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi16(h, 8), _mm256_set1_epi16(0x80)));
}

/* x + y with x86's NaN rule fixed (x's NaN when both are), as vf_nansel. */
KERN_INLINE __m256 f8_nan_add(__m256 x, __m256 y) {
  __m256 r = _mm256_add_ps(x, y);
  return _mm256_blendv_ps(r, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* One step of the chain on 16 lanes: acc = fp8(acc + y), both fp8 bits. */
KERN_INLINE __m256i f8_nan_step(__m256i acc, __m256i y, int e4m3) {
  __m256i a = f8_nan_to_half(acc, e4m3), b = f8_nan_to_half(y, e4m3);
  __m256 lo = f8_nan_add(_mm256_cvtph_ps(_mm256_castsi256_si128(a)),
                         _mm256_cvtph_ps(_mm256_castsi256_si128(b)));
  __m256 hi = f8_nan_add(_mm256_cvtph_ps(_mm256_extracti128_si256(a, 1)),
                         _mm256_cvtph_ps(_mm256_extracti128_si256(b, 1)));
  __m256i h = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT)),
      _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT), 1);
  return f8_nan_from_half(h, e4m3);
}

/* The sum of 32 elements from ns sources, whatever they hold. */
KERN_INLINE __m256i f8_block_nan(int e4m3, int ns, const char* const* src, size_t i) {
  const __m256i zero = _mm256_setzero_si256();
  __m256i v = _mm256_loadu_si256((const __m256i*)(const void*)(src[0] + i));
  __m256i lo = _mm256_unpacklo_epi8(v, zero), hi = _mm256_unpackhi_epi8(v, zero);
  for (int k = 1; k < ns; k++) {
    v = _mm256_loadu_si256((const __m256i*)(const void*)(src[k] + i));
    lo = f8_nan_step(lo, _mm256_unpacklo_epi8(v, zero), e4m3);
    hi = f8_nan_step(hi, _mm256_unpackhi_epi8(v, zero), e4m3);
  }
  return _mm256_packus_epi16(lo, hi);
}

/* 32 summed elements to every destination (streamed when nt: the entry
 * aligned them). */
KERN_INLINE void f8_store32(int nt, int nd, char* const* dst, size_t i, __m256i out) {
  for (int j = 0; j < nd; j++) {
    if (nt)
      _mm256_stream_si256((__m256i*)(void*)(dst[j] + i), out);
    else
      _mm256_storeu_si256((__m256i*)(void*)(dst[j] + i), out);
  }
}

/* Elements [i, i + len) by the NaN-keeping blocks (len a multiple of 32).
 * Out of line: the rare path's own constants and temporaries then stay out
 * of the everyday loop's registers. */
static KERN_NOINLINE void f8_sum_nan(int e4m3, int nt, int ns, int nd, char* const* dst,
                                     const char* const* src, size_t i, size_t len) {
  for (size_t h = 0; h < len; h += 32)
    f8_store32(nt, nd, dst, i + h, f8_block_nan(e4m3, ns, src, i + h));
}

/* The loop runs at about half the memory's rate, bound by its arithmetic,
 * and the hardware prefetchers then stay too close behind it: asking for
 * the line 1 KiB ahead of each source took e4m3 from 0.35 to 0.28 ns per
 * element at 64 MiB on AVX2, e5m2 from 0.28 to 0.22 (docs/performance.md).
 * A prefetch past a buffer's end does not fault. */
#define F8_PREFETCH_AHEAD 1024
KERN_INLINE void f8_prefetch(int ns, const char* const* src, size_t i) {
  for (int s = 0; s < ns; s++) __builtin_prefetch(src[s] + i);
}

/* Whole blocks of a plain fp8 sum of ns sources into nd destinations. A
 * block without a special value, the everyday case, takes the plain path;
 * the others the NaN-keeping one, 32 elements at a time. With AVX-512's
 * blocks of 64, a last 32 goes that way too, not element by element. */
KERN_INLINE size_t f8_sum_loop(int e4m3, int nt, int ns, int nd, void* const* dp,
                               const void* const* sp, size_t off, size_t n) {
  SIMD_LOCAL_PTRS(1);
  const struct f8_consts k = f8_consts_make(e4m3);
  size_t i = 0;
  for (; i + VI_BYTES <= n; i += VI_BYTES) {
    if (i % 64 == 0) f8_prefetch(ns, src, i + F8_PREFETCH_AHEAD);
    if (f8_block_special(ns, src, i, &k)) {
      f8_sum_nan(e4m3, nt, ns, nd, dst, src, i, VI_BYTES);
      continue;
    }
    vi_t out = f8_block_plain(e4m3, ns, src, i, &k);
    for (int j = 0; j < nd; j++) {
      if (nt)
        vi_stream(dst[j] + i, out);
      else
        vi_store(dst[j] + i, out);
    }
  }
  if (VI_BYTES > 32 && i + 32 <= n) {
    f8_sum_nan(e4m3, nt, ns, nd, dst, src, i, 32);
    i += 32;
  }
  return i;
}

/* Inlined with the pair's counts as constants, and as they come. */
KERN_INLINE size_t f8_sum(const struct kern_call* c, int nt, size_t off) {
  int e4m3 = c->r->type == ncclFloat8e4m3;
  if (kern_call_shape(c) == KERN_SHAPE_PAIR)
    return e4m3 ? f8_sum_loop(1, nt, 2, 1, c->dst, c->src, off, c->n - off)
                : f8_sum_loop(0, nt, 2, 1, c->dst, c->src, off, c->n - off);
  return f8_sum_loop(e4m3, nt, c->ns, c->nd, c->dst, c->src, off, c->n - off);
}

/* Integer loops cover sum/max/min without flags: products, premul and the
 * (scalar-only) division stay on the portable path. All sources in one
 * pass, as above. */
#define SIMD_INT_BODY(F, STORE)                                            \
  for (; i + VI_BYTES / (ES) <= n; i += VI_BYTES / (ES)) {                 \
    vi_t acc = vi_load(src[0] + i * (ES));                                 \
    for (int k = 1; k < ns; k++) acc = F(acc, vi_load(src[k] + i * (ES))); \
    for (int j = 0; j < nd; j++) STORE(dst[j] + i * (ES), acc);            \
  }

#define SIMD_INT_LOOP(NAME, ES_, ADD, MAX, MIN)                                                   \
  KERN_INLINE size_t NAME(int op, int nt, int ns, int nd, void* const* dp, const void* const* sp, \
                          size_t off, size_t n) {                                                 \
    enum { ES = ES_ };                                                                            \
    SIMD_LOCAL_PTRS(ES);                                                                          \
    size_t i = 0;                                                                                 \
    if (op == KERN_SUM && nt) SIMD_INT_BODY(ADD, vi_stream);                                      \
    if (op == KERN_SUM && !nt) SIMD_INT_BODY(ADD, vi_store);                                      \
    if (op == KERN_MAX && nt) SIMD_INT_BODY(MAX, vi_stream);                                      \
    if (op == KERN_MAX && !nt) SIMD_INT_BODY(MAX, vi_store);                                      \
    if (op == KERN_MIN && nt) SIMD_INT_BODY(MIN, vi_stream);                                      \
    if (op == KERN_MIN && !nt) SIMD_INT_BODY(MIN, vi_store);                                      \
    return i;                                                                                     \
  }

SIMD_INT_LOOP(int_i8, 1, vi_add8, vi_max_s8, vi_min_s8)
SIMD_INT_LOOP(int_u8, 1, vi_add8, vi_max_u8, vi_min_u8)
SIMD_INT_LOOP(int_i32, 4, vi_add32, vi_max_s32, vi_min_s32)
SIMD_INT_LOOP(int_u32, 4, vi_add32, vi_max_u32, vi_min_u32)
SIMD_INT_LOOP(int_i64, 8, vi_add64, vi_max_s64, vi_min_s64)
SIMD_INT_LOOP(int_u64, 8, vi_add64, vi_max_u64, vi_min_u64)

/* Inlined twice: with the pair's counts as constants, and as they come. */
KERN_INLINE size_t simd_int(ncclDataType_t type, int op, int nt, int ns, int nd, void* const* d,
                            const void* const* s, size_t off, size_t n) {
  switch (type) {
    case ncclInt8:
      return int_i8(op, nt, ns, nd, d, s, off, n);
    case ncclUint8:
      return int_u8(op, nt, ns, nd, d, s, off, n);
    case ncclInt32:
      return int_i32(op, nt, ns, nd, d, s, off, n);
    case ncclUint32:
      return int_u32(op, nt, ns, nd, d, s, off, n);
    case ncclInt64:
      return int_i64(op, nt, ns, nd, d, s, off, n);
    case ncclUint64:
      return int_u64(op, nt, ns, nd, d, s, off, n);
    default:
      return 0;
  }
}

/* Each float-computed loop's shapes (KERN_DEF_SHAPES), plain and streaming. */
KERN_DEF_SHAPES(loop_f32, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_f32_nt, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_f16, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_f16_nt, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_f64, vd_t, vd_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_f64_nt, vd_t, vd_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_bf16, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_bf16_nt, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_e4m3, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_e4m3_nt, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_e5m2, vf_t, vf_t, KERN_SPEC_OP)
KERN_DEF_SHAPES(loop_e5m2_nt, vf_t, vf_t, KERN_SPEC_OP)

/* The float-computed loops of one type, plain or streaming stores. */
#define SIMD_FP_RUN(LOOP) \
  (nt ? LOOP##_nt_shapes(c, off, n, sc, dv) : LOOP##_shapes(c, off, n, sc, dv))

/* Elements [off, n) of the call; returns how many from `off` it computed. */
static size_t simd_body(const struct kern_call* c, int nt, size_t off) {
  const struct kern_redop* r = c->r;
  size_t n = c->n - off;
  if (r->type == ncclFloat64) {
    vd_t sc = vd_set1(kern_scalar_f64(r)), dv = vd_set1((double)kern_divisor(r));
    return SIMD_FP_RUN(loop_f64);
  }
  if (r->type == ncclFloat32 || r->type == ncclFloat16 || r->type == ncclBfloat16 ||
      r->type == ncclFloat8e4m3 || r->type == ncclFloat8e5m2) {
    if ((r->type == ncclFloat8e4m3 || r->type == ncclFloat8e5m2) && c->fl == 0 &&
        c->op == KERN_SUM && !c->swap) /* which NaN's sign survives follows the order */
      return f8_sum(c, nt, off);
    vf_t sc = vf_set1(kern_scalar_f32(r)), dv = vf_set1((float)kern_divisor(r));
    if (r->type == ncclFloat32) return SIMD_FP_RUN(loop_f32);
    if (r->type == ncclFloat16) return SIMD_FP_RUN(loop_f16);
    if (r->type == ncclBfloat16) return SIMD_FP_RUN(loop_bf16);
    if (r->type == ncclFloat8e4m3) return SIMD_FP_RUN(loop_e4m3);
    return SIMD_FP_RUN(loop_e5m2);
  }
  if (c->fl != 0 || c->op == KERN_PROD || c->op > KERN_MIN) return 0;
  /* integer sum, max and min give the same bits in either order: swap bits
   * change nothing here (and without KERN_PRE no source is pre-multiplied) */
  if (kern_call_shape(c) == KERN_SHAPE_PAIR)
    return simd_int(r->type, c->op, nt, 2, 1, c->dst, c->src, off, n);
  return simd_int(r->type, c->op, nt, c->ns, c->nd, c->dst, c->src, off, n);
}

/* Streaming stores need dst aligned: whole cache lines also let the
 * write-combining buffers go out without reading memory. */
#define SIMD_ALIGN 64

size_t SIMD_ENTRY(const struct kern_call* c, int nt) {
  size_t z = c->es, head = 0;
  uintptr_t mis = (uintptr_t)c->dst[0] % SIMD_ALIGN;
  /* One head aligns every destination only if they are all as misaligned;
   * a dst off the element grid can never be aligned: plain stores then. */
  for (int j = 1; j < c->nd; j++)
    if ((uintptr_t)c->dst[j] % SIMD_ALIGN != mis) nt = 0;
  if (nt && mis % z == 0)
    head = (SIMD_ALIGN - mis) % SIMD_ALIGN / z;
  else
    nt = 0;
  if (head >= c->n) return 0;
  if (head) kern_portable(c, 0, head); /* up to the first line */
  size_t done = simd_body(c, nt, head);
  if (nt) _mm_sfence(); /* order the streamed lines before later stores */
  return head + done;
}
