/*
 * The body of the fused reduce-copy kernel: one source that nvcc compiles
 * for the GPU (kernels/cuda/reduce.cu) and the host compiler for the CPU
 * grid emulation the tests and the simulated driver run (tests/common).
 *
 * A task is kernels.h's kern_task in device form: up to 8 sources chained
 * (each step rounded to the type, as a chain of ranks does), the result
 * written to up to 8 destinations, optionally repeated on evenly spaced
 * rows (one launch for Hier's node stages, whose blocks are strided). The
 * results are bitwise those of the CPU kernels: the same order of
 * operations, no fused multiply-add (nvcc -fmad=false, host
 * -ffp-contract=off), the conversions of kern_convert.h, and x86's NaN
 * rules written out, since a GPU's arithmetic returns a canonical NaN
 * where x86 keeps an operand's payload: a NaN operand wins,
 * the left one first, quieted; an invalid operation (inf - inf, 0 * inf)
 * gives x86's default NaN, negative; max and min are x > y ? x : y and
 * x < y ? x : y, never fmaxf/fminf (docs/gpu-validation.md).
 */
#ifndef BRAID_KERN_BODY_H_
#define BRAID_KERN_BODY_H_

#include <stdint.h>
#include <string.h>

#include "kern_convert.h"

#define KB_MAX_SRCS 8
#define KB_MAX_DSTS 8

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
  uint32_t rows;   /* 0 or 1: one; else the task again on each row r < rows, */
  int64_t src_row; /* every source src_row bytes further on per row */
  int64_t dst_row; /* and every destination dst_row bytes (kern_dev_task_rows) */
  const void* srcs[KB_MAX_SRCS];
  void* dsts[KB_MAX_DSTS];
};

/* ---- x86's NaN rules ---- */

KERN_HD int kb_isnan_f(float x) {
  return (kc_f2u(x) & 0x7fffffffu) > 0x7f800000u;
}

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

/* ---- the loops of one type ---- */

#define KB_ID(v) (v)

/* 16 bytes between memory and a local array: one 128-bit access on the
 * GPU (both sides 16-byte aligned), memcpy on the host. */
KERN_HD void kb_copy16(void* dst, const void* src) {
#ifdef __CUDA_ARCH__
  *(uint4*)dst = *(const uint4*)src;
#else
  memcpy(dst, src, 16);
#endif
}

/* for (i = 0; i < N; i++) BODY, unrolled on the GPU (arrays indexed by i
 * stay in registers); KB_LANES runs the lanes of a vector, l. */
#ifdef __CUDA_ARCH__
#define KB_UNROLLED(i, N, BODY) _Pragma("unroll") for (int i = 0; i < (N); i++) BODY
#else
#define KB_UNROLLED(i, N, BODY) \
  for (int i = 0; i < (N); i++) BODY
#endif
#define KB_LANES(V, BODY) KB_UNROLLED(l, V, BODY)

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
 * Element i of the task: the chain over the sources (stored as T after
 * every step), widened by LD, narrowed by ST, computed in SC. The first
 * source alone is pre-multiplied and, when it is the only one, divided.
 */
#define KB_ELEM(NAME, T, SC, DV, LD, ST, STEP)                                                     \
  KERN_HD T NAME##_chain(const struct kern_dev_task* t, const T* v, SC s, DV dv) {                 \
    unsigned post = t->post ? KB_POST : 0u;                                                        \
    unsigned f0 = ((t->pre & 1u) ? KB_PRE : 0u) | (t->nsrcs == 1 ? post : 0u);                     \
    T acc = v[0];                                                                                  \
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
  /* Whole 16-byte vectors from element `head` on, two per thread per pass (its   */               \
  /* j and j + stride) so that twice the loads are in flight: one 16-byte load per */              \
  /* source and store per destination each; the lanes step through the chain     */                \
  /* together, in arrays indexed only by the unrolled lane (registers).           */               \
  KERN_HD void NAME##_vector(const struct kern_dev_task* t, SC s, DV dv, uint64_t head,            \
                             uint64_t nvec, uint64_t first, uint64_t stride) {                     \
    enum { V = 16 / sizeof(T) };                                                                   \
    unsigned post = t->post ? KB_POST : 0u;                                                        \
    unsigned f0 = ((t->pre & 1u) ? KB_PRE : 0u) | (t->nsrcs == 1 ? post : 0u);                     \
    for (uint64_t j = first; j < nvec; j += 2 * stride) {                                          \
      uint64_t off0 = (head + j * V) * sizeof(T);                                                  \
      uint64_t off1 = (head + (j + stride) * V) * sizeof(T);                                       \
      int two = j + stride < nvec;                                                                 \
      T a0[V], a1[V], y0[V], y1[V];                                                                \
      kb_copy16(a0, (const char*)t->srcs[0] + off0);                                               \
      kb_copy16(a1, (const char*)t->srcs[0] + (two ? off1 : off0)); /* lone: a spare copy */       \
      if (f0) {                                                                                    \
        KB_LANES(V, a0[l] = ST(STEP(LD(a0[l]), LD(a0[l]), KB_COPY, f0, s, dv)));                   \
        KB_LANES(V, a1[l] = ST(STEP(LD(a1[l]), LD(a1[l]), KB_COPY, f0, s, dv)));                   \
      }                                                                                            \
      for (int k = 1; k < t->nsrcs; k++) {                                                         \
        unsigned f = (((t->pre >> k) & 1u) ? KB_PRE : 0u) | (k == t->nsrcs - 1 ? post : 0u);       \
        kb_copy16(y0, (const char*)t->srcs[k] + off0);                                             \
        kb_copy16(y1, (const char*)t->srcs[k] + (two ? off1 : off0));                              \
        KB_LANES(V, a0[l] = ST(STEP(LD(a0[l]), LD(y0[l]), t->op, f, s, dv)));                      \
        KB_LANES(V, a1[l] = ST(STEP(LD(a1[l]), LD(y1[l]), t->op, f, s, dv)));                      \
      }                                                                                            \
      for (int d = 0; d < t->ndsts; d++) {                                                         \
        kb_copy16((char*)t->dsts[d] + off0, a0);                                                   \
        if (two) kb_copy16((char*)t->dsts[d] + off1, a1);                                          \
      }                                                                                            \
    }                                                                                              \
  }                                                                                                \
  /* The everyday call (a received partial and a local slice into one output, */                   \
  /* no premul, no division): four vectors in flight per thread, all loads   */                    \
  /* issued before any arithmetic. The same chain, so the same bits. */                            \
  KERN_HD void NAME##_pair(const struct kern_dev_task* t, uint64_t head, uint64_t nvec,            \
                           uint64_t first, uint64_t stride) {                                      \
    enum { V = 16 / sizeof(T), U = 4 };                                                            \
    const char *a = (const char*)t->srcs[0], *b = (const char*)t->srcs[1];                         \
    char* out = (char*)t->dsts[0];                                                                 \
    SC s0 = 0;                                                                                     \
    DV d0 = 1;                                                                                     \
    for (uint64_t j = first; j < nvec; j += U * stride) {                                          \
      T x[U][V], y[U][V];                                                                          \
      KB_LANES(U, {                                                                                \
        uint64_t jj = j + (uint64_t)l * stride < nvec ? j + (uint64_t)l * stride : j;              \
        kb_copy16(x[l], a + (head + jj * V) * sizeof(T));                                          \
        kb_copy16(y[l], b + (head + jj * V) * sizeof(T));                                          \
      });                                                                                          \
      KB_UNROLLED(u, U,                                                                            \
                  KB_LANES(V, x[u][l] = ST(STEP(LD(x[u][l]), LD(y[u][l]), t->op, 0u, s0, d0))));   \
      KB_LANES(U, {                                                                                \
        uint64_t jj = j + (uint64_t)l * stride;                                                    \
        if (jj < nvec) kb_copy16(out + (head + jj * V) * sizeof(T), x[l]);                         \
      });                                                                                          \
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
    if (t->nsrcs == 2 && t->ndsts == 1 && t->pre == 0 && !t->post)                                 \
      NAME##_pair(t, (uint64_t)head, nvec, first, stride);                                         \
    else                                                                                           \
      NAME##_vector(t, s, dv, (uint64_t)head, nvec, first, stride);                                \
    NAME##_scalar(t, s, dv, tail, t->n, first, stride);                                            \
  }

KB_ELEM(kb_loop_i8, int8_t, int8_t, int64_t, KB_ID, KB_ID, kb_step_i8)
KB_ELEM(kb_loop_u8, uint8_t, uint8_t, uint32_t, KB_ID, KB_ID, kb_step_u8)
KB_ELEM(kb_loop_i32, int32_t, int32_t, int64_t, KB_ID, KB_ID, kb_step_i32)
KB_ELEM(kb_loop_u32, uint32_t, uint32_t, uint32_t, KB_ID, KB_ID, kb_step_u32)
KB_ELEM(kb_loop_i64, int64_t, int64_t, int64_t, KB_ID, KB_ID, kb_step_i64)
KB_ELEM(kb_loop_u64, uint64_t, uint64_t, uint64_t, KB_ID, KB_ID, kb_step_u64)
KB_ELEM(kb_loop_f32, float, float, float, KB_ID, KB_ID, kb_step_f)
KB_ELEM(kb_loop_f64, double, double, double, KB_ID, KB_ID, kb_step_d)
KB_ELEM(kb_loop_f16, uint16_t, float, float, kc_half_to_float, kc_float_to_half, kb_step_f)
KB_ELEM(kb_loop_bf16, uint16_t, float, float, kc_bf16_to_float, kc_float_to_bf16, kb_step_f)
KB_ELEM(kb_loop_e4m3, uint8_t, float, float, kc_e4m3_to_float, kc_float_to_e4m3, kb_step_f)
KB_ELEM(kb_loop_e5m2, uint8_t, float, float, kc_e5m2_to_float, kc_float_to_e5m2, kb_step_f)

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

/* Rows: braid_reduce_copy_at runs the task once per row, moving every
 * pointer on by one row in between (one inlined body, whatever the rows;
 * the by-value kernel runs one row, and its host side launches each). */
KERN_HD uint32_t kern_dev_task_rows(const struct kern_dev_task* t) {
  return t->rows > 1 ? t->rows : 1u;
}

KERN_HD void kern_dev_task_next_row(struct kern_dev_task* t) {
  for (int k = 0; k < t->nsrcs && k < KB_MAX_SRCS; k++)
    t->srcs[k] = (const char*)t->srcs[k] + t->src_row;
  for (int d = 0; d < t->ndsts && d < KB_MAX_DSTS; d++) t->dsts[d] = (char*)t->dsts[d] + t->dst_row;
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
