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
 *   vf_bf16_lo, vf_bf16_hi, vf_to_bf16x2: a vi_t of 2 * VF_N bf16 widened
 *                         to two float vectors (in any lane order) and back
 *   vd_*                  as vf_* for double
 *   vi_load, vi_store, vi_add{8,32,64}, vi_{max,min}_{s,u}{8,32,64}
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

/* Whole vectors of a float-computed type; ES is the stored element size.
 * With op and fl constant (KERN_SPECIALIZE) the branches above fold away,
 * and for KERN_OP_COPY the unused loads of `a` vanish. */
#define SIMD_FP_LOOP(NAME, V, N, ES, LOAD, STORE, EXPR)                                         \
  KERN_INLINE size_t NAME(int op, unsigned fl, char* d, const char* a, const char* b, size_t n, \
                          V s, V dv) {                                                          \
    size_t i = 0;                                                                               \
    for (; i + (N) <= n; i += (N))                                                              \
      STORE(d + i * (ES), EXPR(LOAD(a + i * (ES)), LOAD(b + i * (ES)), op, fl, s, dv));         \
    return i;                                                                                   \
  }

/* Stores of the narrow types, plain and streaming. */
KERN_INLINE void st_f16(char* p, vf_t v) {
  vh_store(p, vf_to_f16(v));
}
KERN_INLINE void st_f16_nt(char* p, vf_t v) {
  vh_stream(p, vf_to_f16(v));
}

SIMD_FP_LOOP(loop_f32, vf_t, VF_N, 4, vf_load, vf_store, vf_expr)
SIMD_FP_LOOP(loop_f32_nt, vf_t, VF_N, 4, vf_load, vf_stream, vf_expr)
SIMD_FP_LOOP(loop_f16, vf_t, VF_N, 2, vf_load_f16, st_f16, vf_expr)
SIMD_FP_LOOP(loop_f16_nt, vf_t, VF_N, 2, vf_load_f16, st_f16_nt, vf_expr)
SIMD_FP_LOOP(loop_f64, vd_t, VD_N, 8, vd_load, vd_store, vd_expr)
SIMD_FP_LOOP(loop_f64_nt, vd_t, VD_N, 8, vd_load, vd_stream, vd_expr)

/* bf16 goes a whole integer vector at a time: widening and narrowing are
 * integer shuffles that work best on full registers. */
#define SIMD_BF16_LOOP(NAME, STORE)                                                             \
  KERN_INLINE size_t NAME(int op, unsigned fl, char* d, const char* a, const char* b, size_t n, \
                          vf_t s, vf_t dv) {                                                    \
    size_t i = 0;                                                                               \
    for (; i + 2 * VF_N <= n; i += 2 * VF_N) {                                                  \
      vi_t x = vi_load(a + 2 * i), y = vi_load(b + 2 * i);                                      \
      vf_t lo = vf_expr(vf_bf16_lo(x), vf_bf16_lo(y), op, fl, s, dv);                           \
      vf_t hi = vf_expr(vf_bf16_hi(x), vf_bf16_hi(y), op, fl, s, dv);                           \
      STORE(d + 2 * i, vf_to_bf16x2(lo, hi));                                                   \
    }                                                                                           \
    return i;                                                                                   \
  }

SIMD_BF16_LOOP(loop_bf16, vi_store)
SIMD_BF16_LOOP(loop_bf16_nt, vi_stream)

/* Integer loops cover sum/max/min without flags: products, premul and the
 * (scalar-only) division stay on the portable path. */
#define SIMD_INT_BODY(F, STORE)                                           \
  for (; i + VI_BYTES / (ES) <= n; i += VI_BYTES / (ES)) {                \
    STORE(d + i * (ES), F(vi_load(a + i * (ES)), vi_load(b + i * (ES)))); \
  }

#define SIMD_INT_LOOP(NAME, ES_, ADD, MAX, MIN)                                         \
  static size_t NAME(int op, int nt, char* d, const char* a, const char* b, size_t n) { \
    enum { ES = ES_ };                                                                  \
    size_t i = 0;                                                                       \
    if (op == KERN_SUM && nt) SIMD_INT_BODY(ADD, vi_stream);                            \
    if (op == KERN_SUM && !nt) SIMD_INT_BODY(ADD, vi_store);                            \
    if (op == KERN_MAX && nt) SIMD_INT_BODY(MAX, vi_stream);                            \
    if (op == KERN_MAX && !nt) SIMD_INT_BODY(MAX, vi_store);                            \
    if (op == KERN_MIN && nt) SIMD_INT_BODY(MIN, vi_stream);                            \
    if (op == KERN_MIN && !nt) SIMD_INT_BODY(MIN, vi_store);                            \
    return i;                                                                           \
  }

SIMD_INT_LOOP(int_i8, 1, vi_add8, vi_max_s8, vi_min_s8)
SIMD_INT_LOOP(int_u8, 1, vi_add8, vi_max_u8, vi_min_u8)
SIMD_INT_LOOP(int_i32, 4, vi_add32, vi_max_s32, vi_min_s32)
SIMD_INT_LOOP(int_u32, 4, vi_add32, vi_max_u32, vi_min_u32)
SIMD_INT_LOOP(int_i64, 8, vi_add64, vi_max_s64, vi_min_s64)
SIMD_INT_LOOP(int_u64, 8, vi_add64, vi_max_u64, vi_min_u64)

static size_t simd_int(ncclDataType_t type, int op, int nt, char* d, const char* a, const char* b,
                       size_t n) {
  switch (type) {
    case ncclInt8:
      return int_i8(op, nt, d, a, b, n);
    case ncclUint8:
      return int_u8(op, nt, d, a, b, n);
    case ncclInt32:
      return int_i32(op, nt, d, a, b, n);
    case ncclUint32:
      return int_u32(op, nt, d, a, b, n);
    case ncclInt64:
      return int_i64(op, nt, d, a, b, n);
    case ncclUint64:
      return int_u64(op, nt, d, a, b, n);
    default:
      return 0;
  }
}

/* The float-computed loops of one type, plain or streaming stores. */
#define SIMD_FP_RUN(LOOP)                                         \
  do {                                                            \
    if (nt) {                                                     \
      KERN_SPECIALIZE(done, op, fl, LOOP##_nt, d, a, b, n, s, dv) \
    } else {                                                      \
      KERN_SPECIALIZE(done, op, fl, LOOP, d, a, b, n, s, dv)      \
    }                                                             \
  } while (0)

static size_t simd_body(const struct kern_redop* r, int op, unsigned fl, int nt, char* d,
                        const char* a, const char* b, size_t n) {
  size_t done = 0;
  if (r->type == ncclFloat64) {
    vd_t s = vd_set1(kern_scalar_f64(r)), dv = vd_set1((double)kern_divisor(r));
    SIMD_FP_RUN(loop_f64);
    return done;
  }
  if (r->type == ncclFloat32 || r->type == ncclFloat16 || r->type == ncclBfloat16) {
    vf_t s = vf_set1(kern_scalar_f32(r)), dv = vf_set1((float)kern_divisor(r));
    if (r->type == ncclFloat32) SIMD_FP_RUN(loop_f32);
    if (r->type == ncclFloat16) SIMD_FP_RUN(loop_f16);
    if (r->type == ncclBfloat16) SIMD_FP_RUN(loop_bf16);
    return done;
  }
  if (fl != 0 || op == KERN_PROD || op > KERN_MIN) return 0;
  return simd_int(r->type, op, nt, d, a, b, n);
}

/* Streaming stores need dst aligned: whole cache lines also let the
 * write-combining buffers go out without reading memory. */
#define SIMD_ALIGN 64

size_t SIMD_ENTRY(const struct kern_redop* r, int op, unsigned fl, int nt, void* dst, const void* a,
                  const void* b, size_t n) {
  size_t z = kern_type_size(r->type), head = 0;
  uintptr_t mis = (uintptr_t)dst % SIMD_ALIGN;
  fl &= KERN_FLAG_MASK;
  /* A dst off the element grid can never be aligned: plain stores then. */
  if (nt && mis % z == 0)
    head = (SIMD_ALIGN - mis) % SIMD_ALIGN / z;
  else
    nt = 0;
  if (head >= n) return 0;
  if (head) kern_portable(r, op, fl, dst, a, b, head); /* up to the first line */
  size_t off = head * z;
  size_t done = simd_body(r, op, fl, nt, (char*)dst + off, (const char*)a + off,
                          (const char*)b + off, n - head);
  if (nt) _mm_sfence(); /* order the streamed lines before later stores */
  return head + done;
}
