/* NCCL_ALGO forced to each algorithm (and lists, exclusions, unset): all-reduce,
 * broadcast and reduce stay exact, and inexact float results agree bitwise. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cmocka.h>

#include "collcheck.h"
#include "dtypes.h"
#include "launcher.h"

#define BIG_COUNT ((size_t)(1u << 20) + 3)

typedef struct algo_case {
  const char* algo; /* NULL: NCCL_ALGO unset */
  int nranks;
} algo_case;

typedef struct algo_state {
  const mp_env* env;
  const char* algo;
  ncclComm_t comm;
  int round; /* cc_same_everywhere rounds */
  int calls;
} algo_state;

static const char* algo_name(const char* a) {
  return a ? a : "(unset)";
}

/* ---- exact results (archeck/collcheck references) ---- */

static const size_t kExactCounts[] = {1, 7, 1023, 65537, BIG_COUNT};
static const ncclDataType_t kExactTypes[] = {ncclFloat32, ncclInt32,     ncclBfloat16,
                                             ncclUint8,   ncclFloat64,   ncclFloat16,
                                             ncclInt64,   ncclFloat8e4m3};
#define NEXACT_TYPES (sizeof(kExactTypes) / sizeof(kExactTypes[0]))

static int exact_calls(algo_state* s) {
  static const int colls[] = {CC_ALLREDUCE, CC_BROADCAST, CC_BCAST, CC_REDUCE};
  int bad = 0, n = s->env->nranks;
  for (size_t ci = 0; ci < sizeof(kExactCounts) / sizeof(kExactCounts[0]); ci++) {
    for (size_t k = 0; k < sizeof(colls) / sizeof(colls[0]); k++) {
      for (int v = 0; v < 2; v++) {
        int i = s->calls++;
        cc_call c = {.coll = colls[k], .count = kExactCounts[ci], .salt = (uint64_t)i};
        c.type = kExactTypes[(size_t)(i * 3 + v) % NEXACT_TYPES];
        if (kExactCounts[ci] == BIG_COUNT && v) continue; /* one big call each */
        c.kind = v ? (i % AR_NKINDS) : AR_SUM;
        c.root = v ? n - 1 : (int)(ci % (size_t)n);
        c.inplace = (i + v) & 1;
        if (cc_is_reduction(c.coll) && ar_op_create(s->env, s->comm, c.type, c.kind, &c.op))
          return 1;
        int r = cc_run(&c, s->env, s->comm);
        if (cc_is_reduction(c.coll)) ar_op_destroy(s->env, s->comm, c.kind, c.op);
        if (r != 0) {
          mp_fail(s->env, "NCCL_ALGO=%s: the call above was not exact", algo_name(s->algo));
          if (r < 0) return -1;
          bad++;
        }
      }
    }
  }
  return bad;
}

/* ---- inexact floats: bitwise agreement and an error bound ---- */

static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* Rank r's element i, already representable in type t; signed zeros often. */
static double rand_value(ncclDataType_t t, uint64_t seed, int r, size_t i) {
  uint64_t h = mix64(seed ^ mix64(((uint64_t)r << 40) ^ i));
  if ((h & 7) == 0) return (h & 8) ? 0.0 : -0.0;
  double v = ((double)(h >> 11) / 9007199254740992.0 - 0.5) * (double)(1u << ((h >> 4) % 12));
  unsigned char b[8];
  mp_store_real(t, v, b);
  return mp_load_real(t, b);
}

static double unit_roundoff(ncclDataType_t t) {
  switch (t) {
    case ncclFloat64:
      return ldexp(1.0, -53);
    case ncclFloat32:
      return ldexp(1.0, -24);
    case ncclFloat16:
      return ldexp(1.0, -11);
    default:
      return ldexp(1.0, -8); /* bf16 */
  }
}

static double tiny_abs(ncclDataType_t t) {
  return t == ncclFloat16 ? ldexp(1.0, -23) : t == ncclBfloat16 ? ldexp(1.0, -130) : 1e-300;
}

/* Checks element i of a sum/avg/max/min result against the exact value. */
static int within_bound(ncclDataType_t t, ncclRedOp_t op, int n, uint64_t seed, size_t i,
                        double got, double* want_out, double* tol_out) {
  long double sum = 0, abs = 0; /* the reference's own error is far below tol */
  double mx = -INFINITY, mn = INFINITY;
  for (int r = 0; r < n; r++) {
    double v = rand_value(t, seed, r, i);
    sum += v;
    abs += fabsl(v);
    mx = v > mx ? v : mx;
    mn = v < mn ? v : mn;
  }
  double u = unit_roundoff(t), want, tol;
  /* any order of n - 1 roundings of partial sums (plus a scaling for avg) */
  if (op == ncclMax || op == ncclMin) {
    want = op == ncclMax ? mx : mn;
    tol = 0; /* exact; +0 and -0 compare equal here */
  } else if (op == ncclAvg) {
    want = (double)(sum / n);
    tol = (double)((2 * n + 4) * u * abs / n) + tiny_abs(t) * n;
  } else {
    want = (double)sum;
    tol = (double)((2 * n + 2) * u * abs) + tiny_abs(t) * n;
  }
  *want_out = want;
  *tol_out = tol;
  return fabs(got - want) <= tol;
}

typedef struct rand_spec {
  ncclDataType_t type;
  ncclRedOp_t op;
  size_t count;
} rand_spec;

static const rand_spec kRand[] = {
    {ncclFloat32, ncclSum, 7},         {ncclFloat32, ncclSum, 100003},
    {ncclFloat32, ncclAvg, 1000},      {ncclFloat32, ncclMax, 1000},
    {ncclFloat32, ncclSum, BIG_COUNT}, {ncclFloat64, ncclSum, 100003},
    {ncclFloat64, ncclMin, 7},         {ncclFloat16, ncclSum, 1000},
    {ncclFloat16, ncclAvg, 100003},    {ncclFloat16, ncclMax, 100003},
    {ncclBfloat16, ncclSum, 65537},    {ncclBfloat16, ncclMin, 1000},
    {ncclBfloat16, ncclAvg, 7},
};
#define NRAND (sizeof(kRand) / sizeof(kRand[0]))

/* One inexact all-reduce (or reduce to root when `root` >= 0). */
static int rand_call(algo_state* s, const rand_spec* sp, int root, uint64_t seed) {
  const mp_env* env = s->env;
  size_t e = mp_type(sp->type)->size, n = sp->count;
  unsigned char *in = malloc(n * e + 1), *out = malloc(n * e + 1);
  int bad = 0;
  if (!in || !out) {
    free(in);
    free(out);
    return -1;
  }
  for (size_t i = 0; i < n; i++)
    mp_store_real(sp->type, rand_value(sp->type, seed, env->rank, i), in + i * e);
  memset(out, 0xA5, n * e);
  char what[160];
  snprintf(what, sizeof(what), "NCCL_ALGO=%s %s type=%s op=%s count=%zu nranks=%d random floats",
           algo_name(s->algo), root < 0 ? "allreduce" : "reduce", mp_type(sp->type)->name,
           mp_op_name(sp->op), n, env->nranks);
  ncclResult_t rc = root < 0 ? ncclAllReduce(in, out, n, sp->type, sp->op, s->comm, NULL)
                             : ncclReduce(in, out, n, sp->type, sp->op, root, s->comm, NULL);
  if (mp_expect_rc(env, s->comm, rc, ncclSuccess, what)) {
    free(in);
    free(out);
    return -1;
  }
  if (root < 0 || env->rank == root) {
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
      double want, tol, got = mp_load_real(sp->type, out + i * e);
      if (within_bound(sp->type, sp->op, env->nranks, seed, i, got, &want, &tol)) continue;
      if (wrong++ < 4)
        mp_fail(env, "%s root=%d: recvbuff[%zu] expected %.9g (+-%.3g) got %.9g", what, root, i,
                want, tol, got);
    }
    if (wrong) mp_fail(env, "%s: %zu of %zu elements out of bounds", what, wrong, n), bad++;
  }
  if (root < 0) bad += cc_same_everywhere(env, cc_hash(out, n * e), s->round++, what);
  free(in);
  free(out);
  return bad;
}

static int random_calls(algo_state* s) {
  int bad = 0;
  for (size_t k = 0; k < NRAND; k++) {
    uint64_t seed = mix64(0xa1905ull + k * 7919u + (uint64_t)s->env->nranks);
    int r = rand_call(s, &kRand[k], -1, seed);
    if (r < 0) return -1;
    bad += r;
    if (kRand[k].count == BIG_COUNT) continue;
    r = rand_call(s, &kRand[k], (int)(k % (size_t)s->env->nranks), seed ^ 1);
    if (r < 0) return -1;
    bad += r;
  }
  /* broadcast of random bits (NaNs included): every rank must hold root's */
  size_t n = 100003 * 4;
  int root = 1 % s->env->nranks;
  unsigned char* buf = malloc(n);
  if (!buf) return -1;
  for (size_t i = 0; i < n; i++) buf[i] = s->env->rank == root ? (unsigned char)mix64(i) : 0;
  ncclResult_t rc = ncclBcast(buf, n / 4, ncclFloat32, root, s->comm, NULL);
  if (mp_expect_rc(s->env, s->comm, rc, ncclSuccess, "ncclBcast random bits")) bad++;
  for (size_t i = 0; i < n && rc == ncclSuccess; i++) {
    if (buf[i] == (unsigned char)mix64(i)) continue;
    mp_fail(s->env,
            "NCCL_ALGO=%s bcast float count=%zu root=%d: byte %zu expected 0x%02x got 0x%02x",
            algo_name(s->algo), n / 4, root, i, (unsigned char)mix64(i), buf[i]);
    bad++;
    break;
  }
  bad += cc_same_everywhere(s->env, cc_hash(buf, n), s->round++, "bcast random bits");
  free(buf);
  return bad;
}

/* ---- which algorithm ran: the tuner's INFO lines (NCCL_DEBUG_SUBSYS=TUNING) ---- */

static const char* const kAlgoNames[] = {"Ring", "Tree", "RecDoubling", "Hier"};
#define NALGOS 4
static char g_log_pattern[256]; /* NCCL_DEBUG_FILE we set, "" when the user set NCCL_DEBUG */

/* NCCL_ALGO's mask the way NCCL reads it; all when unset. */
static unsigned parse_algos(const char* s) {
  unsigned named = 0, all = (1u << NALGOS) - 1;
  if (!s || !*s) return all;
  int ex = s[0] == '^';
  for (const char* p = s + ex; *p;) {
    size_t n = strcspn(p, ",");
    for (int a = 0; a < NALGOS; a++)
      if (strlen(kAlgoNames[a]) == n && strncasecmp(p, kAlgoNames[a], n) == 0) named |= 1u << a;
    p += n + (p[n] == ',');
  }
  return ex ? all & ~named : named;
}

static FILE* open_log(int pid) {
  char path[300];
  const char* at = strstr(g_log_pattern, "%p");
  if (!at) return NULL;
  snprintf(path, sizeof(path), "%.*s%d%s", (int)(at - g_log_pattern), g_log_pattern, pid, at + 2);
  return fopen(path, "r");
}

/* Every logged choice for this process must be an allowed algorithm, or Ring
 * for a collective no allowed one implements; a single forced algorithm must
 * show up at least once. No lines at all (format changed): a note only. */
static int algo_used(algo_state* s) {
  if (!g_log_pattern[0] || s->env->nranks < 2) return 0;
  unsigned allowed = parse_algos(s->algo), seen = 0;
  int lines = 0, bad = 0;
  char me[32], line[1024];
  snprintf(me, sizeof(me), ":%d:", (int)getpid());
  int pids[2] = {(int)getpid(), (int)getppid()};
  for (int f = 0; f < 2; f++) {
    FILE* fp = open_log(pids[f]);
    while (fp && fgets(line, sizeof(line), fp)) {
      const char* m = strstr(line, " NCCL INFO ");
      const char* nr = strstr(line, " bytes nranks ");
      if (!m || !nr || !strstr(line, me)) continue;
      line[strcspn(line, "\n")] = '\0';
      char coll[32] = "", algo[32] = "";
      const char* colon = strchr(nr, ':');
      if (sscanf(m + 11, "%31s", coll) != 1 || !colon || sscanf(colon + 1, "%31s", algo) != 1)
        continue;
      int a = -1;
      for (int k = 0; k < NALGOS; k++)
        if (strcmp(algo, kAlgoNames[k]) == 0) a = k;
      lines++;
      if (a >= 0) seen |= 1u << a;
      if (a >= 0 && ((allowed >> a) & 1)) continue;
      if (a == 0 && strcmp(coll, "AllReduce") != 0) continue; /* ring: the universal fallback */
      if (bad++ < 3)
        mp_fail(s->env, "NCCL_ALGO=%s but the tuner chose %s for %s: %s", algo_name(s->algo), algo,
                coll, line);
    }
    if (fp) fclose(fp);
  }
  if (lines == 0) {
    if (s->env->rank == 0)
      mp_log(s->env, "note: no tuner lines in the debug log; choice unchecked");
    return 0;
  }
  if (s->algo && s->algo[0] != '^' && !strchr(s->algo, ',') && !(seen & allowed)) {
    mp_fail(s->env, "NCCL_ALGO=%s: %d tuner choices logged, none of them %s", s->algo, lines,
            s->algo);
    bad++;
  }
  return bad != 0;
}

/* A WARN saying NCCL_ALGO was not understood means the choice was ignored. */
static int algo_accepted(algo_state* s) {
  const char* le = ncclGetLastError(NULL);
  if (!le || !strstr(le, "NCCL_ALGO")) return 0;
  mp_fail(s->env, "NCCL_ALGO=%s was not accepted: \"%s\"", algo_name(s->algo), le);
  return 1;
}

static int algo_body(const mp_env* env) {
  const algo_case* ac = env->arg;
  if (ac->algo)
    setenv("NCCL_ALGO", ac->algo, 1);
  else
    unsetenv("NCCL_ALGO");
  algo_state s = {.env = env, .algo = ac->algo};
  if (mp_comm_init(env, &s.comm) != 0) return 1;
  double t0 = mp_now();
  int bad = 0, r = exact_calls(&s);
  if (r >= 0) {
    bad += r + algo_accepted(&s);
    r = random_calls(&s);
  }
  if (r < 0) {
    ncclCommAbort(s.comm);
    return 1;
  }
  bad += r + algo_used(&s);
  bad += mp_expect_rc(env, s.comm, ncclCommDestroy(s.comm), ncclSuccess, "ncclCommDestroy");
  if (env->rank == 0 || bad)
    mp_log(env, "NCCL_ALGO=%s: %d exact calls, %d compared, %d failed, %.1f s", algo_name(ac->algo),
           s.calls, s.round, bad, mp_now() - t0);
  return bad != 0;
}

static void run_algo(const char* algo) {
  static const int sizes[] = {2, 3, 5, 8};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    algo_case c = {algo, sizes[i]};
    assert_int_equal(mp_launch(sizes[i], algo_body, &c, NULL), 0);
  }
}

static void test_ring(void** state) {
  (void)state;
  run_algo("Ring");
}
static void test_tree(void** state) {
  (void)state;
  run_algo("Tree");
}
static void test_recdoubling(void** state) {
  (void)state;
  run_algo("RecDoubling");
}
static void test_auto(void** state) {
  (void)state;
  run_algo(NULL);
}

/* Lists, exclusions and case: fewer sizes. */
static void test_lists(void** state) {
  (void)state;
  static const algo_case cases[] = {{"^Ring", 3}, {"Ring,Tree", 5}, {"^Tree", 4},
                                    {"tree", 3},  {"ring", 6},      {"^RecDoubling", 5}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    assert_int_equal(mp_launch(cases[i].nranks, algo_body, (void*)&cases[i], NULL), 0);
}

/* NCCL_ALGO is read once, at the first collective: changing it afterwards
 * changes nothing (every later choice stays Ring). */
static int read_once_body(const mp_env* env) {
  setenv("NCCL_ALGO", "Ring", 1);
  algo_state s = {.env = env, .algo = "Ring"};
  if (mp_comm_init(env, &s.comm) != 0) return 1;
  int bad = 0, x = env->rank, sum = -1;
  bad += mp_expect_rc(env, s.comm, ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, s.comm, NULL),
                      ncclSuccess, "first allreduce");
  setenv("NCCL_ALGO", "Tree", 1);
  int r = exact_calls(&s);
  if (r < 0) {
    ncclCommAbort(s.comm);
    return 1;
  }
  bad += r + algo_used(&s);
  bad += mp_expect_rc(env, s.comm, ncclCommDestroy(s.comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_read_once(void** state) {
  (void)state;
  assert_int_equal(mp_launch(4, read_once_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  if (!getenv("NCCL_DEBUG")) { /* log the tuner's choices to check them */
    snprintf(g_log_pattern, sizeof(g_log_pattern), "/tmp/braid_test_algos.%d.%%p.log",
             (int)getpid());
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
    setenv("NCCL_DEBUG_FILE", g_log_pattern, 1);
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring), cmocka_unit_test(test_tree),  cmocka_unit_test(test_recdoubling),
      cmocka_unit_test(test_auto), cmocka_unit_test(test_lists), cmocka_unit_test(test_read_once),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  if (g_log_pattern[0]) { /* the files of this process and of every child */
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -f /tmp/braid_test_algos.%d.*.log", (int)getpid());
    if (system(cmd) != 0) fprintf(stderr, "could not remove the debug logs\n");
  }
  return rc;
}
