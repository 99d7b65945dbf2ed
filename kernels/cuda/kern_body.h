/*
 * The body of the fused reduce-copy kernel: one source that nvcc compiles
 * for the GPU (kernels/cuda/reduce.cu) and the host compiler for the CPU
 * grid emulation the tests and the simulated driver run (tests/common).
 *
 * A task is kernels.h's kern_task in device form, with room for more: up
 * to 16 sources chained
 * (each step rounded to the type, as a chain of ranks does), the result
 * written to up to 16 destinations, optionally repeated on rows (one
 * launch for Hier's node stages, whose blocks are strided or named by a
 * table). The
 * results are bitwise those of the CPU kernels: the same order of
 * operations, no fused multiply-add (explicit round-to-nearest operations,
 * nvcc -fmad=false, host -ffp-contract=off), one rounding to the type per
 * step.
 *
 * Two paths give those bits. The fast one takes 16 bytes at a time through
 * the hardware's own arithmetic and conversions (kern_hw.h: paired half and
 * bf16 operations, packed conversions, fp8's conversion instructions from
 * sm_89 on), which give Braid's bits on every result that is a number. A
 * GPU returns a canonical NaN where x86 keeps an operand's payload, so one
 * cheap test per vector sends any vector with a NaN lane (or, for max and
 * min, a NaN operand) to the exact path: kern_convert.h's conversions and
 * x86's NaN rules written out (a NaN operand wins, the left one first,
 * quieted; an invalid operation (inf - inf, 0 * inf) gives x86's default
 * NaN, negative). That path also takes the elements before and after the
 * vectors. max and min are x > y ? x : y and x < y ? x : y on both paths,
 * never fmaxf/fminf or __hmax/__hmin (docs/gpu-validation.md).
 */
#ifndef BRAID_KERN_BODY_H_
#define BRAID_KERN_BODY_H_

#include <stdint.h>
#include <string.h>

#include "kern_hw.h"

#define KB_MAX_SRCS 16 /* a node's ranks (algorithms/direct.h: DIRECT_MAX_RANKS) */
#define KB_MAX_DSTS 16

/* NCCL's type numbers and kernels.h's operator numbers, repeated here so
 * that the device side needs neither header. */
enum kb_type {
  KB_INT8 = 0,
  KB_UINT8 = 1,
  KB_INT32 = 2,
  KB_UINT32 = 3,
  KB_INT64 = 4,
  KB_UINT64 = 5,
  KB_HALF = 6,
  KB_FLOAT = 7,
  KB_DOUBLE = 8,
  KB_BF16 = 9,
  KB_E4M3 = 10,
  KB_E5M2 = 11
};
enum kb_op { KB_SUM = 0, KB_PROD = 1, KB_MAX = 2, KB_MIN = 3, KB_COPY = 4 };
#define KB_PRE 1u  /* the source is multiplied by the scalar first */
#define KB_POST 2u /* the result is divided by postdiv last */
#define KB_SPREAD_SRCS 1u
#define KB_SPREAD_DSTS 2u

/* One launch's work; passed by value as the kernel's parameter. */
struct kern_dev_task {
  int32_t type;    /* enum kb_type */
  int32_t op;      /* enum kb_op (KB_COPY with one source) */
  uint32_t pre;    /* bit k: source k is pre-multiplied */
  uint32_t post;   /* 1: divide the result by postdiv */
  int32_t nsrcs;   /* 1..KB_MAX_SRCS */
  int32_t ndsts;   /* 1..KB_MAX_DSTS */
  uint64_t n;      /* elements */
  uint64_t scalar; /* the premul factor in the type's encoding */
  uint32_t postdiv;
  uint32_t rows;         /* 0 or 1: one; else the task again on each row r < rows, */
  int64_t src_row;       /* every source src_row bytes further on per row */
  int64_t dst_row;       /* and every destination dst_row bytes (kern_dev_task_row) */
  const int32_t* src_at; /* NULL, or row r's sources src_at[r] rows on (< 0: no row r) */
  const int32_t* dst_at; /* the same for the destinations */
  uint32_t spread;       /* KB_SPREAD_*: row r reads source r alone, or writes destination r */
  uint32_t tree;         /* 1: the sources combine in the canonical tree (KB_TREE), not a chain */
  const void* srcs[KB_MAX_SRCS];
  void* dsts[KB_MAX_DSTS];
};

/* ---- x86's NaN rules ---- */

/* The IEEE result r of x OP y as x86 returns it. A result that is a number
 * had no NaN operand: the common case costs one test. */
KERN_HD float kb_x86_f(float x, float y, float r) {
  if (!kb_isnan_f(r)) return r;
  if (kb_isnan_f(x)) return kc_u2f(kc_f2u(x) | 0x00400000u);
  if (kb_isnan_f(y)) return kc_u2f(kc_f2u(y) | 0x00400000u);
  return kc_u2f(0xffc00000u); /* an invalid operation: x86's default NaN */
}

KERN_HD uint64_t kb_d2u(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

KERN_HD double kb_u2d(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

KERN_HD int kb_isnan_d(double x) {
  return (kb_d2u(x) & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}

KERN_HD double kb_x86_d(double x, double y, double r) {
  if (!kb_isnan_d(r)) return r;
  if (kb_isnan_d(x)) return kb_u2d(kb_d2u(x) | 0x0008000000000000ull);
  if (kb_isnan_d(y)) return kb_u2d(kb_d2u(y) | 0x0008000000000000ull);
  return kb_u2d(0xfff8000000000000ull);
}

/* ---- one element step: x OP PRE(y), then POST ---- */

#define KB_FP_STEP(NAME, C, X86)                             \
  KERN_HD C NAME(C x, C y, int op, unsigned fl, C s, C dv) { \
    if (fl & KB_PRE) y = X86(y, s, y * s);                   \
    C r = y;                                                 \
    if (op == KB_SUM) r = X86(x, y, x + y);                  \
    if (op == KB_PROD) r = X86(x, y, x * y);                 \
    if (op == KB_MAX) r = x > y ? x : y;                     \
    if (op == KB_MIN) r = x < y ? x : y;                     \
    if (fl & KB_POST) r = X86(r, dv, r / dv);                \
    return r;                                                \
  }
KB_FP_STEP(kb_step_f, float, kb_x86_f)
KB_FP_STEP(kb_step_d, double, kb_x86_d)

/* Integers wrap in the unsigned type U; the division uses the wider DV. */
#define KB_INT_STEP(NAME, T, U, DV)                           \
  KERN_HD T NAME(T x, T y, int op, unsigned fl, T s, DV dv) { \
    if (fl & KB_PRE) y = (T)(U)((U)y * (U)s);                 \
    T r = y;                                                  \
    if (op == KB_SUM) r = (T)(U)((U)x + (U)y);                \
    if (op == KB_PROD) r = (T)(U)((U)x * (U)y);               \
    if (op == KB_MAX) r = x > y ? x : y;                      \
    if (op == KB_MIN) r = x < y ? x : y;                      \
    if (fl & KB_POST) r = (T)(r / dv);                        \
    return r;                                                 \
  }
KB_INT_STEP(kb_step_i8, int8_t, uint8_t, int64_t)
KB_INT_STEP(kb_step_u8, uint8_t, uint8_t, uint32_t)
KB_INT_STEP(kb_step_i32, int32_t, uint32_t, int64_t)
KB_INT_STEP(kb_step_u32, uint32_t, uint32_t, uint32_t)
KB_INT_STEP(kb_step_i64, int64_t, uint64_t, int64_t)
KB_INT_STEP(kb_step_u64, uint64_t, uint64_t, uint64_t)

/* ---- the fast path: one chain step on 16 bytes through the hardware ---- */

/* One step on float lanes as the GPU computes it, without x86's NaN rules:
 * a number comes out with Braid's bits. Sum and product pass a NaN on to
 * the result, which the caller tests; max and min may drop one, so they
 * flag a NaN operand in *odd. */
#define KB_FAST_STEP(NAME, C, NAN2, ADD, MUL, DIV)                      \
  KERN_HD C NAME(C x, C y, int op, unsigned fl, C s, C dv, int* odd) {  \
    if (fl & KB_PRE) y = MUL(y, s);                                     \
    C r = y;                                                            \
    if (op == KB_SUM) r = ADD(x, y);                                    \
    if (op == KB_PROD) r = MUL(x, y);                                   \
    if (op == KB_MAX || op == KB_MIN) {                                 \
      *odd |= NAN2(x, y);                                               \
      r = (op == KB_MAX ? x > y : x < y) ? x : y; /* never fmax/fmin */ \
    }                                                                   \
    if (fl & KB_POST) r = DIV(r, dv);                                   \
    return r;                                                           \
  }
KB_FAST_STEP(kb_fstep, float, kb_nan2_f, kb_hw_fadd, kb_hw_fmul, kb_hw_fdiv)
KB_FAST_STEP(kb_dstep, double, kb_nan2_d, kb_hw_dadd, kb_hw_dmul, kb_hw_ddiv)

/* for (i = 0; i < N; i++) BODY, unrolled on the GPU (arrays indexed by i
 * stay in registers); KB_LANES runs the lanes of a vector, l. The body is
 * the variadic rest, so that it may hold commas. */
#ifdef __CUDA_ARCH__
#define KB_UNROLLED(i, N, ...) _Pragma("unroll") for (int i = 0; i < (N); i++) __VA_ARGS__
#else
#define KB_UNROLLED(i, N, ...) \
  for (int i = 0; i < (N); i++) __VA_ARGS__
#endif
#define KB_LANES(V, ...) KB_UNROLLED(l, V, __VA_ARGS__)
/* A loop the GPU compiler must not unroll: its body is large, and
 * unrolled for every type it costs the build minutes. */
#ifdef __CUDA_ARCH__
#define KB_ROLLED _Pragma("unroll 1")
#else
#define KB_ROLLED
#endif

/*
 * The vector steps: *a = ST(STEP(LD(*a), LD(y), op, fl, s, dv)) on every
 * lane of 16 bytes, each lane rounded to the type as the chain stores it.
 * They return nonzero where max or min saw a NaN operand; the caller tests
 * the result for NaN lanes too, and either sends the vector to the exact
 * path (kern_convert.h's conversions, x86's NaN rules).
 */
KERN_HD int kb_v_f32(struct kb_v16* a, struct kb_v16 y, int op, unsigned fl, float s, float dv) {
  int odd = 0;
  KB_LANES(4, a->w[l] = kc_f2u(kb_fstep(kc_u2f(a->w[l]), kc_u2f(y.w[l]), op, fl, s, dv, &odd)));
  return odd;
}

KERN_HD int kb_v_f64(struct kb_v16* a, struct kb_v16 y, int op, unsigned fl, double s, double dv) {
  double x[2], v[2];
  int odd = 0;
  memcpy(x, a->w, 16), memcpy(v, y.w, 16);
  KB_LANES(2, x[l] = kb_dstep(x[l], v[l], op, fl, s, dv, &odd));
  memcpy(a->w, x, 16);
  return odd;
}

/* half and bf16: a plain sum or product on the hardware's pairs (its
 * results are widen-op-narrow's), anything else lane by lane in float. */
#define KB_V16BIT(NAME, WIDEN, NARROW, ADD2, MUL2)                                                 \
  KERN_HD int NAME(struct kb_v16* a, struct kb_v16 y, int op, unsigned fl, float s, float dv) {    \
    int odd = 0;                                                                                   \
    if (fl == 0 && op == KB_SUM) {                                                                 \
      KB_LANES(4, a->w[l] = ADD2(a->w[l], y.w[l]));                                                \
      return 0;                                                                                    \
    }                                                                                              \
    if (fl == 0 && op == KB_PROD) {                                                                \
      KB_LANES(4, a->w[l] = MUL2(a->w[l], y.w[l]));                                                \
      return 0;                                                                                    \
    }                                                                                              \
    KB_LANES(4, {                                                                                  \
      float lo = kb_fstep(WIDEN(a->w[l] & 0xffffu), WIDEN(y.w[l] & 0xffffu), op, fl, s, dv, &odd); \
      float hi = kb_fstep(WIDEN(a->w[l] >> 16), WIDEN(y.w[l] >> 16), op, fl, s, dv, &odd);         \
      a->w[l] = NARROW(lo, hi);                                                                    \
    });                                                                                            \
    return odd;                                                                                    \
  }
KB_V16BIT(kb_v_f16, kb_hw_h2f, kb_hw_f2h2, kb_hw_hadd2, kb_hw_hmul2)
KB_V16BIT(kb_v_bf16, kb_hw_bf2f, kb_hw_f2bf2, kb_hw_bfadd2, kb_hw_bfmul2)

/* fp8, four lanes per 32-bit word: widened to floats (w8), narrowed (n8),
 * and a plain sum (s8): through half pairs where the conversion
 * instructions exist (exact: the GPU facts' "sum via half"), with
 * kern_convert.h's integer code on sm_80. */
#if KB_HW_FP8
#define KB_F8_CONV(T)                                                  \
  KERN_HD void kb_w8_##T(uint32_t w, float* f) {                       \
    uint32_t h0, h1;                                                   \
    kb_hw_##T##x4_h2(w, &h0, &h1);                                     \
    f[0] = kb_hw_h2f(h0 & 0xffffu), f[1] = kb_hw_h2f(h0 >> 16);        \
    f[2] = kb_hw_h2f(h1 & 0xffffu), f[3] = kb_hw_h2f(h1 >> 16);        \
  }                                                                    \
  KERN_HD uint32_t kb_n8_##T(const float* f) {                         \
    return kb_hw_f4_##T##x4(f);                                        \
  }                                                                    \
  KERN_HD uint32_t kb_s8_##T(uint32_t a, uint32_t b) {                 \
    uint32_t a0, a1, b0, b1;                                           \
    kb_hw_##T##x4_h2(a, &a0, &a1), kb_hw_##T##x4_h2(b, &b0, &b1);      \
    return kb_hw_h2_##T##x4(kb_hw_hadd2(a0, b0), kb_hw_hadd2(a1, b1)); \
  }
#else
#define KB_F8_CONV(T)                                             \
  KERN_HD void kb_w8_##T(uint32_t w, float* f) {                  \
    KB_LANES(4, f[l] = kc_##T##_to_float((uint8_t)(w >> 8 * l))); \
  }                                                               \
  KERN_HD uint32_t kb_n8_##T(const float* f) {                    \
    uint32_t w = 0;                                               \
    KB_LANES(4, w |= (uint32_t)kc_float_to_##T(f[l]) << 8 * l);   \
    return w;                                                     \
  }                                                               \
  KERN_HD uint32_t kb_s8_##T(uint32_t a, uint32_t b) {            \
    float x[4], y[4];                                             \
    kb_w8_##T(a, x), kb_w8_##T(b, y);                             \
    KB_LANES(4, x[l] = kb_hw_fadd(x[l], y[l]));                   \
    return kb_n8_##T(x);                                          \
  }
#endif

#define KB_V8(T)                                                                        \
  KB_F8_CONV(T)                                                                         \
  KERN_HD int kb_v_##T(struct kb_v16* a, struct kb_v16 y, int op, unsigned fl, float s, \
                       float dv) {                                                      \
    int odd = 0;                                                                        \
    if (fl == 0 && op == KB_SUM) {                                                      \
      KB_LANES(4, a->w[l] = kb_s8_##T(a->w[l], y.w[l]));                                \
      return 0;                                                                         \
    }                                                                                   \
    KB_UNROLLED(q, 4, {                                                                 \
      float x[4], v[4];                                                                 \
      kb_w8_##T(a->w[q], x), kb_w8_##T(y.w[q], v);                                      \
      KB_LANES(4, x[l] = kb_fstep(x[l], v[l], op, fl, s, dv, &odd));                    \
      a->w[q] = kb_n8_##T(x);                                                           \
    });                                                                                 \
    return odd;                                                                         \
  }
KB_V8(e4m3)
KB_V8(e5m2)

/* Integers: the reference step is the hardware's own; a plain int8 or
 * uint8 sum adds four bytes per word (the top bits apart: no carry
 * crosses a byte). Integers have no NaN: nothing is flagged. */
KERN_HD uint32_t kb_add_u8x4(uint32_t a, uint32_t b) {
  return ((a & 0x7f7f7f7fu) + (b & 0x7f7f7f7fu)) ^ ((a ^ b) & 0x80808080u);
}

#define KB_VINT(NAME, T, DV, STEP)                                                       \
  KERN_HD int NAME(struct kb_v16* a, struct kb_v16 y, int op, unsigned fl, T s, DV dv) { \
    enum { V = 16 / sizeof(T) };                                                         \
    if (V == 16 && fl == 0 && op == KB_SUM) {                                            \
      KB_LANES(4, a->w[l] = kb_add_u8x4(a->w[l], y.w[l]));                               \
      return 0;                                                                          \
    }                                                                                    \
    T x[V], v[V];                                                                        \
    memcpy(x, a->w, 16), memcpy(v, y.w, 16);                                             \
    KB_LANES(V, x[l] = STEP(x[l], v[l], op, fl, s, dv));                                 \
    memcpy(a->w, x, 16);                                                                 \
    return 0;                                                                            \
  }
KB_VINT(kb_v_i8, int8_t, int64_t, kb_step_i8)
KB_VINT(kb_v_u8, uint8_t, uint32_t, kb_step_u8)
KB_VINT(kb_v_i32, int32_t, int64_t, kb_step_i32)
KB_VINT(kb_v_u32, uint32_t, uint32_t, kb_step_u32)
KB_VINT(kb_v_i64, int64_t, int64_t, kb_step_i64)
KB_VINT(kb_v_u64, uint64_t, uint64_t, kb_step_u64)

KERN_HD int kb_nan_none(struct kb_v16 v) {
  (void)v;
  return 0;
}

/* ---- the loops of one type ---- */

#define KB_ID(v) (v)

/* Out of line on the GPU: the NaN fix-up runs where a NaN is, and inlined
 * its registers would count against every vector. The CPU grid emulation
 * counts its calls (KB_FIXUP_HOOK), so the tests see that they reach it. */
#ifdef __CUDACC__
#define KB_COLD static __host__ __device__ __noinline__
#else
#define KB_COLD static
#endif
#ifndef KB_FIXUP_HOOK
#define KB_FIXUP_HOOK() ((void)0)
#endif

/* Where the 16-byte path can start: elements before the first 16-byte
 * boundary when every pointer of the task sits at the same offset from
 * one (an element size apart), else -1 (all elements go one by one). */
KERN_HD int64_t kb_vec_head(const struct kern_dev_task* t, unsigned es) {
  uintptr_t mis = (uintptr_t)t->srcs[0] & 15u;
  for (int k = 1; k < t->nsrcs; k++)
    if (((uintptr_t)t->srcs[k] & 15u) != mis) return -1;
  for (int d = 0; d < t->ndsts; d++)
    if (((uintptr_t)t->dsts[d] & 15u) != mis) return -1;
  if (mis % es) return -1;
  uint64_t head = mis ? (16u - mis) / es : 0u;
  return (int64_t)(head < t->n ? head : t->n);
}

/*
 * The canonical tree over n sources (t->tree: the deterministic mode's
 * order, docs/determinism.md): pairs first, each combine the lower block's
 * value OP the upper's, rounded to the type. Leaf k joins the pending
 * blocks as a binary counter's carry (kb_pend[j] holds the value of 2^j
 * leaves, bit j of the leaves so far), and the blocks still pending at the
 * end combine from the smallest up, each the right operand: a block with
 * an empty upper half stays as it is. The root's combine, always the last
 * made, carries the division (avg). VAL is the value's type; LEAF sets kb_x
 * to leaf kb_k (multiplied on its own where it is pre-multiplied); COMB
 * sets kb_l to kb_l OP kb_r, with flags kb_f. With 3 sources or fewer the
 * tree is the chain.
 *
 * Every type's loops inline it, so its code is kept small: the loops stay
 * rolled (KB_ROLLED), LEAF and COMB appear once, and kb_pend, read and
 * written through constant indexes (KB_PEND_GET, KB_PEND_SET), lives in
 * registers. (Unrolled over 16 leaves it cost the kernels' build a factor
 * of 10.) The vector loop that runs it is out of line and the element one
 * inline: the other two ways cost the by-value kernel 130 registers, past
 * the 128 at which two blocks of 256 threads still fit an SM.
 */
#define KB_PEND_GET(j)     \
  ((j) == 0   ? kb_pend[0] \
   : (j) == 1 ? kb_pend[1] \
   : (j) == 2 ? kb_pend[2] \
   : (j) == 3 ? kb_pend[3] \
              : kb_pend[4])
#define KB_PEND_SET(j, v) KB_UNROLLED(kb_i, 5, if (kb_i == (j)) kb_pend[kb_i] = (v))
#define KB_TREE(VAL, n, post, LEAF, COMB, out)                                                     \
  do {                                                                                             \
    VAL kb_pend[5];                                                                                \
    memset(kb_pend, 0, sizeof kb_pend);                                                            \
    VAL kb_x = kb_pend[0], kb_l = kb_x, kb_r = kb_x;                                               \
    unsigned kb_f = 0u;                                                                            \
    int kb_done = 0;                                                                               \
    /* pass k < n: leaf k, its carries over the trailing ones of k; pass n: the */                 \
    /* blocks of n's bits above its lowest (kb_x) on kb_x's left */                                \
    KB_ROLLED for (int kb_k = 0; kb_k <= (n); kb_k++) {                                            \
      unsigned kb_s =                                                                              \
          kb_k < (n) ? (unsigned)kb_k & ~(unsigned)(kb_k + 1) : (unsigned)(n) & (unsigned)((n)-1); \
      int kb_j = 0;                                                                                \
      if (kb_k < (n)) LEAF;                                                                        \
      KB_ROLLED for (; (kb_s >> kb_j) != 0u; kb_j++) {                                             \
        if (!((kb_s >> kb_j) & 1u)) continue;                                                      \
        kb_l = KB_PEND_GET(kb_j), kb_r = kb_x;                                                     \
        kb_f = ++kb_done == (n)-1 ? (post) : 0u;                                                   \
        COMB;                                                                                      \
        kb_x = kb_l;                                                                               \
      }                                                                                            \
      if (kb_k < (n)) KB_PEND_SET(kb_j, kb_x);                                                     \
    }                                                                                              \
    out = kb_x;                                                                                    \
  } while (0)

/* Whether the task's sources take the tree (above) rather than the chain:
 * only where the two differ. */
KERN_HD int kb_tree(const struct kern_dev_task* t) {
  return t->tree && t->nsrcs > 3;
}

/*
 * Element i of the task: the chain over the sources, or their tree
 * (kb_tree), stored as T after every step, widened by LD, narrowed by ST,
 * computed in SC with x86's NaN rules (the exact path). In the chain the
 * first source alone is pre-multiplied and, when it is the only one,
 * divided. VSTEP and NANV are the fast path
 * on 16 bytes (above); a vector with a NaN goes through NAME##_fix.
 */
#define KB_ELEM(NAME, T, SC, DV, LD, ST, STEP, VSTEP, NANV)                                        \
  /* The tree (kb_tree) over one element's sources (KB_TREE). */                                   \
  KERN_HD T NAME##_tree(const struct kern_dev_task* t, const T* v, SC s, DV dv) {                  \
    unsigned post = t->post ? KB_POST : 0u;                                                        \
    T acc;                                                                                         \
    KB_TREE(T, t->nsrcs, post,                                                                     \
            kb_x = ((t->pre >> kb_k) & 1u)                                                         \
                       ? ST(STEP(LD(v[kb_k]), LD(v[kb_k]), KB_COPY, KB_PRE, s, dv))                \
                       : v[kb_k],                                                                  \
            kb_l = ST(STEP(LD(kb_l), LD(kb_r), t->op, kb_f, s, dv)), acc);                         \
    return acc;                                                                                    \
  }                                                                                                \
  KERN_HD T NAME##_chain(const struct kern_dev_task* t, const T* v, SC s, DV dv) {                 \
    unsigned post = t->post ? KB_POST : 0u;                                                        \
    unsigned f0 = ((t->pre & 1u) ? KB_PRE : 0u) | (t->nsrcs == 1 ? post : 0u);                     \
    T acc = v[0];                                                                                  \
    if (kb_tree(t)) return NAME##_tree(t, v, s, dv);                                               \
    if (f0) acc = ST(STEP(LD(acc), LD(acc), KB_COPY, f0, s, dv));                                  \
    for (int k = 1; k < t->nsrcs; k++) {                                                           \
      unsigned f = (((t->pre >> k) & 1u) ? KB_PRE : 0u) | (k == t->nsrcs - 1 ? post : 0u);         \
      acc = ST(STEP(LD(acc), LD(v[k]), t->op, f, s, dv));                                          \
    }                                                                                              \
    return acc;                                                                                    \
  }                                                                                                \
  /* Elements [lo, hi), this thread's share (first, first + stride, ...). */                       \
  KERN_HD void NAME##_scalar(const struct kern_dev_task* t, SC s, DV dv, uint64_t lo, uint64_t hi, \
                             uint64_t first, uint64_t stride) {                                    \
    T v[KB_MAX_SRCS];                                                                              \
    for (uint64_t i = lo + first; i < hi; i += stride) {                                           \
      for (int k = 0; k < t->nsrcs; k++)                                                           \
        memcpy(&v[k], (const char*)t->srcs[k] + i * sizeof(T), sizeof(T));                         \
      T acc = NAME##_chain(t, v, s, dv);                                                           \
      for (int d = 0; d < t->ndsts; d++)                                                           \
        memcpy((char*)t->dsts[d] + i * sizeof(T), &acc, sizeof acc);                               \
    }                                                                                              \
  }                                                                                                \
  /* The exact path for the vectors of `mask` (bit l: the V elements from  */                      \
  /* i + l * step), which the fast path left unstored: each element reads   */                     \
  /* its sources before it writes, so a destination may be a source. */                            \
  KB_COLD void NAME##_fix(const struct kern_dev_task* t, SC s, DV dv, uint64_t i, uint64_t step,   \
                          unsigned mask) {                                                         \
    for (unsigned l = 0; mask; l++, mask >>= 1) {                                                  \
      if (!(mask & 1u)) continue;                                                                  \
      KB_FIXUP_HOOK();                                                                             \
      NAME##_scalar(t, s, dv, i + l * step, i + l * step + 16 / sizeof(T), 0, 1);                  \
    }                                                                                              \
  }                                                                                                \
  /* Whole 16-byte vectors from element `head` on, two per thread per pass  */                     \
  /* (its j and j + stride) so that twice the loads are in flight: one      */                     \
  /* 16-byte load per source and store per destination each; the two step  */                      \
  /* through the chain together, and a NaN sends one to the exact path. */                         \
  KERN_HD void NAME##_vector(const struct kern_dev_task* t, SC s, DV dv, uint64_t head,            \
                             uint64_t nvec, uint64_t first, uint64_t stride) {                     \
    enum { V = 16 / sizeof(T) };                                                                   \
    unsigned post = t->post ? KB_POST : 0u;                                                        \
    unsigned f0 = ((t->pre & 1u) ? KB_PRE : 0u) | (t->nsrcs == 1 ? post : 0u);                     \
    const char* s0 = (const char*)t->srcs[0] + head * sizeof(T);                                   \
    for (uint64_t j = first; j < nvec; j += 2 * stride) {                                          \
      int two = j + stride < nvec;                                                                 \
      uint64_t o0 = j * 16, o1 = two ? o0 + stride * 16 : o0; /* lone: a spare copy */             \
      struct kb_v16 a0 = kb_ld16(s0 + o0), a1 = kb_ld16(s0 + o1);                                  \
      int odd0 = 0, odd1 = 0;                                                                      \
      if (f0) {                                                                                    \
        odd0 = VSTEP(&a0, a0, KB_COPY, f0, s, dv);                                                 \
        odd1 = VSTEP(&a1, a1, KB_COPY, f0, s, dv);                                                 \
      }                                                                                            \
      for (int k = 1; k < t->nsrcs; k++) {                                                         \
        unsigned f = (((t->pre >> k) & 1u) ? KB_PRE : 0u) | (k == t->nsrcs - 1 ? post : 0u);       \
        const char* sk = (const char*)t->srcs[k] + head * sizeof(T);                               \
        struct kb_v16 y0 = kb_ld16(sk + o0), y1 = kb_ld16(sk + o1);                                \
        odd0 |= VSTEP(&a0, y0, t->op, f, s, dv);                                                   \
        odd1 |= VSTEP(&a1, y1, t->op, f, s, dv);                                                   \
      }                                                                                            \
      if (f0 || t->nsrcs > 1) { /* a plain copy moves NaNs as they are */                          \
        odd0 |= NANV(a0), odd1 = two && (odd1 | NANV(a1));                                         \
      }                                                                                            \
      for (int d = 0; d < t->ndsts; d++) {                                                         \
        char* dst = (char*)t->dsts[d] + head * sizeof(T);                                          \
        if (!odd0) kb_st16(dst + o0, a0);                                                          \
        if (two && !odd1) kb_st16(dst + o1, a1);                                                   \
      }                                                                                            \
      if (odd0 | odd1)                                                                             \
        NAME##_fix(t, s, dv, head + j * V, stride * V, (odd0 ? 1u : 0u) | (odd1 ? 2u : 0u));       \
    }                                                                                              \
  }                                                                                                \
  /* The tree's vectors (kb_tree), one per thread per pass; a NaN sends   */                       \
  /* one to the exact path, as in the chain's loop. Out of line: one copy */                       \
  /* a type. */                                                                                    \
  KB_COLD void NAME##_tree_vector(const struct kern_dev_task* t, SC s, DV dv, uint64_t head,       \
                                  uint64_t nvec, uint64_t first, uint64_t stride) {                \
    enum { V = 16 / sizeof(T) };                                                                   \
    unsigned post = t->post ? KB_POST : 0u;                                                        \
    for (uint64_t j = first; j < nvec; j += stride) {                                              \
      uint64_t o = head * sizeof(T) + j * 16;                                                      \
      int odd = 0;                                                                                 \
      struct kb_v16 acc;                                                                           \
      KB_TREE(struct kb_v16, t->nsrcs, post,                                                       \
              (kb_x = kb_ld16((const char*)t->srcs[kb_k] + o),                                     \
               odd |= ((t->pre >> kb_k) & 1u) ? VSTEP(&kb_x, kb_x, KB_COPY, KB_PRE, s, dv) : 0),   \
              odd |= VSTEP(&kb_l, kb_r, t->op, kb_f, s, dv), acc);                                 \
      odd |= NANV(acc);                                                                            \
      for (int d = 0; d < t->ndsts && !odd; d++) kb_st16((char*)t->dsts[d] + o, acc);              \
      if (odd) NAME##_fix(t, s, dv, head + j * V, 0, 1u);                                          \
    }                                                                                              \
  }                                                                                                \
  /* The everyday call (a received partial and a local slice summed into  */                       \
  /* one output, no premul, no division; other operators take the vector  */                       \
  /* loop, which keeps the kernel's size and build time down): four       */                       \
  /* vectors in flight per thread, all loads issued before any arithmetic,*/                       \
  /* one test for a NaN in each. */                                                                \
  KERN_HD void NAME##_pair(const struct kern_dev_task* t, uint64_t head, uint64_t nvec,            \
                           uint64_t first, uint64_t stride) {                                      \
    enum { V = 16 / sizeof(T), U = 4 };                                                            \
    const int op = KB_SUM;                                                                         \
    const char* a = (const char*)t->srcs[0] + head * sizeof(T);                                    \
    const char* b = (const char*)t->srcs[1] + head * sizeof(T);                                    \
    char* out = (char*)t->dsts[0] + head * sizeof(T);                                              \
    SC s0 = 0;                                                                                     \
    DV d0 = 1;                                                                                     \
    /* Every pass has U vectors in flight, the last one too: a lane past   */                      \
    /* the end loads lane 0's vector again (a spare copy) and stores      */                       \
    /* nothing. (The thread's last vectors taken one at a time, with two  */                       \
    /* loads in flight, are the suspect for every type at 0.79 of the     */                       \
    /* copy on the H200, 2026-11-27: to be timed on the next GPU.)        */                       \
    for (uint64_t j = first; j < nvec; j += U * stride) {                                          \
      struct kb_v16 x[U], y[U];                                                                    \
      uint64_t o[U];                                                                               \
      unsigned live = 0, mask = 0;                                                                 \
      KB_LANES(U, {                                                                                \
        int in = j + l * stride < nvec;                                                            \
        o[l] = (in ? j + l * stride : j) * 16;                                                     \
        live |= (unsigned)in << l;                                                                 \
      });                                                                                          \
      KB_LANES(U, x[l] = kb_ld16(a + o[l]), y[l] = kb_ld16(b + o[l]));                             \
      KB_LANES(U, if (VSTEP(&x[l], y[l], op, 0u, s0, d0) | NANV(x[l])) mask |= 1u << l);           \
      mask &= live;                                                                                \
      KB_LANES(U, if (((live & ~mask) >> l) & 1u) kb_st16(out + o[l], x[l]));                      \
      if (mask) NAME##_fix(t, s0, d0, head + j * V, stride * V, mask);                             \
    }                                                                                              \
  }                                                                                                \
  KERN_HD void NAME(const struct kern_dev_task* t, SC s, DV dv, uint64_t first, uint64_t stride) { \
    int64_t head = kb_vec_head(t, sizeof(T));                                                      \
    if (head < 0) {                                                                                \
      NAME##_scalar(t, s, dv, 0, t->n, first, stride);                                             \
      return;                                                                                      \
    }                                                                                              \
    uint64_t nvec = (t->n - (uint64_t)head) / (16 / sizeof(T));                                    \
    uint64_t tail = (uint64_t)head + nvec * (16 / sizeof(T));                                      \
    NAME##_scalar(t, s, dv, 0, (uint64_t)head, first, stride);                                     \
    if (kb_tree(t))                                                                                \
      NAME##_tree_vector(t, s, dv, (uint64_t)head, nvec, first, stride);                           \
    else if (t->nsrcs == 2 && t->ndsts == 1 && t->pre == 0 && !t->post && t->op == KB_SUM)         \
      NAME##_pair(t, (uint64_t)head, nvec, first, stride);                                         \
    else                                                                                           \
      NAME##_vector(t, s, dv, (uint64_t)head, nvec, first, stride);                                \
    NAME##_scalar(t, s, dv, tail, t->n, first, stride);                                            \
  }

KB_ELEM(kb_loop_i8, int8_t, int8_t, int64_t, KB_ID, KB_ID, kb_step_i8, kb_v_i8, kb_nan_none)
KB_ELEM(kb_loop_u8, uint8_t, uint8_t, uint32_t, KB_ID, KB_ID, kb_step_u8, kb_v_u8, kb_nan_none)
KB_ELEM(kb_loop_i32, int32_t, int32_t, int64_t, KB_ID, KB_ID, kb_step_i32, kb_v_i32, kb_nan_none)
KB_ELEM(kb_loop_u32, uint32_t, uint32_t, uint32_t, KB_ID, KB_ID, kb_step_u32, kb_v_u32, kb_nan_none)
KB_ELEM(kb_loop_i64, int64_t, int64_t, int64_t, KB_ID, KB_ID, kb_step_i64, kb_v_i64, kb_nan_none)
KB_ELEM(kb_loop_u64, uint64_t, uint64_t, uint64_t, KB_ID, KB_ID, kb_step_u64, kb_v_u64, kb_nan_none)
KB_ELEM(kb_loop_f32, float, float, float, KB_ID, KB_ID, kb_step_f, kb_v_f32, kb_nan_f32x4)
KB_ELEM(kb_loop_f64, double, double, double, KB_ID, KB_ID, kb_step_d, kb_v_f64, kb_nan_f64x2)
KB_ELEM(kb_loop_f16, uint16_t, float, float, kc_half_to_float, kc_float_to_half, kb_step_f,
        kb_v_f16, kb_nan_f16x8)
KB_ELEM(kb_loop_bf16, uint16_t, float, float, kc_bf16_to_float, kc_float_to_bf16, kb_step_f,
        kb_v_bf16, kb_nan_bf16x8)
KB_ELEM(kb_loop_e4m3, uint8_t, float, float, kc_e4m3_to_float, kc_float_to_e4m3, kb_step_f,
        kb_v_e4m3, kb_nan_f8x16)
KB_ELEM(kb_loop_e5m2, uint8_t, float, float, kc_e5m2_to_float, kc_float_to_e5m2, kb_step_f,
        kb_v_e5m2, kb_nan_f8x16)

/* The premul factor of a float-computed type, widened exactly. */
KERN_HD float kb_scalar_f(const struct kern_dev_task* t) {
  uint32_t u32 = (uint32_t)t->scalar;
  switch (t->type) {
    case KB_FLOAT:
      return kc_u2f(u32);
    case KB_HALF:
      return kc_half_to_float((uint16_t)u32);
    case KB_BF16:
      return kc_bf16_to_float((uint16_t)u32);
    case KB_E4M3:
      return kc_e4m3_to_float((uint8_t)u32);
    default:
      return kc_e5m2_to_float((uint8_t)u32);
  }
}

/* Thread `first` of `stride` threads: its share of the task (one row). */
KERN_HD void kern_dev_task_run(const struct kern_dev_task* t, uint64_t first, uint64_t stride) {
  uint32_t div = t->postdiv ? t->postdiv : 1u;
  uint64_t sc = t->scalar;
  switch (t->type) {
    case KB_INT8:
      kb_loop_i8(t, (int8_t)sc, (int64_t)div, first, stride);
      break;
    case KB_UINT8:
      kb_loop_u8(t, (uint8_t)sc, div, first, stride);
      break;
    case KB_INT32:
      kb_loop_i32(t, (int32_t)(uint32_t)sc, (int64_t)div, first, stride);
      break;
    case KB_UINT32:
      kb_loop_u32(t, (uint32_t)sc, div, first, stride);
      break;
    case KB_INT64:
      kb_loop_i64(t, (int64_t)sc, (int64_t)div, first, stride);
      break;
    case KB_UINT64:
      kb_loop_u64(t, sc, div, first, stride);
      break;
    case KB_DOUBLE:
      kb_loop_f64(t, kb_u2d(sc), (double)div, first, stride);
      break;
    case KB_FLOAT:
      kb_loop_f32(t, kb_scalar_f(t), (float)div, first, stride);
      break;
    case KB_HALF:
      kb_loop_f16(t, kb_scalar_f(t), (float)div, first, stride);
      break;
    case KB_BF16:
      kb_loop_bf16(t, kb_scalar_f(t), (float)div, first, stride);
      break;
    case KB_E4M3:
      kb_loop_e4m3(t, kb_scalar_f(t), (float)div, first, stride);
      break;
    case KB_E5M2:
      kb_loop_e5m2(t, kb_scalar_f(t), (float)div, first, stride);
      break;
    default:
      break;
  }
}

/* Rows: braid_reduce_copy_at runs the task once per row, each row's
 * operands moved on from the first's (one inlined body, whatever the
 * rows; the by-value kernel runs one task of one row, and a synchronous
 * call makes each row on the host: algorithms/direct.c's
 * direct_task_row, the same rule on the plan's form). A row is r rows on, or as many as a table
 * says (algorithms/ direct.h: columns not evenly spaced), a table's negative entry no row; a spread
 * task's row r takes its source r alone (a copy) or writes its destination r alone (a node's ranks,
 * each a buffer of its own). */
KERN_HD uint32_t kern_dev_task_rows(const struct kern_dev_task* t) {
  return t->rows > 1 ? t->rows : 1u;
}

/* Row r of t into *row; 0 where there is none. */
KERN_HD int kern_dev_task_row(const struct kern_dev_task* t, uint32_t r,
                              struct kern_dev_task* row) {
  int64_t si = t->src_at ? (int64_t)t->src_at[r] : (int64_t)r;
  int64_t di = t->dst_at ? (int64_t)t->dst_at[r] : (int64_t)r;
  *row = *t;
  row->rows = 1;
  row->src_at = row->dst_at = 0;
  row->spread = 0;
  if (si < 0 || di < 0) return 0;
  if (t->spread & KB_SPREAD_SRCS) { /* a row past the sources is none */
    if (r >= (uint32_t)t->nsrcs || r >= KB_MAX_SRCS) return 0;
    row->nsrcs = 1;
    row->srcs[0] = t->srcs[r];
    row->pre = (t->pre >> r) & 1u;
  }
  if (t->spread & KB_SPREAD_DSTS) {
    if (r >= (uint32_t)t->ndsts || r >= KB_MAX_DSTS) return 0;
    row->ndsts = 1;
    row->dsts[0] = t->dsts[r];
  }
  for (int k = 0; k < row->nsrcs && k < KB_MAX_SRCS; k++)
    row->srcs[k] = (const char*)row->srcs[k] + si * t->src_row;
  for (int d = 0; d < row->ndsts && d < KB_MAX_DSTS; d++)
    row->dsts[d] = (char*)row->dsts[d] + di * t->dst_row;
  return 1;
}

/* A task read from memory at run time rather than passed at the launch
 * (braid_reduce_copy_at): word by word through volatile loads, since the
 * host wrote it into mapped memory after the launch was queued, and no
 * cached copy of an earlier use may be seen. */
KERN_HD void kern_dev_task_load(struct kern_dev_task* t, const struct kern_dev_task* at) {
  const volatile uint64_t* from = (const volatile uint64_t*)at;
  uint64_t* to = (uint64_t*)t;
  for (unsigned i = 0; i < sizeof(*t) / sizeof(uint64_t); i++) to[i] = from[i];
}

#endif /* BRAID_KERN_BODY_H_ */
