/*
 * Kernel entry points: the ISA dispatch (picked once, BRAID_KERNEL_ISA can
 * force it) and the portable C loops, used as fallback and for SIMD tails.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kern_dispatch.h"
#include "param.h" /* common/: kernels may read their knob from the one table */

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

enum { ISA_PORTABLE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_COUNT = 3 };
static const char* const isa_names[ISA_COUNT] = {"portable", "avx2", "avx512"};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static unsigned isa_avail; /* bit i set: path i runs on this CPU */
static int isa_best;
/* Relaxed is enough: set in isa_init (ordered by pthread_once) or by the
 * single-threaded test hook. */
static atomic_int isa_cur;
/* Out-of-place destinations from this size on get non-temporal stores: they
 * would push everything else out of the last-level cache and would not stay
 * there for the next step anyway; streaming saves the read-for-ownership of
 * dst, a quarter of the traffic of an out-of-place reduction. */
static atomic_size_t nt_threshold;

/* fp8 widening tables; the portable loops index them instead of decoding. */
static float lut_e4m3[256], lut_e5m2[256];

#if defined(__x86_64__) || defined(__i386__)
/* CPUID directly: clang's __builtin_cpu_supports does not know "f16c". The
 * OS side (saved YMM state) is covered by the "avx2" check. */
static int cpu_has_f16c(void) {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static unsigned cpu_isas(void) {
  unsigned m = 1u << ISA_PORTABLE;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  /* FMA is only checked because the file is compiled with -mfma. */
  if (__builtin_cpu_supports("avx2") && cpu_has_f16c() && __builtin_cpu_supports("fma"))
    m |= 1u << ISA_AVX2;
  /* VL and DQ: the AVX-512 file is compiled with them, so the compiler may
   * emit them anywhere in it. */
  if ((m & (1u << ISA_AVX2)) && __builtin_cpu_supports("avx512f") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    m |= 1u << ISA_AVX512;
#endif
  return m;
}

static int isa_lookup(const char* name) {
  for (int i = 0; i < ISA_COUNT; i++)
    if (strcmp(name, isa_names[i]) == 0) return i;
  return -1;
}

/* The L3 size (sysconf may be missing or wrong under VMs, hence the clamp);
 * in a multi-rank node the ranks share it, so keep to the lower end. */
static size_t default_nt_threshold(void) {
  long l3 = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
  size_t t = l3 > 0 ? (size_t)l3 : (size_t)16 << 20;
  if (t < (size_t)4 << 20) t = (size_t)4 << 20;
  if (t > (size_t)32 << 20) t = (size_t)32 << 20;
  return t;
}

static void isa_init(void) {
  for (int v = 0; v < 256; v++) {
    lut_e4m3[v] = kern_e4m3_to_float((uint8_t)v);
    lut_e5m2[v] = kern_e5m2_to_float((uint8_t)v);
  }
  isa_avail = cpu_isas();
  isa_best = ISA_PORTABLE;
  for (int i = 0; i < ISA_COUNT; i++)
    if (isa_avail & (1u << i)) isa_best = i;
  int cur = isa_best;
  /* An unknown name, or a path this CPU lacks, keeps the best one. */
  const char* env = param_kernel_isa();
  int want = env ? isa_lookup(env) : -1;
  if (want >= 0 && (isa_avail & (1u << want))) cur = want;
  atomic_store_explicit(&isa_cur, cur, memory_order_relaxed);
  atomic_store_explicit(&nt_threshold, default_nt_threshold(), memory_order_relaxed);
}

static int isa_get(void) {
  pthread_once(&isa_once, isa_init);
  return atomic_load_explicit(&isa_cur, memory_order_relaxed);
}

int kern_force_isa(const char* name) {
  pthread_once(&isa_once, isa_init);
  int want = name ? isa_lookup(name) : isa_best;
  if (want < 0 || !(isa_avail & (1u << want))) return 0;
  atomic_store_explicit(&isa_cur, want, memory_order_relaxed);
  return 1;
}

size_t kern_set_nt_threshold(size_t bytes) {
  pthread_once(&isa_once, isa_init);
  return atomic_exchange_explicit(&nt_threshold, bytes, memory_order_relaxed);
}

const char* kern_isa_name(void) {
  return isa_names[isa_get()];
}

size_t kern_type_size(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

float kern_scalar_f32(const struct kern_redop* r) {
  /* The type's encoding sits in the first bytes of `scalar`. */
  float f;
  uint16_t h;
  uint8_t q;
  memcpy(&f, &r->scalar, sizeof f);
  memcpy(&h, &r->scalar, sizeof h);
  memcpy(&q, &r->scalar, sizeof q);
  switch (r->type) {
    case ncclFloat32:
      return f;
    case ncclFloat16:
      return kern_half_to_float(h);
    case ncclBfloat16:
      return kern_bf16_to_float(h);
    case ncclFloat8e4m3:
      return kern_e4m3_to_float(q);
    case ncclFloat8e5m2:
      return kern_e5m2_to_float(q);
    default:
      return 0.0f;
  }
}

/* ---- Portable element expressions ---------------------------------------- */

/*
 * One element of a float or double reduction. When `x` (or, for the premul,
 * the data operand) is NaN the result is that NaN quieted (x + x), as x86
 * gives for the left operand; spelled out because compilers may swap the
 * operands of + and *, which would change the payload when both are NaN.
 * The _nansel helper selects with integer masks: gcc will not if-convert
 * (so not vectorize) a float compare-and-select under -ftrapping-math, the
 * default.
 * The max/min forms are exactly what maxps/minps compute.
 */
#define DEF_FP_EXPR(NAME, C, U, ABS, INF)                         \
  KERN_INLINE C NAME##_nansel(C x, C r) {                         \
    C q = x + x;                                                  \
    U xb, qb, rb;                                                 \
    memcpy(&xb, &x, sizeof xb);                                   \
    memcpy(&qb, &q, sizeof qb);                                   \
    memcpy(&rb, &r, sizeof rb);                                   \
    U m = (U)0 - (U)((xb & (ABS)) > (INF)); /* all ones if NaN */ \
    rb = (rb & ~m) | (qb & m);                                    \
    memcpy(&r, &rb, sizeof r);                                    \
    return r;                                                     \
  }                                                               \
  KERN_INLINE C NAME(C x, C y, int op, unsigned fl, C s, C dv) {  \
    if (fl & KERN_PRE) y = NAME##_nansel(y, y * s);               \
    C r = y;                                                      \
    if (op == KERN_SUM) r = NAME##_nansel(x, x + y);              \
    if (op == KERN_PROD) r = NAME##_nansel(x, x * y);             \
    if (op == KERN_MAX) r = x > y ? x : y;                        \
    if (op == KERN_MIN) r = x < y ? x : y;                        \
    if (fl & KERN_POST) r = r / dv;                               \
    return r;                                                     \
  }

DEF_FP_EXPR(expr_f32, float, uint32_t, 0x7fffffffu, 0x7f800000u)
DEF_FP_EXPR(expr_f64, double, uint64_t, 0x7fffffffffffffffull, 0x7ff0000000000000ull)

/* Integer element: sum/prod/premul wrap in the unsigned type U (no signed
 * overflow UB); the division uses the wider DV so a postdiv above the
 * type's range still divides as the positive number it is. */
#define DEF_INT_EXPR(NAME, T, U, DV)                              \
  KERN_INLINE T NAME(T x, T y, int op, unsigned fl, T s, DV dv) { \
    if (fl & KERN_PRE) y = (T)(U)((U)y * (U)s);                   \
    T r = y;                                                      \
    if (op == KERN_SUM) r = (T)(U)((U)x + (U)y);                  \
    if (op == KERN_PROD) r = (T)(U)((U)x * (U)y);                 \
    if (op == KERN_MAX) r = x > y ? x : y;                        \
    if (op == KERN_MIN) r = x < y ? x : y;                        \
    if (fl & KERN_POST) r = (T)(r / dv);                          \
    return r;                                                     \
  }

DEF_INT_EXPR(expr_i8, int8_t, uint8_t, int64_t)
DEF_INT_EXPR(expr_u8, uint8_t, uint8_t, uint32_t)
DEF_INT_EXPR(expr_i32, int32_t, uint32_t, int64_t)
DEF_INT_EXPR(expr_u32, uint32_t, uint32_t, uint32_t)
DEF_INT_EXPR(expr_i64, int64_t, uint64_t, int64_t)
DEF_INT_EXPR(expr_u64, uint64_t, uint64_t, uint64_t)

#define LD_ID(v) (v)
#define ST_ID(v) (v)
#define LD_E4M3(v) lut_e4m3[v]
#define LD_E5M2(v) lut_e5m2[v]

/*
 * The portable loop for storage type T: blocks of 64 bytes of every source
 * are copied into local arrays, so the compiler sees no aliasing between the
 * destinations and the sources (a destination may equal a source) and
 * vectorizes the fixed-size inner loops; memcpy also makes any byte
 * alignment of the buffers legal. The chain of kernels.h runs on the block
 * (stored as T after every step: that is the rounding of a chain), then the
 * block goes to every destination. The rest goes one element at a time.
 * With ns, nd and pre constant (KERN_DEF_SHAPES) the source loop folds
 * away; the pair shape is exactly dst = EXPR(a, b, op, fl).
 */
#define DEF_PORTABLE(NAME, T, SC, DV, LD, ST, EXPR)                                              \
  KERN_INLINE T NAME##_first(T x, unsigned f0, SC s, DV dv) {                                    \
    return f0 ? (T)ST(EXPR(LD(x), LD(x), KERN_OP_COPY, f0, s, dv)) : x;                          \
  }                                                                                              \
  KERN_INLINE size_t NAME(int op, unsigned fl, int ns, int nd, unsigned pre, void* const* dp,    \
                          const void* const* sp, size_t off, size_t n, SC s, DV dv) {            \
    enum { B = 64 / sizeof(T) };                                                                 \
    const char* src[KERN_TASK_MAX_SRCS];                                                         \
    char* dst[KERN_TASK_MAX_DSTS];                                                               \
    for (int k = 0; k < ns; k++) src[k] = (const char*)sp[k] + off * sizeof(T);                  \
    for (int k = 0; k < nd; k++) dst[k] = (char*)dp[k] + off * sizeof(T);                        \
    unsigned pm = (fl & KERN_PRE) ? pre : 0u, post = fl & KERN_POST;                             \
    unsigned sw = pre >> KERN_SWAP_SHIFT;                                                        \
    unsigned f0 = ((pm & 1u) ? KERN_PRE : 0u) | (ns == 1 ? post : 0u);                           \
    size_t i = 0;                                                                                \
    for (; i + B <= n; i += B) {                                                                 \
      T acc[B], tb[B];                                                                           \
      memcpy(acc, src[0] + i * sizeof(T), sizeof acc);                                           \
      if (f0)                                                                                    \
        for (size_t j = 0; j < B; j++) acc[j] = NAME##_first(acc[j], f0, s, dv);                 \
      for (int k = 1; k < ns; k++) {                                                             \
        unsigned last = k == ns - 1 ? post : 0u;                                                 \
        unsigned f = (((pm >> k) & 1u) ? KERN_PRE : 0u) | last;                                  \
        memcpy(tb, src[k] + i * sizeof(T), sizeof tb);                                           \
        if ((sw >> k) & 1u)                                                                      \
          for (size_t j = 0; j < B; j++)                                                         \
            acc[j] = ST(EXPR(LD(tb[j]), LD(acc[j]), op, last, s, dv));                           \
        else                                                                                     \
          for (size_t j = 0; j < B; j++) acc[j] = ST(EXPR(LD(acc[j]), LD(tb[j]), op, f, s, dv)); \
      }                                                                                          \
      for (int d = 0; d < nd; d++) memcpy(dst[d] + i * sizeof(T), acc, sizeof acc);              \
    }                                                                                            \
    for (; i < n; i++) {                                                                         \
      T x, y;                                                                                    \
      memcpy(&x, src[0] + i * sizeof(T), sizeof x);                                              \
      x = NAME##_first(x, f0, s, dv);                                                            \
      for (int k = 1; k < ns; k++) {                                                             \
        unsigned last = k == ns - 1 ? post : 0u;                                                 \
        unsigned f = (((pm >> k) & 1u) ? KERN_PRE : 0u) | last;                                  \
        memcpy(&y, src[k] + i * sizeof(T), sizeof y);                                            \
        x = (sw >> k) & 1u ? ST(EXPR(LD(y), LD(x), op, last, s, dv))                             \
                           : ST(EXPR(LD(x), LD(y), op, f, s, dv));                               \
      }                                                                                          \
      for (int d = 0; d < nd; d++) memcpy(dst[d] + i * sizeof(T), &x, sizeof x);                 \
    }                                                                                            \
    return n;                                                                                    \
  }

DEF_PORTABLE(loop_i8, int8_t, int8_t, int64_t, LD_ID, ST_ID, expr_i8)
DEF_PORTABLE(loop_u8, uint8_t, uint8_t, uint32_t, LD_ID, ST_ID, expr_u8)
DEF_PORTABLE(loop_i32, int32_t, int32_t, int64_t, LD_ID, ST_ID, expr_i32)
DEF_PORTABLE(loop_u32, uint32_t, uint32_t, uint32_t, LD_ID, ST_ID, expr_u32)
DEF_PORTABLE(loop_i64, int64_t, int64_t, int64_t, LD_ID, ST_ID, expr_i64)
DEF_PORTABLE(loop_u64, uint64_t, uint64_t, uint64_t, LD_ID, ST_ID, expr_u64)
DEF_PORTABLE(loop_f32, float, float, float, LD_ID, ST_ID, expr_f32)
DEF_PORTABLE(loop_f64, double, double, double, LD_ID, ST_ID, expr_f64)
DEF_PORTABLE(loop_f16, uint16_t, float, float, kern_half_to_float, kern_float_to_half, expr_f32)
DEF_PORTABLE(loop_bf16, uint16_t, float, float, kern_bf16_to_float, kern_float_to_bf16, expr_f32)
DEF_PORTABLE(loop_e4m3, uint8_t, float, float, LD_E4M3, kern_float_to_e4m3, expr_f32)
DEF_PORTABLE(loop_e5m2, uint8_t, float, float, LD_E5M2, kern_float_to_e5m2, expr_f32)

/* Each type's shapes (KERN_DEF_SHAPES): loop_T_shapes(c, off, n, s, dv). */
KERN_DEF_SHAPES(loop_i8, int8_t, int64_t, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_u8, uint8_t, uint32_t, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_i32, int32_t, int64_t, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_u32, uint32_t, uint32_t, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_i64, int64_t, int64_t, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_u64, uint64_t, uint64_t, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_f32, float, float, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_f64, double, double, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_f16, float, float, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_bf16, float, float, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_e4m3, float, float, KERN_SPEC_OP_PLAIN)
KERN_DEF_SHAPES(loop_e5m2, float, float, KERN_SPEC_OP_PLAIN)

/* One case of kern_portable for an integer type: the scalar is the type's
 * own bytes. */
#define INT_CASE(TYPE, LOOP, T, DV)        \
  case TYPE: {                             \
    T sc;                                  \
    memcpy(&sc, &c->r->scalar, sizeof sc); \
    LOOP##_shapes(c, off, n, sc, (DV)div); \
    break;                                 \
  }

#define F32_CASE(TYPE, LOOP)                                     \
  case TYPE:                                                     \
    LOOP##_shapes(c, off, n, kern_scalar_f32(c->r), (float)div); \
    break;

void kern_portable(const struct kern_call* c, size_t off, size_t n) {
  uint32_t div = kern_divisor(c->r);
  switch (c->r->type) {
    INT_CASE(ncclInt8, loop_i8, int8_t, int64_t)
    INT_CASE(ncclUint8, loop_u8, uint8_t, uint32_t)
    INT_CASE(ncclInt32, loop_i32, int32_t, int64_t)
    INT_CASE(ncclUint32, loop_u32, uint32_t, uint32_t)
    INT_CASE(ncclInt64, loop_i64, int64_t, int64_t)
    INT_CASE(ncclUint64, loop_u64, uint64_t, uint64_t)
    F32_CASE(ncclFloat32, loop_f32)
    F32_CASE(ncclFloat16, loop_f16)
    F32_CASE(ncclBfloat16, loop_bf16)
    F32_CASE(ncclFloat8e4m3, loop_e4m3)
    F32_CASE(ncclFloat8e5m2, loop_e5m2)
    case ncclFloat64:
      loop_f64_shapes(c, off, n, kern_scalar_f64(c->r), (double)div);
      break;
    default:
      break;
  }
}

/* ---- Dispatch ------------------------------------------------------------- */

/* In place (a destination is a source) the lines are in cache already
 * (just read): streaming them out costs more than writing them back, so
 * only out-of-place calls stream. */
static int call_in_place(const struct kern_call* c) {
  for (int j = 0; j < c->nd; j++)
    for (int k = 0; k < c->ns; k++)
      if (c->dst[j] == c->src[k]) return 1;
  return 0;
}

static void run(const struct kern_call* c) {
  size_t done = 0;
  int isa = isa_get();
  int nt = !call_in_place(c) &&
           c->n * c->es >= atomic_load_explicit(&nt_threshold, memory_order_relaxed);
  if (isa == ISA_AVX512) done = kern_simd_avx512(c, nt);
  if (isa == ISA_AVX2) done = kern_simd_avx2(c, nt);
  if (done < c->n) kern_portable(c, done, c->n - done);
}

void kern_reduce(const struct kern_redop* r, unsigned flags, void* dst, const void* a,
                 const void* b, size_t n) {
  size_t es = r ? kern_type_size(r->type) : 0;
  if (n == 0 || es == 0 || (unsigned)r->op > KERN_MIN) return;
  const void* src[2] = {a, b};
  struct kern_call c = {r, (int)r->op, flags & KERN_FLAG_MASK, 2u, 2, 1, n, es, src, &dst, 0u};
  run(&c);
}

void kern_unary(const struct kern_redop* r, unsigned flags, void* dst, const void* src, size_t n) {
  size_t es = r ? kern_type_size(r->type) : 0;
  if (n == 0 || es == 0) return;
  flags &= KERN_FLAG_MASK;
  if (flags == 0) {
    if (dst != src) memcpy(dst, src, n * es);
    return;
  }
  struct kern_call c = {r, KERN_OP_COPY, flags, 1u, 1, 1, n, es, &src, &dst, 0u};
  run(&c);
}

/* Bytes per element of a valid task, 0 for an invalid one. */
static size_t task_elem_bytes(const struct kern_task* t) {
  if (t->nsrcs < 1 || t->nsrcs > KERN_TASK_MAX_SRCS) return 0;
  if (t->ndsts < 1 || t->ndsts > KERN_TASK_MAX_DSTS) return 0;
  if (t->nsrcs > 1 && (unsigned)t->redop.op > KERN_MIN) return 0;
  return kern_type_size(t->redop.type);
}

void kern_task_run(const struct kern_task* t) {
  size_t es = t ? task_elem_bytes(t) : 0;
  if (es == 0 || t->n == 0) return;
  unsigned pre = t->pre & ((1u << t->nsrcs) - 1u);
  struct kern_call c = {&t->redop,
                        t->nsrcs == 1 ? KERN_OP_COPY : (int)t->redop.op,
                        (t->flags & KERN_POST) | (pre ? KERN_PRE : 0u),
                        pre,
                        t->nsrcs,
                        t->ndsts,
                        t->n,
                        es,
                        t->srcs,
                        t->dsts,
                        t->swap & ((1u << t->nsrcs) - 2u)};
  if (c.ns == 1 && c.fl == 0) { /* a copy: bits as they are, never through float */
    if (c.nd == 1 && c.dst[0] != c.src[0]) memcpy(c.dst[0], c.src[0], c.n * c.es);
    if (c.nd > 1) kern_portable(&c, 0, c.n); /* a block at a time to every destination */
    return;
  }
  run(&c);
}
