/* ncclCommSplit: colors and keys (even/odd, one comm in reverse order, ties,
 * ranks left out, singletons, nested), collectives on children and parent. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collcheck.h"
#include "launcher.h"

/* A split rule: color and key of old rank r among n. */
typedef struct rule {
  const char* name;
  int (*color)(int r, int n);
  int (*key)(int r, int n);
} rule;

static int c_parity(int r, int n) {
  (void)n;
  return r % 2;
}
static int c_zero(int r, int n) {
  (void)r, (void)n;
  return 0;
}
static int c_mod3_skip2(int r, int n) {
  (void)n;
  return r % 3 == 2 ? NCCL_SPLIT_NOCOLOR : 10 + r % 3;
}
static int c_self(int r, int n) {
  (void)n;
  return r;
}
static int c_only_last_two(int r, int n) {
  return r >= n - 2 ? 7 : NCCL_SPLIT_NOCOLOR;
}
static int c_halves(int r, int n) {
  return r < n / 2 ? 1000000 : 3;
}
static int k_rank(int r, int n) {
  (void)n;
  return r;
}
static int k_reverse(int r, int n) {
  return n - 1 - r;
}
static int k_zero(int r, int n) {
  (void)r, (void)n;
  return 0;
}
static int k_pairs(int r, int n) {
  (void)n;
  return (r / 2) % 2 ? -5 : 9; /* ties, negative keys, broken by old rank */
}
static int k_rotate(int r, int n) {
  return (r + 2) % n;
}

static const rule kRules[] = {
    {"even/odd", c_parity, k_rank},
    {"all in one, key reversed", c_zero, k_reverse},
    {"all in one, equal keys", c_zero, k_zero},
    {"r%3, rank%3==2 left out", c_mod3_skip2, k_rank},
    {"even/odd, tied keys", c_parity, k_pairs},
    {"singletons", c_self, k_zero},
    {"only the last two", c_only_last_two, k_reverse},
    {"halves, rotated keys", c_halves, k_rotate},
};
#define NRULES (sizeof(kRules) / sizeof(kRules[0]))

/* The members of rank r's new comm in new-rank order; returns their count
 * (0 when r is left out). */
static int members(const rule* ru, int n, int r, int* out) {
  int col = ru->color(r, n), m = 0;
  if (col == NCCL_SPLIT_NOCOLOR) return 0;
  for (int q = 0; q < n; q++)
    if (ru->color(q, n) == col) out[m++] = q;
  for (int i = 1; i < m; i++) /* insertion sort by (key, old rank) */
    for (int j = i; j > 0; j--) {
      int a = out[j - 1], b = out[j], ka = ru->key(a, n), kb = ru->key(b, n);
      if (ka < kb || (ka == kb && a < b)) break;
      out[j - 1] = b;
      out[j] = a;
    }
  return m;
}

static int index_of(const int* v, int m, int x) {
  for (int i = 0; i < m; i++)
    if (v[i] == x) return i;
  return -1;
}

/* Count and rank of the new comm, then: an all-gather of old ranks (the
 * order), an all-reduce, a broadcast from the last new rank, a reduce-scatter. */
static int check_child(const mp_env* env, ncclComm_t child, const rule* ru, const int* mem, int m,
                       int salt) {
  int bad = 0, count = -1, rank = -1, want = index_of(mem, m, env->rank);
  char what[160];
  snprintf(what, sizeof(what), "split \"%s\" (color %d, key %d)", ru->name,
           ru->color(env->rank, env->nranks), ru->key(env->rank, env->nranks));
  bad += mp_expect_rc(env, child, ncclCommCount(child, &count), ncclSuccess, "ncclCommCount");
  bad += mp_expect_rc(env, child, ncclCommUserRank(child, &rank), ncclSuccess, "ncclCommUserRank");
  if (count != m || rank != want) {
    mp_fail(env, "%s: new comm has %d ranks, this is rank %d; expected %d and %d", what, count,
            rank, m, want);
    return bad + 1;
  }
  int* olds = calloc((size_t)m, sizeof(int));
  int mine = env->rank;
  if (!olds) return bad + 1;
  ncclResult_t rc = ncclAllGather(&mine, olds, 1, ncclInt32, child, NULL);
  bad += mp_expect_rc(env, child, rc, ncclSuccess, "ncclAllGather of old ranks");
  for (int i = 0; i < m && rc == ncclSuccess; i++) {
    if (olds[i] == mem[i]) continue;
    mp_fail(env, "%s: new rank %d is old rank %d, expected old rank %d (order by key, old rank)",
            what, i, olds[i], mem[i]);
    bad++;
  }
  free(olds);
  mp_env sub = *env;
  sub.rank = rank;
  sub.nranks = count;
  cc_call calls[3] = {
      {.coll = CC_ALLREDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 4099 * 2 + 1},
      {.coll = CC_BROADCAST, .type = ncclFloat16, .count = 1023, .root = count - 1},
      {.coll = CC_REDUCESCATTER, .type = ncclFloat32, .kind = AR_AVG, .count = 777},
  };
  for (int i = 0; i < 3 && !bad; i++) {
    calls[i].salt = (uint64_t)salt * 16u + (uint64_t)ru->color(env->rank, env->nranks) * 4u +
                    (uint64_t)i; /* other colors compute other data */
    ar_op_create(&sub, child, calls[i].type, calls[i].kind, &calls[i].op);
    int r = cc_run(&calls[i], &sub, child);
    if (r != 0) mp_fail(env, "%s: the call above on the new comm failed", what), bad++;
  }
  return bad;
}

/* Parent still works: an all-reduce and a broadcast with the old ranks. */
static int check_parent(const mp_env* env, ncclComm_t comm, int salt) {
  cc_call a = {.coll = CC_ALLREDUCE, .type = ncclUint8, .kind = AR_MAX, .count = 5000};
  cc_call b = {.coll = CC_BROADCAST, .type = ncclInt64, .count = 333};
  a.salt = b.salt = (uint64_t)salt;
  b.root = salt % env->nranks;
  ar_op_create(env, comm, a.type, a.kind, &a.op);
  int r = cc_run(&a, env, comm);
  if (r == 0) r = cc_run(&b, env, comm);
  if (r != 0) mp_fail(env, "the parent comm failed after a split");
  return r != 0;
}

static int split_one(const mp_env* env, ncclComm_t comm, const rule* ru, int salt,
                     ncclConfig_t* cfg) {
  int n = env->nranks, mem[MP_MAX_RANKS];
  int m = members(ru, n, env->rank, mem);
  ncclComm_t child = (ncclComm_t)(uintptr_t)0x1; /* must be overwritten */
  ncclResult_t rc =
      ncclCommSplit(comm, ru->color(env->rank, n), ru->key(env->rank, n), &child, cfg);
  char what[128];
  snprintf(what, sizeof(what), "ncclCommSplit(\"%s\")", ru->name);
  if (mp_expect_rc(env, comm, rc, ncclSuccess, what)) return -1;
  if (m == 0) {
    /* the same parent calls as the ranks with a child */
    if (child == NULL)
      return check_parent(env, comm, salt + 1) || check_parent(env, comm, salt + 3);
    mp_fail(env, "%s: NCCL_SPLIT_NOCOLOR gave newcomm %p, expected NULL", what, (void*)child);
    return 1;
  }
  if (child == NULL || child == (ncclComm_t)(uintptr_t)0x1) {
    mp_fail(env, "%s: newcomm not set", what);
    return -1;
  }
  int bad = check_child(env, child, ru, mem, m, salt);
  /* a parent collective while the child exists, then the child again */
  if (!bad) bad += check_parent(env, comm, salt + 1);
  if (!bad) bad += check_child(env, child, ru, mem, m, salt + 2);
  if (bad)
    ncclCommAbort(child);
  else
    bad += mp_expect_rc(env, child, ncclCommDestroy(child), ncclSuccess, "destroy split comm");
  if (!bad) bad += check_parent(env, comm, salt + 3);
  return bad;
}

static int rules_body(const mp_env* env) {
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0;
  double t0 = mp_now();
  for (size_t i = 0; i < NRULES && !bad; i++) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 1;
    int r = split_one(env, comm, &kRules[i], (int)i * 10, i % 2 ? &cfg : NULL);
    if (r < 0) {
      ncclCommAbort(comm);
      return 1;
    }
    bad += r;
  }
  if (env->rank == 0 || bad)
    mp_log(env, "%zu splits, %d failed, %.1f s", NRULES, bad, mp_now() - t0);
  if (bad) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_rules(void** state) {
  (void)state;
  static const int sizes[] = {1, 2, 5, 8};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
    assert_int_equal(mp_launch(sizes[i], rules_body, NULL, NULL), 0);
}

/* Split of a split, two children alive at once, children used in one group,
 * then the grandparent; and many splits in a row (no leak, no hang). */
static int nested_body(const mp_env* env) {
  ncclComm_t comm, even_odd = NULL, reversed = NULL, inner = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int n = env->nranks, r = env->rank, bad = 0;
  bad += mp_expect_rc(env, comm, ncclCommSplit(comm, r % 2, r, &even_odd, NULL), ncclSuccess,
                      "split even/odd");
  bad += mp_expect_rc(env, comm, ncclCommSplit(comm, 0, n - r, &reversed, NULL), ncclSuccess,
                      "split reversed");
  if (bad) return 1;
  int sub_r = -1, sub_n = -1;
  ncclCommUserRank(even_odd, &sub_r);
  ncclCommCount(even_odd, &sub_n);
  /* inner: split of the even/odd comm, the first two of each stay */
  bad += mp_expect_rc(
      env, even_odd,
      ncclCommSplit(even_odd, sub_r < 2 ? 0 : NCCL_SPLIT_NOCOLOR, -sub_r, &inner, NULL),
      ncclSuccess, "nested split");
  if (bad) return 1;
  if ((sub_r < 2) != (inner != NULL)) {
    mp_fail(env, "nested split: newcomm %p for sub rank %d", (void*)inner, sub_r);
    return 1;
  }
  if (inner) {
    int ir = -1, in = -1;
    ncclCommUserRank(inner, &ir);
    ncclCommCount(inner, &in);
    int want_n = sub_n < 2 ? sub_n : 2;
    if (in != want_n || ir != want_n - 1 - sub_r) {
      mp_fail(env, "nested split: rank %d of %d, expected %d of %d", ir, in, want_n - 1 - sub_r,
              want_n);
      bad++;
    }
  }
  /* one group: an all-reduce on each of the three live children */
  cc_call c[3] = {
      {.coll = CC_ALLREDUCE, .type = ncclFloat32, .kind = AR_SUM, .count = 10000, .salt = 1},
      {.coll = CC_ALLGATHER, .type = ncclInt8, .count = 999, .salt = 2},
      {.coll = CC_REDUCE, .type = ncclUint64, .kind = AR_PROD, .count = 300, .salt = 3},
  };
  ncclComm_t cm[3] = {even_odd, reversed, inner};
  mp_env envs[3];
  for (int i = 0; i < 3; i++) {
    envs[i] = *env;
    if (!cm[i]) continue;
    ncclCommUserRank(cm[i], &envs[i].rank);
    ncclCommCount(cm[i], &envs[i].nranks);
    if (i != 1) c[i].salt += (uint64_t)(r % 2) * 100u; /* same within each comm */
    if (cc_is_reduction(c[i].coll)) ar_op_create(&envs[i], cm[i], c[i].type, c[i].kind, &c[i].op);
    if (cc_prepare(&c[i], &envs[i]) != 0) return 1;
  }
  bad += mp_expect_rc(env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int i = 0; i < 3; i++) {
    if (!cm[i]) continue;
    ncclResult_t rc = cc_issue(&c[i], cm[i], NULL);
    if (rc != ncclSuccess) cc_report_rc(&c[i], &envs[i], cm[i], rc), bad++;
  }
  bad += mp_expect_rc(env, NULL, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (three split comms)");
  for (int i = 0; i < 3; i++) {
    if (!cm[i]) continue;
    if (!bad) bad += cc_verify(&c[i], &envs[i]);
    cc_release(&c[i]);
  }
  /* destroy the middle generation first: inner must keep working */
  if (!bad) bad += mp_expect_rc(env, even_odd, ncclCommDestroy(even_odd), ncclSuccess, "destroy");
  if (!bad && inner) {
    mp_env ie = *env;
    ncclCommUserRank(inner, &ie.rank);
    ncclCommCount(inner, &ie.nranks);
    cc_call a = {.coll = CC_BCAST, .type = ncclFloat64, .count = 4321, .root = 0, .salt = 9};
    bad += cc_run(&a, &ie, inner) != 0;
    bad += mp_expect_rc(env, inner, ncclCommDestroy(inner), ncclSuccess, "destroy inner");
  }
  if (!bad) bad += mp_expect_rc(env, reversed, ncclCommDestroy(reversed), ncclSuccess, "destroy");
  /* many splits in a row */
  for (int i = 0; i < 20 && !bad; i++) {
    ncclComm_t t = NULL;
    bad += mp_expect_rc(env, comm, ncclCommSplit(comm, (r + i) % 3, i, &t, NULL), ncclSuccess,
                        "split in a loop");
    if (bad) break;
    int x = r + 1, sum = 0, tn = 0;
    ncclCommCount(t, &tn);
    bad += mp_expect_rc(env, t, ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, t, NULL),
                        ncclSuccess, "allreduce on a looped split");
    int want = 0;
    for (int q = 0; q < n; q++)
      if ((q + i) % 3 == (r + i) % 3) want += q + 1;
    if (!bad && sum != want) {
      mp_fail(env, "split loop %d: sum of (old rank + 1) over color %d is %d, expected %d", i,
              (r + i) % 3, sum, want);
      bad++;
    }
    bad += mp_expect_rc(env, t, ncclCommDestroy(t), ncclSuccess, "destroy looped split");
  }
  if (!bad) bad += check_parent(env, comm, 99);
  if (bad) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_nested(void** state) {
  (void)state;
  assert_int_equal(mp_launch(6, nested_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(3, nested_body, NULL, NULL), 0);
}

/* ---- bad input: rejected alike on every rank, the comm still works ---- */

static int bad_body(const mp_env* env) {
  ncclComm_t comm, child = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0;
  ncclResult_t rc = ncclCommSplit(comm, 0, env->rank, NULL, NULL);
  if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) {
    mp_fail(env, "ncclCommSplit(newcomm=NULL) returned %d (%s), expected an argument error",
            (int)rc, ncclGetErrorString(rc));
    bad++;
  } else {
    bad += mp_expect_last_error(env, comm, "ncclCommSplit(newcomm=NULL)");
  }
  rc = ncclCommSplit(NULL, 0, env->rank, &child, NULL);
  if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) {
    mp_fail(env, "ncclCommSplit(comm=NULL) returned %d (%s), expected an argument error", (int)rc,
            ncclGetErrorString(rc));
    bad++;
  } else {
    bad += mp_expect_last_error(env, NULL, "ncclCommSplit(comm=NULL)");
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0xdeadbeef;
  rc = ncclCommSplit(comm, 0, env->rank, &child, &cfg);
  if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) {
    mp_fail(env,
            "ncclCommSplit(config with a bad magic) returned %d (%s), expected an argument "
            "error",
            (int)rc, ncclGetErrorString(rc));
    bad++;
  }
  bad += check_parent(env, comm, 5);
  /* and a good split afterwards */
  rc = ncclCommSplit(comm, 0, env->rank, &child, NULL);
  bad += mp_expect_rc(env, comm, rc, ncclSuccess, "ncclCommSplit after rejected calls");
  if (rc == ncclSuccess) {
    cc_call a = {.coll = CC_ALLREDUCE, .type = ncclInt64, .kind = AR_SUM, .count = 100, .salt = 3};
    bad += cc_run(&a, env, child) != 0;
    bad += mp_expect_rc(env, child, ncclCommDestroy(child), ncclSuccess, "destroy");
  }
  if (bad) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_bad_input(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, bad_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rules),
      cmocka_unit_test(test_nested),
      cmocka_unit_test(test_bad_input),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
