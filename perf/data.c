/* Element types, narrow-float conversions and the exact-result data generator of the perf tools:
 * inputs are small integers whose reduction is exact in every type, whatever the order. */
#include <math.h>
#include <string.h>

#include "common.h"

#define POW2(e) ((double)(1ULL << (e)))

static const perf_type_t kTypes[PERF_NUM_TYPES] = {
    {"int8", NULL, ncclInt8, 1, PERF_SINT, 0, 0, 127},
    {"uint8", NULL, ncclUint8, 1, PERF_UINT, 0, 0, 255},
    {"int32", "int", ncclInt32, 4, PERF_SINT, 0, 0, POW2(30)},
    {"uint32", NULL, ncclUint32, 4, PERF_UINT, 0, 0, POW2(31)},
    {"int64", NULL, ncclInt64, 8, PERF_SINT, 0, 0, POW2(50)},
    {"uint64", NULL, ncclUint64, 8, PERF_UINT, 0, 0, POW2(50)},
    {"half", "float16", ncclFloat16, 2, PERF_FLOAT, 5, 10, 2048},
    {"float", "float32", ncclFloat32, 4, PERF_FLOAT, 8, 23, POW2(24)},
    {"double", "float64", ncclFloat64, 8, PERF_FLOAT, 11, 52, POW2(53)},
    {"bfloat16", "bf16", ncclBfloat16, 2, PERF_FLOAT, 8, 7, 256},
    {"f8e4m3", "fp8e4m3", ncclFloat8e4m3, 1, PERF_FLOAT, 4, 3, 16},
    {"f8e5m2", "fp8e5m2", ncclFloat8e5m2, 1, PERF_FLOAT, 5, 2, 8},
};

static const perf_op_t kOps[PERF_NUM_OPS] = {
    {"sum", NULL, PERF_OP_SUM}, {"prod", NULL, PERF_OP_PROD},
    {"max", NULL, PERF_OP_MAX}, {"min", NULL, PERF_OP_MIN},
    {"avg", NULL, PERF_OP_AVG}, {"mulsum", "premulsum", PERF_OP_PREMULSUM},
};

const perf_type_t* perf_type_at(int i) {
  return &kTypes[i];
}
const perf_op_t* perf_op_at(int i) {
  return &kOps[i];
}

const perf_type_t* perf_type_find(const char* name) {
  for (int i = 0; i < PERF_NUM_TYPES; i++) {
    const perf_type_t* t = &kTypes[i];
    if (strcmp(name, t->name) == 0 || (t->alias && strcmp(name, t->alias) == 0)) return t;
  }
  return NULL;
}

const perf_op_t* perf_op_find(const char* name) {
  for (int i = 0; i < PERF_NUM_OPS; i++) {
    const perf_op_t* o = &kOps[i];
    if (strcmp(name, o->name) == 0 || (o->alias && strcmp(name, o->alias) == 0)) return o;
  }
  return NULL;
}

/* ---- narrow float formats ---- */

static uint32_t nan_bits(int ebits, int mbits) {
  return (((1u << ebits) - 1) << mbits) | ((1u << mbits) - 1);
}

/* Largest finite encoding (magnitude bits). */
static uint32_t max_finite_bits(int ebits, int mbits, int has_inf) {
  if (has_inf) return (((1u << ebits) - 2) << mbits) | ((1u << mbits) - 1);
  return (((1u << ebits) - 1) << mbits) | ((1u << mbits) - 2);
}

/* Magnitude bits of a > 0, rounded to nearest even (rint follows the default mode). */
static uint32_t encode_magnitude(double a, int ebits, int mbits) {
  int bias = (1 << (ebits - 1)) - 1, ex;
  frexp(a, &ex);
  ex -= 1;                                                                /* a = 1.f * 2^ex */
  if (ex < 1 - bias) return (uint32_t)rint(ldexp(a, mbits - (1 - bias))); /* subnormal */
  double q = rint(ldexp(a, mbits - ex));
  if (q >= POW2(mbits + 1)) {
    q /= 2;
    ex++;
  }
  return ((uint32_t)(ex + bias) << mbits) | ((uint32_t)q - (1u << mbits));
}

uint32_t perf_float_encode(double x, int ebits, int mbits, int has_inf) {
  uint32_t sign = signbit(x) ? 1u << (ebits + mbits) : 0;
  if (isnan(x)) return nan_bits(ebits, mbits);
  double a = fabs(x);
  if (a == 0) return sign;
  uint32_t top = max_finite_bits(ebits, mbits, has_inf);
  uint32_t mag = isinf(a) ? top + 1 : encode_magnitude(a, ebits, mbits);
  if (mag > top) mag = has_inf ? ((1u << ebits) - 1) << mbits : nan_bits(ebits, mbits);
  return sign | mag;
}

double perf_float_decode(uint32_t bits, int ebits, int mbits, int has_inf) {
  int bias = (1 << (ebits - 1)) - 1;
  uint32_t emask = (1u << ebits) - 1, mmask = (1u << mbits) - 1;
  uint32_t field = (bits >> mbits) & emask, mant = bits & mmask;
  double s = ((bits >> (ebits + mbits)) & 1) ? -1.0 : 1.0;
  if (has_inf && field == emask) return mant ? NAN : s * INFINITY;
  if (!has_inf && field == emask && mant == mmask) return NAN;
  if (field == 0) return s * ldexp((double)mant, 1 - bias - mbits);
  return s * ldexp((double)(mant | (1u << mbits)), (int)field - bias - mbits);
}

uint16_t perf_to_half(double x) {
  return (uint16_t)perf_float_encode(x, 5, 10, 1);
}
double perf_from_half(uint16_t h) {
  return perf_float_decode(h, 5, 10, 1);
}
uint16_t perf_to_bf16(double x) {
  return (uint16_t)perf_float_encode(x, 8, 7, 1);
}
double perf_from_bf16(uint16_t h) {
  return perf_float_decode(h, 8, 7, 1);
}
uint8_t perf_to_e4m3(double x) {
  return (uint8_t)perf_float_encode(x, 4, 3, 0);
}
double perf_from_e4m3(uint8_t v) {
  return perf_float_decode(v, 4, 3, 0);
}
uint8_t perf_to_e5m2(double x) {
  return (uint8_t)perf_float_encode(x, 5, 2, 1);
}
double perf_from_e5m2(uint8_t v) {
  return perf_float_decode(v, 5, 2, 1);
}

static int has_inf(const perf_type_t* ty) {
  return ty->type != ncclFloat8e4m3;
}

/* x rounded to the type (float kinds). */
static double round_to(const perf_type_t* ty, double x) {
  if (ty->type == ncclFloat64) return x;
  if (ty->type == ncclFloat32) return (double)(float)x;
  uint32_t b = perf_float_encode(x, ty->ebits, ty->mbits, has_inf(ty));
  return perf_float_decode(b, ty->ebits, ty->mbits, has_inf(ty));
}

/* ---- loads and stores ---- */

static void store_int(const perf_type_t* ty, void* buf, size_t i, int64_t v) {
  switch (ty->size) {
    case 1:
      ((uint8_t*)buf)[i] = (uint8_t)v;
      break;
    case 2:
      ((uint16_t*)buf)[i] = (uint16_t)v;
      break;
    case 4:
      ((uint32_t*)buf)[i] = (uint32_t)v;
      break;
    default:
      ((uint64_t*)buf)[i] = (uint64_t)v;
      break;
  }
}

static void store_float(const perf_type_t* ty, void* buf, size_t i, double f) {
  if (ty->type == ncclFloat64) {
    ((double*)buf)[i] = f;
  } else if (ty->type == ncclFloat32) {
    ((float*)buf)[i] = (float)f;
  } else {
    int64_t bits = perf_float_encode(f, ty->ebits, ty->mbits, has_inf(ty));
    store_int(ty, buf, i, bits);
  }
}

void perf_store(const perf_type_t* ty, void* buf, size_t i, perf_val_t v) {
  if (ty->kind == PERF_FLOAT)
    store_float(ty, buf, i, v.f);
  else
    store_int(ty, buf, i, v.i);
}

static int64_t load_int(const perf_type_t* ty, const void* buf, size_t i) {
  int s = ty->kind == PERF_SINT;
  switch (ty->size) {
    case 1:
      return s ? (int64_t)((const int8_t*)buf)[i] : (int64_t)((const uint8_t*)buf)[i];
    case 2:
      return s ? (int64_t)((const int16_t*)buf)[i] : (int64_t)((const uint16_t*)buf)[i];
    case 4:
      return s ? (int64_t)((const int32_t*)buf)[i] : (int64_t)((const uint32_t*)buf)[i];
    default:
      return ((const int64_t*)buf)[i];
  }
}

perf_val_t perf_load(const perf_type_t* ty, const void* buf, size_t i) {
  perf_val_t v = {0, 0};
  if (ty->kind != PERF_FLOAT) {
    v.i = load_int(ty, buf, i);
  } else if (ty->type == ncclFloat64) {
    v.f = ((const double*)buf)[i];
  } else if (ty->type == ncclFloat32) {
    v.f = ((const float*)buf)[i];
  } else {
    uint32_t bits = ty->size == 1 ? ((const uint8_t*)buf)[i] : ((const uint16_t*)buf)[i];
    v.f = perf_float_decode(bits, ty->ebits, ty->mbits, has_inf(ty));
  }
  return v;
}

perf_val_t perf_val_of(const perf_type_t* ty, int64_t x) {
  perf_val_t v = {x, 0};
  if (ty->kind == PERF_FLOAT) v.f = round_to(ty, (double)x);
  return v;
}

int perf_val_equal(const perf_type_t* ty, perf_val_t a, perf_val_t b) {
  return ty->kind == PERF_FLOAT ? a.f == b.f : a.i == b.i;
}

/* ---- the generator ---- */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/* Exact-sum budget of the current op: premulsum doubles every input. */
static double op_budget(const perf_test_t* t) {
  double b = t->type->budget;
  return t->op->index == PERF_OP_PREMULSUM ? b / PERF_PREMUL_SCALAR : b;
}

/* prod: +-1 everywhere, 2 on at most two ranks per element, so |product| <= 4. */
static int64_t prod_input(const perf_test_t* t, int rank, size_t i, uint64_t h) {
  int n = t->nranks;
  int64_t v = (int)((rank + i) % (size_t)n) < (n < 2 ? n : 2) ? 2 : 1;
  return (t->type->kind != PERF_UINT && (h & 1)) ? -v : v;
}

/* Data movement: any integer of magnitude <= budget, which the type holds exactly. */
static int64_t move_input(const perf_test_t* t, uint64_t h) {
  uint64_t m = (uint64_t)t->type->budget;
  if (t->type->kind == PERF_UINT) return (int64_t)(h % (m + 1));
  return (int64_t)(h % (2 * m + 1)) - (int64_t)m;
}

/* Other ops: K = min(nranks, budget) ranks contribute per element, each |x| <= budget / K;
 * the others give 0, so every partial sum stays within the budget. */
int64_t perf_input(const perf_test_t* t, int rank, size_t i) {
  uint64_t h = mix64(t->seed ^ mix64(((uint64_t)rank << 40) ^ (uint64_t)i));
  if (t->coll->moves_only) return move_input(t, h);
  if (t->op->index == PERF_OP_PROD) return prod_input(t, rank, i, h);
  double budget = op_budget(t);
  int n = t->nranks, k = (double)n < budget ? n : (int)budget;
  if ((int)((rank + i) % (size_t)n) >= k) return 0;
  uint64_t m = (uint64_t)(budget / k);
  if (t->type->kind == PERF_UINT) return (int64_t)(h % (m + 1));
  return (int64_t)(h % (2 * m + 1)) - (int64_t)m;
}

/* Narrow floats: encodings of the few integers an input can be, computed once per fill. */
#define LUT_MAX 2048
static void fill_lut(const perf_test_t* t, void* buf, size_t count, int rank, size_t first) {
  uint16_t lut[2 * LUT_MAX + 1];
  const perf_type_t* ty = t->type;
  int lim = (int)ty->budget;
  for (int v = -lim; v <= lim; v++)
    lut[v + lim] = (uint16_t)perf_float_encode(v, ty->ebits, ty->mbits, has_inf(ty));
  for (size_t j = 0; j < count; j++) {
    int64_t v = perf_input(t, rank, first + j) + lim;
    if (ty->size == 1)
      ((uint8_t*)buf)[j] = (uint8_t)lut[v];
    else
      ((uint16_t*)buf)[j] = lut[v];
  }
}

void perf_fill(const perf_test_t* t, void* buf, size_t count, int rank, size_t first) {
  const perf_type_t* ty = t->type;
  if (ty->kind == PERF_FLOAT && ty->size <= 2 && ty->budget <= LUT_MAX) {
    fill_lut(t, buf, count, rank, first);
    return;
  }
  for (size_t j = 0; j < count; j++) {
    int64_t v = perf_input(t, rank, first + j);
    if (ty->type == ncclFloat32)
      ((float*)buf)[j] = (float)v;
    else if (ty->type == ncclFloat64)
      ((double*)buf)[j] = (double)v;
    else
      store_int(ty, buf, j, v);
  }
}

/* avg: integer kinds truncate the exact sum toward zero; float kinds round sum/n once. */
static perf_val_t finish(const perf_test_t* t, int64_t acc) {
  perf_val_t v = {acc, 0};
  int avg = t->op->index == PERF_OP_AVG;
  if (t->type->kind != PERF_FLOAT) {
    if (avg) v.i = acc / t->nranks;
    return v;
  }
  v.f = round_to(t->type, avg ? (double)acc / t->nranks : (double)acc);
  return v;
}

perf_val_t perf_reduced(const perf_test_t* t, size_t i) {
  int opi = t->op->index;
  int64_t acc = perf_input(t, 0, i);
  if (opi == PERF_OP_PREMULSUM) acc *= PERF_PREMUL_SCALAR;
  for (int r = 1; r < t->nranks; r++) {
    int64_t x = perf_input(t, r, i);
    switch (opi) {
      case PERF_OP_PROD:
        acc *= x;
        break;
      case PERF_OP_MAX:
        acc = x > acc ? x : acc;
        break;
      case PERF_OP_MIN:
        acc = x < acc ? x : acc;
        break;
      case PERF_OP_PREMULSUM:
        acc += x * PERF_PREMUL_SCALAR;
        break;
      default:
        acc += x;
        break;
    }
  }
  return finish(t, acc);
}

size_t perf_count_wrong(const perf_test_t* t, const void* recv) {
  size_t wrong = 0;
  perf_val_t want;
  for (size_t i = 0; i < t->n.recv; i++) {
    if (!t->coll->expect(t, i, &want)) continue;
    if (!perf_val_equal(t->type, perf_load(t->type, recv, i), want)) wrong++;
  }
  return wrong;
}
