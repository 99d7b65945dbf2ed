/*
 * Unit tests of the host reduction kernels: the narrow-float conversions
 * (exhaustive where possible) and every ISA path against a scalar reference.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <cpuid.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "cpu/kern_dispatch.h"

#define MAXN 4097
#define PAD 256    /* room for offsets and guard bytes around each buffer */
#define GUARD 64   /* bytes checked after the destination range */
#define FILL 0xA5  /* what untouched destination bytes hold */
#define REF_COPY 4 /* the reference's "operator" of kern_unary */

static uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
static uint64_t d2u(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}
static double u2d(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

/* xorshift64*: reproducible data for every path. */
static uint64_t rng_state;
static uint64_t rnd(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1Dull;
}

/* ======================= conversions ======================= */

static void test_half_exhaustive(void** state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kern_half_to_float((uint16_t)h);
    uint32_t e = (h >> 10) & 31, m = h & 1023, neg = h >> 15;
    if (e == 31 && m != 0) {
      if (!isnan(f)) fail_msg("half %04x: not NaN", h);
      /* widening keeps sign and payload exactly */
      assert_int_equal(f2u(f), (neg << 31) | 0x7f800000u | (m << 13));
      assert_int_equal(kern_float_to_half(f), h | 0x200); /* narrowing quiets */
      continue;
    }
    double want = e == 31 ? INFINITY : e ? ldexp(1024 + m, (int)e - 25) : ldexp(m, -24);
    if (neg) want = -want;
    if ((double)f != want || (signbit(f) != 0) != (neg != 0))
      fail_msg("half %04x -> %a, want %a", h, (double)f, want);
    assert_int_equal(kern_float_to_half(f), h);
  }
}

static void test_bf16_exhaustive(void** state) {
  (void)state;
  for (uint32_t h = 0; h < 65536; h++) {
    float f = kern_bf16_to_float((uint16_t)h);
    assert_int_equal(f2u(f), h << 16);
    int nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
    assert_int_equal(kern_float_to_bf16(f), nan ? (h | 0x40) : h);
  }
}

static void test_fp8_all(void** state) {
  (void)state;
  for (uint32_t v = 0; v < 256; v++) {
    uint32_t neg = v >> 7;
    /* e4m3: bias 7, no inf, only S.1111.111 is NaN */
    float f = kern_e4m3_to_float((uint8_t)v);
    uint32_t e = (v >> 3) & 15, m = v & 7;
    if ((v & 0x7f) == 0x7f) {
      if (!isnan(f) || (signbit(f) != 0) != (neg != 0)) fail_msg("e4m3 %02x not NaN", v);
    } else {
      double want = e ? ldexp(8 + m, (int)e - 10) : ldexp(m, -9);
      if ((double)f != (neg ? -want : want) || (signbit(f) != 0) != (neg != 0))
        fail_msg("e4m3 %02x -> %a", v, (double)f);
    }
    assert_int_equal(kern_float_to_e4m3(f), v);
    /* e5m2: bias 15, inf and NaN as in half */
    f = kern_e5m2_to_float((uint8_t)v);
    e = (v >> 2) & 31;
    m = v & 3;
    uint32_t back = v;
    if (e == 31 && m) {
      if (!isnan(f) || (signbit(f) != 0) != (neg != 0)) fail_msg("e5m2 %02x not NaN", v);
      back = (neg << 7) | 0x7f;
    } else {
      double want = e == 31 ? INFINITY : e ? ldexp(4 + m, (int)e - 17) : ldexp(m, -16);
      if ((double)f != (neg ? -want : want) || (signbit(f) != 0) != (neg != 0))
        fail_msg("e5m2 %02x -> %a", v, (double)f);
      if (e == 31) back = (neg << 7) | 0x7b; /* inf saturates */
    }
    assert_int_equal(kern_float_to_e5m2(f), back);
  }
}

/* A narrow format as the independent rounding reference sees it. */
struct fmt {
  const char* name;
  float (*widen)(uint32_t);
  uint32_t (*narrow)(float);
  uint32_t maxfin;                 /* largest finite magnitude encoding */
  uint32_t signbit;                /* sign bit of the encoding */
  int saturate;                    /* overflow gives maxfin, else maxfin + 1 (inf) */
  uint32_t (*nan)(uint32_t fbits); /* expected encoding of a float NaN */
};

static float w_half(uint32_t v) {
  return kern_half_to_float((uint16_t)v);
}
static float w_bf16(uint32_t v) {
  return kern_bf16_to_float((uint16_t)v);
}
static float w_e4m3(uint32_t v) {
  return kern_e4m3_to_float((uint8_t)v);
}
static float w_e5m2(uint32_t v) {
  return kern_e5m2_to_float((uint8_t)v);
}
static uint32_t n_half(float f) {
  return kern_float_to_half(f);
}
static uint32_t n_bf16(float f) {
  return kern_float_to_bf16(f);
}
static uint32_t n_e4m3(float f) {
  return kern_float_to_e4m3(f);
}
static uint32_t n_e5m2(float f) {
  return kern_float_to_e5m2(f);
}
static uint32_t nan_half(uint32_t x) {
  return ((x >> 16) & 0x8000) | 0x7e00 | ((x >> 13) & 0x3ff);
}
static uint32_t nan_bf16(uint32_t x) {
  return (x >> 16) | 0x40;
}
static uint32_t nan_fp8(uint32_t x) {
  return ((x >> 24) & 0x80) | 0x7f;
}

static const struct fmt fmts[] = {
    {"half", w_half, n_half, 0x7bff, 0x8000, 0, nan_half},
    {"bf16", w_bf16, n_bf16, 0x7f7f, 0x8000, 0, nan_bf16},
    {"e4m3", w_e4m3, n_e4m3, 0x7e, 0x80, 1, nan_fp8},
    {"e5m2", w_e5m2, n_e5m2, 0x7b, 0x80, 1, nan_fp8},
};

/* Nearest encoding, ties to the even one, by search over the format's
 * values (the widening is checked exhaustively above). */
static uint32_t ref_narrow(const struct fmt* F, float f) {
  uint32_t x = f2u(f);
  if (isnan(f)) return F->nan(x);
  uint32_t sign = signbit(f) ? F->signbit : 0, over = F->saturate ? F->maxfin : F->maxfin + 1;
  double a = fabs((double)f);
  if (isinf(f)) return sign | over;
  uint32_t lo = 0, hi = F->maxfin; /* largest k with value(k) <= a */
  while (lo < hi) {
    uint32_t mid = (lo + hi + 1) / 2;
    if ((double)F->widen(mid) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  double vlo = F->widen(lo);
  double vhi = lo < F->maxfin ? (double)F->widen(lo + 1)
                              : 2 * vlo - (double)F->widen(lo - 1); /* one more step */
  double dl = a - vlo, dh = vhi - a;
  uint32_t k = dl < dh ? lo : dh < dl ? lo + 1 : (lo & 1) ? lo + 1 : lo;
  if (k > F->maxfin) k = over;
  return sign | k;
}

static void check_narrow(const struct fmt* F, float f) {
  uint32_t got = F->narrow(f), want = ref_narrow(F, f);
  if (got != want)
    fail_msg("%s(%a = 0x%08x): got 0x%x want 0x%x", F->name, (double)f, f2u(f), got, want);
}

/* Every midpoint between neighbours (the RNE ties) and its float
 * neighbours, every exact value, both signs; then random floats. */
static void test_narrow_rne(void** state) {
  (void)state;
  rng_state = 0x1234567;
  for (size_t fi = 0; fi < sizeof fmts / sizeof fmts[0]; fi++) {
    const struct fmt* F = &fmts[fi];
    for (uint32_t k = 0; k <= F->maxfin; k++) {
      double v = F->widen(k);
      double next = k < F->maxfin ? (double)F->widen(k + 1) : 2 * v - (double)F->widen(k - 1);
      float mid = (float)((v + next) / 2);
      assert_true((double)mid == (v + next) / 2); /* exact in float */
      float pts[] = {(float)v, mid, nextafterf(mid, INFINITY), nextafterf(mid, 0)};
      for (int p = 0; p < 4; p++) {
        check_narrow(F, pts[p]);
        check_narrow(F, -pts[p]);
      }
    }
    for (int i = 0; i < 1 << 20; i++) check_narrow(F, u2f((uint32_t)rnd()));
    float edge[] = {INFINITY,  -INFINITY,  FLT_MAX,         -FLT_MAX,       1e30f,
                    0x1p-149f, -0x1p-149f, FLT_MIN,         0.0f,           -0.0f,
                    NAN,       -NAN,       u2f(0x7f800001), u2f(0xffbfffff)};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++) check_narrow(F, edge[i]);
  }
  /* A few ties spelled out, so a broken reference cannot hide them. */
  assert_int_equal(kern_float_to_half(1.0f + 0x1p-11f), 0x3c00);
  assert_int_equal(kern_float_to_half(1.0f + 0x3p-11f), 0x3c02);
  assert_int_equal(kern_float_to_half(65519.0f), 0x7bff);
  assert_int_equal(kern_float_to_half(65520.0f), 0x7c00);
  assert_int_equal(kern_float_to_half(0x1p-25f), 0x0000);
  assert_int_equal(kern_float_to_half(0x3p-25f), 0x0002);
  assert_int_equal(kern_float_to_half(-0x1p-24f), 0x8001);
  assert_int_equal(kern_float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  assert_int_equal(kern_float_to_bf16(1.0f + 0x3p-8f), 0x3f82);
  assert_int_equal(kern_float_to_bf16(FLT_MAX), 0x7f80);
  assert_int_equal(kern_float_to_e4m3(448.0f), 0x7e);
  assert_int_equal(kern_float_to_e4m3(464.0f), 0x7e);
  assert_int_equal(kern_float_to_e4m3(-1e9f), 0xfe);
  assert_int_equal(kern_float_to_e4m3(INFINITY), 0x7e);
  assert_int_equal(kern_float_to_e4m3(-NAN), 0xff);
  assert_int_equal(kern_float_to_e4m3(0x1p-10f), 0x00);
  assert_int_equal(kern_float_to_e4m3(0x3p-10f), 0x02);
  assert_int_equal(kern_float_to_e5m2(-INFINITY), 0xfb);
  assert_int_equal(kern_float_to_e5m2(61440.0f), 0x7b);
  assert_int_equal(kern_float_to_e5m2(0x1p-17f), 0x00);
  assert_int_equal(kern_float_to_e5m2(0x3p-17f), 0x02);
}

/* ======================= reference reductions ======================= */

struct tinfo {
  ncclDataType_t type;
  const char* name;
  size_t size;
  int kind; /* 0 signed int, 1 unsigned int, 2 float-computed, 3 double */
};

static const struct tinfo types[] = {
    {ncclInt8, "int8", 1, 0},     {ncclUint8, "uint8", 1, 1},     {ncclInt32, "int32", 4, 0},
    {ncclUint32, "uint32", 4, 1}, {ncclInt64, "int64", 8, 0},     {ncclUint64, "uint64", 8, 1},
    {ncclFloat16, "half", 2, 2},  {ncclFloat32, "float", 4, 2},   {ncclFloat64, "double", 8, 3},
    {ncclBfloat16, "bf16", 2, 2}, {ncclFloat8e4m3, "e4m3", 1, 2}, {ncclFloat8e5m2, "e5m2", 1, 2},
};
#define NTYPES (sizeof types / sizeof types[0])
static const char* const op_names[] = {"sum", "prod", "max", "min", "unary"};

static uint64_t load_bits(const void* p, size_t size) {
  uint64_t v = 0;
  memcpy(&v, p, size); /* little-endian: low bytes */
  return v;
}
static uint64_t mask_of(size_t size) {
  return size == 8 ? ~0ull : (1ull << (8 * size)) - 1;
}
static int64_t sext(uint64_t v, size_t size) {
  unsigned sh = (unsigned)(64 - 8 * size);
  return (int64_t)(v << sh) >> sh;
}

/* Integers in 64 bits, truncated to the width at the end: wrap-around is
 * then just the mask, and the comparisons use the extended values. */
static uint64_t ref_int(const struct tinfo* t, int op, unsigned fl, uint64_t a, uint64_t b,
                        uint64_t s, uint32_t postdiv) {
  size_t z = t->size;
  uint64_t m = mask_of(z), y = fl & KERN_PRE ? (b * s) & m : b & m, r = y;
  int sg = t->kind == 0;
  int64_t xs = sext(a, z), ys = sext(y, z);
  uint64_t xu = a & m;
  if (op == KERN_SUM) r = (a + y) & m;
  if (op == KERN_PROD) r = (a * y) & m;
  if (op == KERN_MAX) r = sg ? (uint64_t)(xs > ys ? xs : ys) : (xu > y ? xu : y);
  if (op == KERN_MIN) r = sg ? (uint64_t)(xs < ys ? xs : ys) : (xu < y ? xu : y);
  if (fl & KERN_POST) {
    uint64_t d = postdiv ? postdiv : 1;
    r = sg ? (uint64_t)(sext(r & m, z) / (int64_t)d) : (r & m) / d;
  }
  return r & m;
}

/* Quieted NaN: what x86 arithmetic returns for a NaN operand. */
static float qf(float v) {
  return u2f(f2u(v) | 0x00400000u);
}
static double qd(double v) {
  return u2d(d2u(v) | 0x0008000000000000ull);
}

/* The documented NaN rule, written out: a NaN left operand wins, then a
 * NaN right operand; either comes back quieted with its payload. */
#define REF_FP(NAME, C, Q)                                            \
  static C NAME(C x, C y, int op, unsigned fl, C s, C dv) {           \
    C t = y, r;                                                       \
    if (fl & KERN_PRE) t = isnan(y) ? Q(y) : isnan(s) ? Q(s) : y * s; \
    switch (op) {                                                     \
      case KERN_SUM:                                                  \
        r = isnan(x) ? Q(x) : isnan(t) ? Q(t) : x + t;                \
        break;                                                        \
      case KERN_PROD:                                                 \
        r = isnan(x) ? Q(x) : isnan(t) ? Q(t) : x * t;                \
        break;                                                        \
      case KERN_MAX:                                                  \
        r = x > t ? x : t;                                            \
        break;                                                        \
      case KERN_MIN:                                                  \
        r = x < t ? x : t;                                            \
        break;                                                        \
      default:                                                        \
        r = t;                                                        \
    }                                                                 \
    if (fl & KERN_POST) r = isnan(r) ? Q(r) : r / dv;                 \
    return r;                                                         \
  }
REF_FP(ref_f32, float, qf)
REF_FP(ref_f64, double, qd)

static float widen(ncclDataType_t type, uint64_t v) {
  switch (type) {
    case ncclFloat16:
      return kern_half_to_float((uint16_t)v);
    case ncclBfloat16:
      return kern_bf16_to_float((uint16_t)v);
    case ncclFloat8e4m3:
      return kern_e4m3_to_float((uint8_t)v);
    case ncclFloat8e5m2:
      return kern_e5m2_to_float((uint8_t)v);
    default:
      return u2f((uint32_t)v);
  }
}

static uint64_t narrow(ncclDataType_t type, float f) {
  switch (type) {
    case ncclFloat16:
      return kern_float_to_half(f);
    case ncclBfloat16:
      return kern_float_to_bf16(f);
    case ncclFloat8e4m3:
      return kern_float_to_e4m3(f);
    case ncclFloat8e5m2:
      return kern_float_to_e5m2(f);
    default:
      return f2u(f);
  }
}

/* One element of dst = POST(a OP PRE(b)), element bits in and out. */
static uint64_t ref_elem(const struct tinfo* t, int op, unsigned fl, uint64_t a, uint64_t b,
                         uint64_t scalar, uint32_t postdiv) {
  uint32_t d = postdiv ? postdiv : 1;
  if (op == REF_COPY && fl == 0) return b; /* a plain copy, NaN bits and all */
  if (t->kind < 2) return ref_int(t, op, fl, a, b, scalar, postdiv);
  if (t->kind == 3) return d2u(ref_f64(u2d(a), u2d(b), op, fl, u2d(scalar), (double)d));
  float r = ref_f32(widen(t->type, a), widen(t->type, b), op, fl, widen(t->type, scalar), (float)d);
  return narrow(t->type, r);
}

/* ======================= test data ======================= */

static float gen_f32(float other, int have_other) {
  static const float special[] = {0.0f,       -0.0f,   INFINITY, -INFINITY, NAN,
                                  -NAN,       FLT_MAX, -FLT_MAX, FLT_MIN,   0x1p-149f,
                                  -0x1p-140f, 1.0f,    -1.0f,    3e38f,     1e-38f};
  uint64_t r = rnd();
  switch (r % 16) {
    case 0:
      return special[(r >> 8) % (sizeof special / sizeof special[0])];
    case 1: /* NaN with a random payload, sign, quiet bit */
      return u2f(0x7f800000u | (uint32_t)(r >> 32 & 0x807fffffu) | 1u);
    case 2:
      return u2f((uint32_t)(r >> 16));
    case 3:
      if (have_other) return other;
      break;
    case 4:
      if (have_other) return -other;
      break;
    case 5:
      return (float)((int64_t)(r >> 20) % 1000) * 0x1p-130f; /* subnormal results */
    default:
      break;
  }
  return (float)((int64_t)(r >> 16) % 20001 - 10000) / 64.0f;
}

static double gen_f64(double other, int have_other) {
  uint64_t r = rnd();
  switch (r % 16) {
    case 0:
      return (double)gen_f32(0, 0); /* specials, as double */
    case 1:
      return u2d(0x7ff0000000000000ull | (rnd() & 0x800fffffffffffffull) | 1u);
    case 2:
      return u2d(rnd());
    case 3:
      if (have_other) return other;
      break;
    case 4:
      if (have_other) return -other;
      break;
    case 5:
      return (double)((int64_t)(r >> 20) % 1000) * 0x1p-1070;
    default:
      break;
  }
  return (double)((int64_t)(r >> 16) % 2000001 - 1000000) / 1024.0;
}

/* Element i of a fresh array; `other` (may be NULL) offers ties with it. */
static uint64_t gen_elem(const struct tinfo* t, const uint8_t* other, size_t i) {
  size_t z = t->size;
  uint64_t o = other ? load_bits(other + i * z, z) : 0, r = rnd();
  if (other && r % 16 == 3) return o;
  if (t->kind == 3) return d2u(gen_f64(u2d(o), other != NULL));
  if (t->type == ncclFloat32) return f2u(gen_f32(u2f((uint32_t)o), other != NULL));
  if (t->kind == 2 && r % 4 == 1) return narrow(t->type, gen_f32(0, 0)); /* realistic values */
  if (t->kind < 2 && r % 16 == 5) { /* 0, -1 (all ones), signed min, signed max */
    uint64_t m = mask_of(z), ends[] = {0, m, 1ull << (8 * z - 1), m >> 1};
    return ends[(r >> 8) & 3];
  }
  return rnd() & mask_of(z);
}

/* The premul factor: a small list per type, rotated by the caller. */
static uint64_t pick_scalar(const struct tinfo* t, unsigned k) {
  static const float fl[] = {1.5f, -0.25f, 3.0f, -7.0f, 1e-3f, NAN, INFINITY, 0x1p-130f, -0.0f};
  static const uint64_t in[] = {3, ~0ull, 0, 127, 0x123456789ull, 0x80, 2};
  if (t->kind < 2) return in[k % 7] & mask_of(t->size);
  float f = fl[k % 9];
  if (t->kind == 3) return d2u(isnan(f) ? u2d(0x7ff4000000000123ull) : (double)f);
  if (isnan(f) && t->type == ncclFloat32) return 0x7fa00123u; /* signaling payload */
  if (isnan(f) && t->type == ncclFloat16) return 0x7d01;
  return narrow(t->type, f);
}

static const uint32_t divisors[] = {3, 1, 7, 0, 2, 0xffffffffu, 5, 1000};
static const size_t lens[] = {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 1000, 1023, MAXN};
#define NLENS (sizeof lens / sizeof lens[0])

/* Offsets of dst, a, b in elements, plus extra bytes to break alignment. */
static const struct {
  int de, ae, be, db, ab, bb;
} variants[] = {
    {0, 0, 0, 0, 0, 0}, {1, 2, 3, 0, 0, 0}, {3, 1, 0, 0, 0, 0}, {2, 3, 1, 0, 0, 0},
    {0, 1, 2, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, {0, 0, 0, 1, 2, 3}, {3, 2, 1, 3, 1, 2},
};
#define NVAR (sizeof variants / sizeof variants[0])

/* ======================= the comparison ======================= */

struct ctx {
  const char* path; /* ISA name */
  const char* mode; /* plain or nt stores */
  const struct tinfo* t;
  uint8_t *A, *B;        /* inputs at offset 0 */
  uint8_t* E;            /* expected result */
  uint8_t *ba, *bb, *bd; /* work buffers (MAXN elements + PAD) */
};

static void describe(char* s, size_t cap, const struct tinfo* t, const uint8_t* p) {
  uint64_t v = load_bits(p, t->size);
  int n = snprintf(s, cap, "0x%0*llx", (int)(2 * t->size), (unsigned long long)v);
  if (t->kind == 2) snprintf(s + n, cap - (size_t)n, "(%.9g)", (double)widen(t->type, v));
  if (t->kind == 3) snprintf(s + n, cap - (size_t)n, "(%.17g)", u2d(v));
}

/* Bitwise check of dst (at byte offset doff of bd) against E, and of the
 * guard bytes around it; the first mismatch fails the test. */
static void compare(const struct ctx* c, const char* what, int op, unsigned fl, size_t len, int var,
                    size_t doff, uint64_t scalar, uint32_t div) {
  size_t z = c->t->size;
  for (size_t i = 0; i < doff; i++)
    if (c->bd[i] != FILL) fail_msg("%s %s: wrote before dst (byte %zu)", c->path, what, i);
  for (size_t i = 0; i < GUARD; i++)
    if (c->bd[doff + len * z + i] != FILL)
      fail_msg("%s %s %s len=%zu: wrote past dst (byte %zu)", c->path, what, c->t->name, len, i);
  if (memcmp(c->bd + doff, c->E, len * z) == 0) return;
  size_t i = 0;
  while (memcmp(c->bd + doff + i * z, c->E + i * z, z) == 0) i++;
  char sa[64], sb[64], sg[64], sw[64], ss[64];
  describe(sa, sizeof sa, c->t, c->A + i * z);
  describe(sb, sizeof sb, c->t, c->B + i * z);
  describe(sg, sizeof sg, c->t, c->bd + doff + i * z);
  describe(sw, sizeof sw, c->t, c->E + i * z);
  describe(ss, sizeof ss, c->t, (const uint8_t*)&scalar);
  fail_msg(
      "MISMATCH path=%s/%s %s type=%s op=%s flags=%u len=%zu variant=%d index=%zu: a=%s "
      "b=%s scalar=%s postdiv=%u got=%s want=%s",
      c->path, c->mode, what, c->t->name, op_names[op], fl, len, var, i, sa, sb, ss, div, sg, sw);
}

static size_t off_of(int elems, int bytes, size_t z) {
  return (size_t)elems * z + (size_t)bytes;
}

/* kern_reduce (op < REF_COPY) or kern_unary on every offset variant, then
 * in place. E must hold the expected result. */
static void run_case(const struct ctx* c, int op, unsigned fl, size_t len, uint64_t scalar,
                     uint32_t div) {
  size_t z = c->t->size, bytes = len * z;
  struct kern_redop r = {c->t->type, op == REF_COPY ? KERN_SUM : (enum kern_op)op, scalar, div};
  for (int v = 0; v < (int)NVAR + 2; v++) {
    int var = v < (int)NVAR ? v : v - (int)NVAR; /* the last two: in place */
    size_t doff = off_of(variants[var].de, variants[var].db, z);
    size_t aoff = off_of(variants[var].ae, variants[var].ab, z);
    size_t boff = off_of(variants[var].be, variants[var].bb, z);
    memset(c->bd, FILL, doff + bytes + GUARD);
    memcpy(c->ba + aoff, c->A, bytes);
    memcpy(c->bb + boff, c->B, bytes);
    const void *pa = c->ba + aoff, *pb = c->bb + boff;
    const char* what = "out of place";
    if (v == NVAR) { /* dst == a (unary: dst == src) */
      memcpy(c->bd + doff, op == REF_COPY ? c->B : c->A, bytes);
      pa = c->bd + doff;
      if (op == REF_COPY) pb = pa;
      what = "in place dst==a";
    } else if (v == NVAR + 1) { /* dst == b */
      memcpy(c->bd + doff, c->B, bytes);
      pb = c->bd + doff;
      what = "in place dst==b";
    }
    if (op == REF_COPY)
      kern_unary(&r, fl, c->bd + doff, pb, len);
    else
      kern_reduce(&r, fl, c->bd + doff, pa, pb, len);
    compare(c, what, op, fl, len, var, doff, scalar, div);
  }
}

static void run_type(struct ctx* c) {
  size_t z = c->t->size;
  rng_state = 0x9E3779B97F4A7C15ull ^ (uint64_t)c->t->type; /* same data on every path */
  for (size_t i = 0; i < MAXN; i++) {
    uint64_t a = gen_elem(c->t, NULL, i);
    memcpy(c->A + i * z, &a, z);
  }
  for (size_t i = 0; i < MAXN; i++) {
    uint64_t b = gen_elem(c->t, c->A, i);
    memcpy(c->B + i * z, &b, z);
  }
  for (int op = 0; op <= REF_COPY; op++)
    for (unsigned fl = 0; fl < 4; fl++)
      for (unsigned li = 0; li < NLENS; li++) {
        size_t len = lens[li];
        uint64_t scalar = pick_scalar(c->t, li + (unsigned)op);
        uint32_t div = divisors[(li + fl) % (sizeof divisors / sizeof divisors[0])];
        for (size_t i = 0; i < len; i++) {
          uint64_t e = ref_elem(c->t, op, fl, load_bits(c->A + i * z, z),
                                load_bits(c->B + i * z, z), scalar, div);
          memcpy(c->E + i * z, &e, z);
        }
        run_case(c, op, fl, len, scalar, div);
      }
}

/* nt: stream every store (threshold of one byte), so the aligned-head and
 * non-temporal loops meet the same cases as the plain ones. */
static void run_path(const char* isa, int nt) {
  if (!kern_force_isa(isa)) {
    print_message("path %s not available on this CPU\n", isa);
    skip();
  }
  assert_string_equal(kern_isa_name(), isa);
  size_t old_nt = kern_set_nt_threshold(nt ? 1 : SIZE_MAX);
  size_t cap = (MAXN * 8 + PAD + 63) / 64 * 64; /* aligned_alloc wants a multiple */
  struct ctx c = {.path = isa, .mode = nt ? "nt" : "plain"};
  uint8_t** bufs[] = {&c.A, &c.B, &c.E, &c.ba, &c.bb, &c.bd};
  for (size_t i = 0; i < 6; i++) {
    *bufs[i] = aligned_alloc(64, cap);
    assert_non_null(*bufs[i]);
  }
  for (size_t t = 0; t < NTYPES; t++) {
    c.t = &types[t];
    run_type(&c);
  }
  for (size_t i = 0; i < 6; i++) free(*bufs[i]);
  kern_set_nt_threshold(old_nt);
  kern_force_isa(NULL);
}

static void test_path_portable(void** state) {
  (void)state;
  run_path("portable", 0);
}
static void test_path_avx2(void** state) {
  (void)state;
  run_path("avx2", 0);
}
static void test_path_avx2_nt(void** state) {
  (void)state;
  run_path("avx2", 1);
}
static void test_path_avx512(void** state) {
  (void)state;
  run_path("avx512", 0);
}
static void test_path_avx512_nt(void** state) {
  (void)state;
  run_path("avx512", 1);
}

/* Whether fp8 value v of type t is a NaN. */
static int fp8_nan(const struct tinfo* t, uint32_t v) {
  return isnan(widen(t->type, v));
}

/* Every pair of fp8 values through kern_reduce on one path, against the
 * scalar reference: each operator and flags, aligned and one byte off
 * (the vector loops and their tails), out of place and in place, and the
 * pairs without a NaN alone. The plain sum has its own loop on the SIMD
 * paths (halves added in float), whose exactness rests on these pairs; a
 * block (32 or 64 elements) without a NaN (or, for e5m2, an infinity)
 * takes it, which only the last layout gives the large values (in the
 * others they share their blocks with the type's NaNs). Its chains of
 * more sources are test_kern_fp8's. */
static void fp8_pairs(const char* isa) {
  if (!kern_force_isa(isa)) {
    print_message("path %s not available on this CPU\n", isa);
    skip();
  }
  enum { N = 65536 };
  static uint8_t a[N + 1], b[N + 1], d[N + 1], want[N];
  for (size_t t = 0; t < NTYPES; t++) {
    const struct tinfo* ty = &types[t];
    if (ty->type != ncclFloat8e4m3 && ty->type != ncclFloat8e5m2) continue;
    for (int op = KERN_SUM; op <= KERN_MIN; op++)
      for (unsigned fl = 0; fl < 4; fl++)
        for (int v = 0; v < 4; v++) { /* aligned; a byte off; in place; no NaN */
          size_t o = v == 1, m = 0;
          uint64_t scalar = narrow(ty->type, 1.375f);
          struct kern_redop r = {ty->type, (enum kern_op)op, scalar, 3};
          for (size_t i = 0; i < N; i++) {
            if (v == 3 && (fp8_nan(ty, i >> 8) || fp8_nan(ty, i & 0xff))) continue;
            a[o + m] = (uint8_t)(i >> 8), b[o + m] = (uint8_t)i;
            want[m++] = (uint8_t)ref_elem(ty, op, fl, i >> 8, i & 0xff, scalar, 3);
          }
          uint8_t* out = v == 2 ? a : d + o;
          kern_reduce(&r, fl, out, a + o, b + o, m);
          for (size_t i = 0; i < m; i++)
            if (out[i] != want[i])
              fail_msg("%s %s %s flags %u variant %d: %02x, %02x -> %02x, want %02x", isa, ty->name,
                       op_names[op], fl, v, a[o + i], b[o + i], out[i], want[i]);
        }
  }
  kern_force_isa(NULL);
}

static void test_fp8_pairs_portable(void** state) {
  (void)state;
  fp8_pairs("portable");
}
static void test_fp8_pairs_avx2(void** state) {
  (void)state;
  fp8_pairs("avx2");
}
static void test_fp8_pairs_avx512(void** state) {
  (void)state;
  fp8_pairs("avx512");
}

/* ======================= the task form ======================= */

/* kern_task_run against the chain of pairwise calls that kernels.h says it
 * equals, on the same path (the pairwise calls are checked against the
 * scalar reference above): every type x op, 1..8 sources, 1..8
 * destinations, every way of pre-multiplying, odd lengths, misaligned and
 * in-place buffers. */

#define TMAX 8 /* sources and destinations in these tests */

struct tctx {
  const char* path;
  const char* mode;
  const struct tinfo* t;
  uint8_t* S[TMAX];  /* the sources' data at offset 0 */
  uint8_t* bs[TMAX]; /* source work buffers */
  uint8_t* bd[TMAX]; /* destination work buffers */
  uint8_t* E;        /* the chain's result */
};

/* What kernels.h promises: the pairwise chain in one buffer of the type. */
static void chain_ref(const struct kern_task* k, void* out, size_t z) {
  unsigned post = k->flags & KERN_POST;
  unsigned f0 = ((k->pre & 1u) ? KERN_PRE : 0u) | (k->nsrcs == 1 ? post : 0u);
  if (f0)
    kern_unary(&k->redop, f0, out, k->srcs[0], k->n);
  else
    memcpy(out, k->srcs[0], k->n * z);
  for (int i = 1; i < k->nsrcs; i++) {
    unsigned last = i == k->nsrcs - 1 ? post : 0u;
    if ((k->swap >> i) & 1u) /* source i first, read as it is */
      kern_reduce(&k->redop, last, out, k->srcs[i], out, k->n);
    else
      kern_reduce(&k->redop, (((k->pre >> i) & 1u) ? KERN_PRE : 0u) | last, out, out, k->srcs[i],
                  k->n);
  }
}

/* Swap patterns over the steps (bit 0 means nothing): none, one, every
 * other, all. */
static unsigned swap_mask(unsigned turn, int ns) {
  static const unsigned pats[] = {0u, 0u, 0x2u, 0x54u, 0xaau, ~0u};
  return pats[turn % 6] & ((1u << ns) - 2u);
}

/* Pre-multiplication patterns over the sources. */
static unsigned pre_mask(int mode, int ns) {
  unsigned all = (1u << ns) - 1u;
  static const unsigned pats[] = {0u, ~0u, 1u, 0x80u, 0x55u, 0xaau};
  unsigned m = mode == 3 ? 1u << (ns - 1) : pats[mode];
  return m & all;
}
#define NPRE 6

/* Byte offsets of the buffers: variant 0 aligned alike, 1 misaligned by
 * elements, 2 by bytes (off the element grid), 3 destinations alike but
 * off the sources, 4 in place (destination 0 is source ns - 1, the last
 * destination is source 0). */
static size_t task_off(int var, int idx, int is_dst, size_t z) {
  switch (var) {
    case 1:
      return (size_t)(idx % 4 + is_dst) * z;
    case 2:
      return (size_t)(idx * 3 + is_dst) % 7;
    case 3:
      return is_dst ? 5 * z : (size_t)idx * z;
    default:
      return 0;
  }
}
#define NTVAR 5

static void task_check(const struct tctx* c, const struct kern_task* k, uint8_t* const* dst,
                       const size_t* doff, int nd, int var, int pmode) {
  size_t z = c->t->size, bytes = k->n * z;
  for (int j = 0; j < nd; j++) {
    if (dst[j] != c->bd[j] + doff[j]) continue; /* in place: a source buffer */
    for (size_t i = 0; i < doff[j]; i++)
      if (c->bd[j][i] != FILL) fail_msg("%s task: wrote before dst %d", c->path, j);
    for (size_t i = 0; i < GUARD; i++)
      if (c->bd[j][doff[j] + bytes + i] != FILL)
        fail_msg("%s/%s task %s ns=%d nd=%d len=%zu: wrote past dst %d", c->path, c->mode,
                 c->t->name, k->nsrcs, nd, k->n, j);
  }
  for (int j = 0; j < nd; j++) {
    if (memcmp(dst[j], c->E, bytes) == 0) continue;
    size_t i = 0;
    while (memcmp(dst[j] + i * z, c->E + i * z, z) == 0) i++;
    char sg[64], sw[64];
    describe(sg, sizeof sg, c->t, dst[j] + i * z);
    describe(sw, sizeof sw, c->t, c->E + i * z);
    fail_msg(
        "TASK MISMATCH path=%s/%s type=%s op=%s ns=%d nd=%d pre=0x%x(mode %d) flags=%u len=%zu "
        "variant=%d dst %d index %zu: got=%s want=%s",
        c->path, c->mode, c->t->name, op_names[k->redop.op], k->nsrcs, nd, k->pre, pmode, k->flags,
        k->n, var, j, i, sg, sw);
  }
}

/* One task on fresh buffers: the sources copied in at their offsets, the
 * destinations filled, then kern_task_run against chain_ref. */
static void task_case(const struct tctx* c, struct kern_task* k, int var, int pmode) {
  size_t z = c->t->size, bytes = k->n * z, doff[TMAX];
  uint8_t* dst[TMAX];
  int ns = k->nsrcs, nd = k->ndsts;
  for (int i = 0; i < ns; i++) {
    size_t o = task_off(var, i, 0, z);
    memcpy(c->bs[i] + o, c->S[i], bytes);
    k->srcs[i] = c->bs[i] + o;
  }
  chain_ref(k, c->E, z); /* before the in-place variant aliases anything */
  for (int j = 0; j < nd; j++) {
    doff[j] = task_off(var, j, 1, z);
    memset(c->bd[j], FILL, doff[j] + bytes + GUARD);
    dst[j] = c->bd[j] + doff[j];
  }
  if (var == 4) {
    dst[0] = (uint8_t*)k->srcs[ns - 1];
    if (nd > 1) dst[nd - 1] = (uint8_t*)k->srcs[0];
  }
  for (int j = 0; j < nd; j++) k->dsts[j] = dst[j];
  kern_task_run(k);
  task_check(c, k, dst, doff, nd, var, pmode);
}

static void task_type(struct tctx* c) {
  static const size_t tlens[] = {1, 2, 7, 33, 255, 1001, MAXN};
  static const int nss[] = {1, 2, 3, 5, 8}, nds[] = {1, 2, 3, 8};
  size_t z = c->t->size;
  rng_state = 0x51ED270B27A3C0DEull ^ (uint64_t)c->t->type;
  for (int i = 0; i < TMAX; i++)
    for (size_t e = 0; e < MAXN; e++) {
      uint64_t v = gen_elem(c->t, i ? c->S[i - 1] : NULL, e);
      memcpy(c->S[i] + e * z, &v, z);
    }
  unsigned turn = 0;
  for (int op = KERN_SUM; op <= KERN_MIN; op++)
    for (size_t a = 0; a < sizeof nss / sizeof nss[0]; a++)
      for (size_t b = 0; b < sizeof nds / sizeof nds[0]; b++) {
        if (nss[a] == 1 && op != KERN_SUM) continue; /* one source: the op is not used */
        for (int pmode = 0; pmode < NPRE; pmode++)
          for (unsigned post = 0; post <= KERN_POST; post += KERN_POST)
            for (size_t li = 0; li < sizeof tlens / sizeof tlens[0]; li++, turn++) {
              struct kern_task k;
              memset(&k, 0, sizeof k);
              k.redop = (struct kern_redop){c->t->type, (enum kern_op)op, pick_scalar(c->t, turn),
                                            divisors[turn % 8]};
              k.nsrcs = nss[a], k.ndsts = nds[b], k.n = tlens[li];
              k.pre = pre_mask(pmode, k.nsrcs);
              k.swap = swap_mask(turn / 7, k.nsrcs);
              k.flags = post;
              task_case(c, &k, (int)(turn % NTVAR), pmode);
            }
      }
}

static void run_task_path(const char* isa, int nt) {
  if (!kern_force_isa(isa)) {
    print_message("path %s not available on this CPU\n", isa);
    skip();
  }
  size_t old_nt = kern_set_nt_threshold(nt ? 1 : SIZE_MAX);
  size_t cap = (MAXN * 8 + PAD + 63) / 64 * 64;
  struct tctx c = {.path = isa, .mode = nt ? "nt" : "plain"};
  c.E = aligned_alloc(64, cap);
  assert_non_null(c.E);
  for (int i = 0; i < TMAX; i++) {
    c.S[i] = aligned_alloc(64, cap);
    c.bs[i] = aligned_alloc(64, cap);
    c.bd[i] = aligned_alloc(64, cap);
    assert_true(c.S[i] && c.bs[i] && c.bd[i]);
  }
  for (size_t t = 0; t < NTYPES; t++) {
    c.t = &types[t];
    task_type(&c);
  }
  for (int i = 0; i < TMAX; i++) free(c.S[i]), free(c.bs[i]), free(c.bd[i]);
  free(c.E);
  kern_set_nt_threshold(old_nt);
  kern_force_isa(NULL);
}

static void test_task_portable(void** state) {
  (void)state;
  run_task_path("portable", 0);
}
static void test_task_avx2(void** state) {
  (void)state;
  run_task_path("avx2", 0);
}
static void test_task_avx2_nt(void** state) {
  (void)state;
  run_task_path("avx2", 1);
}
static void test_task_avx512(void** state) {
  (void)state;
  run_task_path("avx512", 0);
}
static void test_task_avx512_nt(void** state) {
  (void)state;
  run_task_path("avx512", 1);
}

/* The task's edges: invalid tasks do nothing; a one-source task without
 * flags copies bits as they are (NaN payloads of the narrow types too, which
 * a trip through float would quiet) to every destination. */
static void test_task_edges(void** state) {
  (void)state;
  uint16_t src[5] = {0x7d01, 0xfc01, 1, 2, 3}, d0[5], d1[5], keep[5] = {7, 7, 7, 7, 7};
  struct kern_task k;
  memset(&k, 0, sizeof k);
  k.redop = (struct kern_redop){ncclFloat16, KERN_SUM, 0, 1};
  k.nsrcs = 1, k.ndsts = 2, k.n = 5;
  k.srcs[0] = src, k.dsts[0] = d0, k.dsts[1] = d1;
  kern_task_run(&k);
  assert_memory_equal(d0, src, sizeof src);
  assert_memory_equal(d1, src, sizeof src);
  memcpy(d0, keep, sizeof keep);
  k.ndsts = 1;
  int bad[][2] = {{0, 1}, {KERN_TASK_MAX_SRCS + 1, 1}, {1, 0}, {1, KERN_TASK_MAX_DSTS + 1}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    k.nsrcs = bad[i][0], k.ndsts = bad[i][1];
    kern_task_run(&k);
    assert_memory_equal(d0, keep, sizeof keep);
  }
  k.nsrcs = 2, k.ndsts = 1, k.srcs[1] = src;
  k.redop.op = (enum kern_op)9; /* a bad op with two sources */
  kern_task_run(&k);
  k.redop.op = KERN_SUM, k.redop.type = (ncclDataType_t)ncclNumTypes;
  kern_task_run(&k);
  assert_memory_equal(d0, keep, sizeof keep);
  kern_task_run(NULL);
}

/* ======================= dispatch and API edges ======================= */

static const char* expected_best(void) {
  __builtin_cpu_init();
  unsigned a, b, c, d; /* F16C from CPUID: clang's builtin lacks the name */
  int f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  int avx2 = __builtin_cpu_supports("avx2") && f16c && __builtin_cpu_supports("fma");
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "avx512";
  return avx2 ? "avx2" : "portable";
}

/* Runs first: main() set BRAID_KERNEL_ISA=portable before any kernel call. */
static void test_dispatch(void** state) {
  (void)state;
  assert_string_equal(kern_isa_name(), "portable");
  assert_int_equal(kern_force_isa("sse9"), 0);
  assert_string_equal(kern_isa_name(), "portable");
  assert_int_equal(kern_force_isa(NULL), 1);
  assert_string_equal(kern_isa_name(), expected_best());
}

static void test_api_edges(void** state) {
  (void)state;
  for (size_t t = 0; t < NTYPES; t++)
    assert_int_equal(kern_type_size(types[t].type), types[t].size);
  assert_int_equal(kern_type_size((ncclDataType_t)ncclNumTypes), 0);
  int32_t a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40}, d[4] = {7, 7, 7, 7};
  struct kern_redop r = {ncclInt32, KERN_SUM, 0, 1};
  kern_reduce(&r, 0, d, a, b, 0); /* n == 0: nothing written */
  assert_int_equal(d[0], 7);
  r.type = (ncclDataType_t)ncclNumTypes; /* invalid type: no-op */
  kern_reduce(&r, 0, d, a, b, 4);
  kern_unary(&r, KERN_PRE, d, a, 4);
  assert_int_equal(d[0], 7);
  r.type = ncclInt32;
  r.op = (enum kern_op)7; /* invalid op: no-op */
  kern_reduce(&r, 0, d, a, b, 4);
  assert_int_equal(d[3], 7);
  r.op = KERN_SUM;
  kern_reduce(&r, 0x10u | KERN_POST, d, a, b, 4); /* unknown flag bits ignored */
  assert_int_equal(d[3], 44);
  kern_unary(&r, 0, d, b, 4); /* flags 0: a copy */
  assert_memory_equal(d, b, sizeof b);
}

int main(void) {
  setenv("BRAID_KERNEL_ISA", "portable", 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dispatch),        cmocka_unit_test(test_api_edges),
      cmocka_unit_test(test_half_exhaustive), cmocka_unit_test(test_bf16_exhaustive),
      cmocka_unit_test(test_fp8_all),         cmocka_unit_test(test_narrow_rne),
      cmocka_unit_test(test_path_portable),   cmocka_unit_test(test_path_avx2),
      cmocka_unit_test(test_path_avx2_nt),    cmocka_unit_test(test_path_avx512),
      cmocka_unit_test(test_path_avx512_nt),  cmocka_unit_test(test_task_edges),
      cmocka_unit_test(test_task_portable),   cmocka_unit_test(test_task_avx2),
      cmocka_unit_test(test_task_avx2_nt),    cmocka_unit_test(test_task_avx512),
      cmocka_unit_test(test_task_avx512_nt),  cmocka_unit_test(test_fp8_pairs_portable),
      cmocka_unit_test(test_fp8_pairs_avx2),  cmocka_unit_test(test_fp8_pairs_avx512),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
