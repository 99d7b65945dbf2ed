/* Multi-process tests: generated all-reduce inputs with closed-form exact
 * results. Values repeat with a prime period and flip sign (or shift) per block. */
#include "archeck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtypes.h"

#define AR_PERIOD 4099 /* prime, so chunk boundaries never line up with it */
#define AR_POISON 0xA5
#define AR_GUARD_BYTE 0x5A
#define AR_MAX_REPORTS 4

/* Per-call tables over one period: own inputs and the expected result for a
 * positive (pos) and a sign-flipped (neg) block; or, in offset mode, raw
 * integers to which each block adds its own offset. */
typedef struct ar_tables {
  size_t esz;
  int offset_mode;
  int nranks;
  uint64_t seed;
  unsigned char *xpos, *xneg, *epos, *eneg;
  uint64_t *xraw, *eraw;
} ar_tables;

typedef struct ar_agg {
  uint64_t sum, prod;
  int64_t max, min;
} ar_agg;

static const char* const kKindNames[AR_NKINDS] = {"sum", "prod", "max", "min", "avg", "premulsum"};

const char* ar_kind_name(int kind) {
  return kind >= 0 && kind < AR_NKINDS ? kKindNames[kind] : "?";
}

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b) {
  return mix64(seed ^ mix64(a * 0x100000001b3ull ^ mix64(b)));
}

static int64_t in_range(uint64_t h, int64_t lo, int64_t hi) {
  return lo + (int64_t)(h % (uint64_t)(hi - lo + 1));
}

static int type_bits(ncclDataType_t t) {
  return (int)(8 * mp_type(t)->size);
}

static uint64_t int_max_unsigned(ncclDataType_t t) {
  int k = type_bits(t);
  return k == 64 ? UINT64_MAX : (1ull << k) - 1;
}

static int64_t int_max_signed(ncclDataType_t t) {
  return (int64_t)(int_max_unsigned(t) >> 1);
}

static int is_offset_mode(ncclDataType_t t, int kind) {
  const mp_type_info* ti = mp_type(t);
  if (ti->is_float) return 0;
  return kind == AR_MAX || kind == AR_MIN || (kind == AR_AVG && !ti->is_signed);
}

/* Magnitude bound of avg inputs so that no partial sum wraps. */
static int64_t avg_int_range(ncclDataType_t t, int nranks) {
  int64_t r = mp_type(t)->is_signed ? int_max_signed(t) / nranks
                                    : (int64_t)(int_max_unsigned(t) / 2 / (uint64_t)nranks);
  return r < 100000 ? r : 100000;
}

static int64_t gen_int(const ar_call* c, int nranks, uint64_t h) {
  const mp_type_info* ti = mp_type(c->type);
  switch (c->kind) {
    case AR_PROD:
      return (int64_t)(h | 1u);
    case AR_MAX:
    case AR_MIN:
      return ti->is_signed ? in_range(h, -64, 64) : in_range(h, 0, 128);
    case AR_AVG: {
      int64_t r = avg_int_range(c->type, nranks);
      return in_range(h, ti->is_signed ? -r : 0, r);
    }
    default:
      return (int64_t)h; /* sum, premulsum: full range, wraps */
  }
}

/* Small integers whose every partial sum/product is exact in the type. */
static int64_t gen_real(const ar_call* c, int nranks, uint64_t h) {
  static const int64_t prod_vals[4] = {-2, -1, 1, 2};
  double lim = mp_type(c->type)->exact_ints;
  if (c->kind == AR_PROD) return prod_vals[h & 3u];
  if (c->kind == AR_MAX || c->kind == AR_MIN) return in_range(h, -8, 8);
  int64_t r = (int64_t)(lim / nranks);
  if (r > 1000) r = 1000;
  return in_range(h, -r, r);
}

static int64_t gen_value(const ar_call* c, int nranks, int rank, size_t j) {
  uint64_t h = hash3(c->tab->seed, (uint64_t)rank + 1, j);
  return mp_type(c->type)->is_float ? gen_real(c, nranks, h) : gen_int(c, nranks, h);
}

/* Block b: bit 0 says flip, the rest picks the offset (offset mode). */
static uint64_t block_hash(const ar_tables* t, size_t b) {
  return hash3(t->seed, 0xb10c, b);
}

static uint64_t block_offset(const ar_call* c, uint64_t h) {
  const mp_type_info* ti = mp_type(c->type);
  h >>= 1;
  if (c->kind == AR_AVG) return (uint64_t)in_range(h, 0, avg_int_range(c->type, c->tab->nranks));
  int k = type_bits(c->type);
  uint64_t span = (k == 64 ? 0ull : (1ull << k)) - 128u;
  uint64_t lo = ti->is_signed ? (uint64_t)(-int_max_signed(c->type) - 1 + 64) : 0u;
  return lo + h % span;
}

static ar_agg aggregate(const ar_call* c, int nranks, size_t j) {
  ar_agg a = {0, 1, INT64_MIN, INT64_MAX};
  for (int r = 0; r < nranks; r++) {
    int64_t v = gen_value(c, nranks, r, j);
    a.sum += (uint64_t)v;
    a.prod *= (uint64_t)v;
    if (v > a.max) a.max = v;
    if (v < a.min) a.min = v;
  }
  return a;
}

static double real_avg(ncclDataType_t t, int64_t s, int n) {
  if (t == ncclFloat64) return (double)s / (double)n;
  return (double)((float)s / (float)n);
}

/* Expected float result of a block with sign sgn (+1 or -1). */
static double expect_real(const ar_call* c, const ar_agg* a, int n, int sgn) {
  int64_t s = sgn * (int64_t)a->sum, p = (int64_t)a->prod;
  switch (c->kind) {
    case AR_SUM:
      return (double)s;
    case AR_AVG:
      return real_avg(c->type, s, n);
    case AR_PREMUL:
      return (double)s * 0.5;
    case AR_MAX:
      return sgn > 0 ? (double)a->max : (double)-a->min;
    case AR_MIN:
      return sgn > 0 ? (double)a->min : (double)-a->max;
    default:
      return (double)((sgn < 0 && (n & 1)) ? -p : p);
  }
}

/* Expected integer result (flip mode) of a block with sign sgn. */
static uint64_t expect_int(const ar_call* c, const ar_agg* a, int n, int sgn) {
  uint64_t s = sgn > 0 ? a->sum : 0u - a->sum;
  switch (c->kind) {
    case AR_SUM:
      return s;
    case AR_PREMUL:
      return 3u * s;
    case AR_AVG:
      return (uint64_t)((int64_t)s / n);
    default:
      return (sgn < 0 && (n & 1)) ? 0u - a->prod : a->prod;
  }
}

/* Offset mode: the value each block's offset is added to. */
static uint64_t expect_base(const ar_call* c, const ar_agg* a, int n) {
  if (c->kind == AR_MAX) return (uint64_t)a->max;
  if (c->kind == AR_MIN) return (uint64_t)a->min;
  return a->sum / (uint64_t)n; /* unsigned avg */
}

static void store_value(ncclDataType_t t, int64_t v, void* out) {
  if (mp_type(t)->is_float)
    mp_store_real(t, (double)v, out);
  else
    mp_store_int(t, (uint64_t)v, out);
}

/* Only the entries a call of c->count elements reads: a short call would
 * otherwise pay for the whole period (every rank's value at each entry). */
static void fill_tables(ar_call* c, int rank) {
  ar_tables* t = c->tab;
  size_t e = t->esz, used = c->count < AR_PERIOD ? c->count : AR_PERIOD;
  for (size_t j = 0; j < used; j++) {
    int64_t x = gen_value(c, t->nranks, rank, j);
    ar_agg a = aggregate(c, t->nranks, j);
    if (t->offset_mode) {
      t->xraw[j] = (uint64_t)x;
      t->eraw[j] = expect_base(c, &a, t->nranks);
      continue;
    }
    store_value(c->type, x, t->xpos + j * e);
    store_value(c->type, (int64_t)(0u - (uint64_t)x), t->xneg + j * e);
    if (mp_type(c->type)->is_float) {
      mp_store_real(c->type, expect_real(c, &a, t->nranks, 1), t->epos + j * e);
      mp_store_real(c->type, expect_real(c, &a, t->nranks, -1), t->eneg + j * e);
    } else {
      mp_store_int(c->type, expect_int(c, &a, t->nranks, 1), t->epos + j * e);
      mp_store_int(c->type, expect_int(c, &a, t->nranks, -1), t->eneg + j * e);
    }
  }
}

static int alloc_tables(ar_call* c, int nranks) {
  ar_tables* t = calloc(1, sizeof(*t));
  if (!t) return -1;
  c->tab = t;
  t->esz = mp_type(c->type)->size;
  t->nranks = nranks;
  t->offset_mode = is_offset_mode(c->type, c->kind);
  t->seed = mix64(((uint64_t)c->type << 48) ^ ((uint64_t)c->kind << 40) ^ ((uint64_t)nranks << 32) ^
                  c->count ^ mix64(c->salt));
  if (t->offset_mode) {
    t->xraw = malloc(AR_PERIOD * sizeof(uint64_t));
    t->eraw = malloc(AR_PERIOD * sizeof(uint64_t));
    return t->xraw && t->eraw ? 0 : -1;
  }
  t->xpos = malloc(4 * AR_PERIOD * t->esz);
  if (!t->xpos) return -1;
  t->xneg = t->xpos + AR_PERIOD * t->esz;
  t->epos = t->xneg + AR_PERIOD * t->esz;
  t->eneg = t->epos + AR_PERIOD * t->esz;
  return 0;
}

/* The expected bytes of elements [i, i + len) of the input (output=0) or
 * result (1), into out; the run stays inside one period, so one block hash
 * serves it (hashing per element was most of the matrices' time). */
static void expected_run(const ar_call* c, int output, size_t i, size_t len, unsigned char* out) {
  const ar_tables* t = c->tab;
  size_t j = i % AR_PERIOD;
  uint64_t h = block_hash(t, i / AR_PERIOD);
  if (t->offset_mode) {
    const uint64_t* base = output ? t->eraw : t->xraw;
    uint64_t off = block_offset(c, h);
    for (size_t k = 0; k < len; k++) mp_store_int(c->type, base[j + k] + off, out + k * t->esz);
    return;
  }
  const unsigned char* tabl =
      output ? ((h & 1u) ? t->eneg : t->epos) : ((h & 1u) ? t->xneg : t->xpos);
  memcpy(out, tabl + j * t->esz, len * t->esz);
}

/* Elements in [i, end) up to the end of i's period. */
static size_t run_len(size_t i, size_t end) {
  size_t run = AR_PERIOD - i % AR_PERIOD;
  return run < end - i ? run : end - i;
}

static void fill_input(const ar_call* c, unsigned char* buf) {
  for (size_t i = 0; i < c->count; i += run_len(i, c->count))
    expected_run(c, 0, i, run_len(i, c->count), buf + i * c->tab->esz);
}

void ar_describe(const ar_call* c, char* buf, size_t n) {
  snprintf(buf, n, "type=%s op=%s count=%zu %s", mp_type(c->type)->name, ar_kind_name(c->kind),
           c->count, c->inplace ? "in-place" : "out-of-place");
}

static void report_elem(const ar_call* c, const mp_env* env, const char* what, size_t i,
                        const unsigned char* want, const unsigned char* got) {
  char d[128], w[64], g[64];
  ar_describe(c, d, sizeof(d));
  mp_format(c->type, want, w, sizeof(w));
  mp_format(c->type, got, g, sizeof(g));
  mp_fail(env, "allreduce %s nranks=%d: %s[%zu] expected %s got %s", d, env->nranks, what, i, w, g);
}

/* Compare of buf's elements [start, start + len), one period at most,
 * against the pattern; returns #mismatches. */
static size_t compare_range(const ar_call* c, const mp_env* env, int output,
                            const unsigned char* buf, size_t start, size_t len, size_t reported,
                            const char* what) {
  size_t e = c->tab->esz, bad = 0;
  unsigned char want[AR_PERIOD * 8];
  expected_run(c, output, start, len, want);
  if (memcmp(buf + start * e, want, len * e) == 0) return 0;
  for (size_t k = 0; k < len; k++) {
    if (memcmp(buf + (start + k) * e, want + k * e, e) == 0) continue;
    if (reported + bad < AR_MAX_REPORTS)
      report_elem(c, env, what, start + k, want + k * e, buf + (start + k) * e);
    bad++;
  }
  return bad;
}

static size_t compare_all(const ar_call* c, const mp_env* env, int output, const unsigned char* buf,
                          const char* what) {
  size_t bad = 0;
  for (size_t i = 0; i < c->count; i += run_len(i, c->count))
    bad += compare_range(c, env, output, buf, i, run_len(i, c->count), bad, what);
  if (bad > 0) {
    char d[128];
    ar_describe(c, d, sizeof(d));
    mp_fail(env, "allreduce %s nranks=%d: %zu of %zu elements of %s wrong", d, env->nranks, bad,
            c->count, what);
  }
  return bad;
}

static int check_guard(const ar_call* c, const mp_env* env, const unsigned char* buf,
                       const char* what) {
  const unsigned char* g = buf + c->count * c->tab->esz;
  for (size_t k = 0; k < AR_GUARD; k++) {
    if (g[k] == AR_GUARD_BYTE) continue;
    char d[128];
    ar_describe(c, d, sizeof(d));
    mp_fail(env, "allreduce %s nranks=%d: %s written past count (guard byte %zu is 0x%02x)", d,
            env->nranks, what, k, g[k]);
    return 1;
  }
  return 0;
}

int ar_alloc(ar_call* c) {
  size_t bytes = c->count * mp_type(c->type)->size + AR_GUARD;
  c->recv = malloc(bytes);
  c->send = c->inplace ? c->recv : malloc(bytes);
  c->owns = 1;
  return c->recv && c->send ? 0 : -1;
}

int ar_prepare(ar_call* c, const mp_env* env) {
  if (alloc_tables(c, env->nranks) != 0) {
    mp_fail(env, "out of memory for reference tables");
    return -1;
  }
  fill_tables(c, env->rank);
  size_t bytes = c->count * c->tab->esz;
  if (c->inplace) c->send = c->recv;
  fill_input(c, c->send);
  memset(c->send + bytes, AR_GUARD_BYTE, AR_GUARD);
  if (!c->inplace) {
    memset(c->recv, AR_POISON, bytes);
    memset(c->recv + bytes, AR_GUARD_BYTE, AR_GUARD);
  }
  return 0;
}

int ar_tables_init(ar_call* c, const mp_env* env) {
  if (alloc_tables(c, env->nranks) != 0) {
    mp_fail(env, "out of memory for reference tables");
    return -1;
  }
  fill_tables(c, env->rank);
  return 0;
}

void ar_expect_fill(const ar_call* c, int output, size_t first, size_t len, unsigned char* out) {
  size_t end = first + len;
  for (size_t i = first; i < end; i += run_len(i, end))
    expected_run(c, output, i, run_len(i, end), out + (i - first) * c->tab->esz);
}

ncclResult_t ar_issue(const ar_call* c, ncclComm_t comm) {
  return ncclAllReduce(c->send, c->recv, c->count, c->type, c->op, comm, NULL);
}

int ar_verify(const ar_call* c, const mp_env* env) {
  size_t bad = compare_all(c, env, 1, c->recv, "recvbuff");
  bad += (size_t)check_guard(c, env, c->recv, "recvbuff");
  if (!c->inplace) {
    bad += compare_all(c, env, 0, c->send, "sendbuff (must stay unchanged)");
    bad += (size_t)check_guard(c, env, c->send, "sendbuff");
  }
  return bad ? 1 : 0;
}

void ar_release(ar_call* c) {
  if (c->tab) {
    free(c->tab->xpos);
    free(c->tab->xraw);
    free(c->tab->eraw);
    free(c->tab);
    c->tab = NULL;
  }
  if (c->owns) {
    if (c->send != c->recv) free(c->send);
    free(c->recv);
    c->send = c->recv = NULL;
    c->owns = 0;
  }
}

int ar_run(ar_call* c, const mp_env* env, ncclComm_t comm) {
  if (ar_prepare(c, env) != 0) return -1;
  ncclResult_t rc = ar_issue(c, comm);
  if (rc != ncclSuccess) {
    char d[128];
    ar_describe(c, d, sizeof(d));
    mp_fail(env, "ncclAllReduce %s nranks=%d returned %d (%s): \"%s\"", d, env->nranks, (int)rc,
            ncclGetErrorString(rc), ncclGetLastError(comm));
    ar_release(c);
    return -1;
  }
  int bad = ar_verify(c, env);
  ar_release(c);
  return bad;
}

static const ncclRedOp_t kBuiltin[AR_NKINDS] = {ncclSum, ncclProd, ncclMax,
                                                ncclMin, ncclAvg,  ncclSum};

int ar_op_create(const mp_env* env, ncclComm_t comm, ncclDataType_t type, int kind,
                 ncclRedOp_t* op) {
  if (kind != AR_PREMUL) {
    *op = kBuiltin[kind];
    return 0;
  }
  unsigned char scalar[8] = {0};
  if (mp_type(type)->is_float)
    mp_store_real(type, 0.5, scalar);
  else
    mp_store_int(type, 3u, scalar);
  ncclResult_t rc = ncclRedOpCreatePreMulSum(op, scalar, type, ncclScalarHostImmediate, comm);
  if (rc == ncclSuccess) return 0;
  mp_fail(env, "ncclRedOpCreatePreMulSum(type=%s) returned %d (%s): \"%s\"", mp_type(type)->name,
          (int)rc, ncclGetErrorString(rc), ncclGetLastError(comm));
  return -1;
}

int ar_op_destroy(const mp_env* env, ncclComm_t comm, int kind, ncclRedOp_t op) {
  if (kind != AR_PREMUL) return 0;
  return mp_expect_rc(env, comm, ncclRedOpDestroy(op, comm), ncclSuccess, "ncclRedOpDestroy");
}
