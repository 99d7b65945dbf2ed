/* Node layouts faked with NCCL_HOSTID (1x4, 2x2, 2x3, 3+2+2, 4x1, and
 * ranks interleaved over nodes): every collective exact under every
 * algorithm forced and automatic, over shared memory inside a node and TCP
 * between nodes, and again with NCCL_SHM_DISABLE=1. No segment is left in
 * /dev/shm afterwards. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
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

typedef struct layout_case {
  const char* name;
  int nranks;
  int node_of[8];
  const char* algo; /* NULL: automatic */
  int shm_disable;
} layout_case;

static const size_t kCounts[] = {1, 1023, 70001};
static const ncclDataType_t kTypes[] = {ncclFloat32, ncclInt32, ncclBfloat16, ncclFloat64};

/* Every collective on a few counts and types, in and out of place. */
static int run_calls(const mp_env* env, ncclComm_t comm, const layout_case* lc) {
  int bad = 0, i = 0;
  for (int coll = 0; coll < CC_NCOLLS; coll++)
    for (size_t c = 0; c < sizeof(kCounts) / sizeof(kCounts[0]); c++, i++) {
      cc_call call = {.coll = coll,
                      .type = kTypes[(size_t)i % (sizeof(kTypes) / sizeof(kTypes[0]))],
                      .count = kCounts[c],
                      .root = (i + 1) % env->nranks,
                      .inplace = i & 1,
                      .salt = (uint64_t)i,
                      .kind = cc_is_reduction(coll) ? i % AR_NKINDS : AR_SUM};
      if (cc_is_reduction(coll) && ar_op_create(env, comm, call.type, call.kind, &call.op))
        return 1;
      int r = cc_run(&call, env, comm);
      if (cc_is_reduction(coll)) ar_op_destroy(env, comm, call.kind, call.op);
      if (r != 0) {
        mp_fail(env, "layout %s NCCL_ALGO=%s shm %s: the call above was not exact", lc->name,
                lc->algo ? lc->algo : "(auto)", lc->shm_disable ? "off" : "on");
        if (r < 0) return 1;
        bad++;
      }
    }
  return bad;
}

static int layout_body(const mp_env* env) {
  const layout_case* lc = env->arg;
  char host[32];
  snprintf(host, sizeof(host), "fakenode%d", lc->node_of[env->rank]);
  setenv("NCCL_HOSTID", host, 1);
  if (lc->algo)
    setenv("NCCL_ALGO", lc->algo, 1);
  else
    unsetenv("NCCL_ALGO");
  if (lc->shm_disable) setenv("NCCL_SHM_DISABLE", "1", 1);
  ncclComm_t comm;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = run_calls(env, comm, lc);
  if (bad && bad < 100) {
    ncclCommAbort(comm);
    return 1;
  }
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

/* Braid's segments in /dev/shm are named "braid-<creator pid>-...". A
 * leftover is one whose creator is gone; names seen before the launch
 * (an earlier crash, other users) are not this test's. */
#define MAX_SEEN 256
typedef struct shm_names {
  int n;
  char name[MAX_SEEN][256];
} shm_names;

static void shm_list(shm_names* s) {
  DIR* d = opendir("/dev/shm");
  struct dirent* e;
  s->n = 0;
  while (d && (e = readdir(d)) != NULL && s->n < MAX_SEEN)
    if (strncmp(e->d_name, "braid-", 6) == 0)
      snprintf(s->name[s->n++], sizeof(s->name[0]), "%s", e->d_name);
  if (d) closedir(d);
}

static int shm_leftovers(const shm_names* before) {
  shm_names* now = malloc(sizeof(*now));
  int leaks = 0;
  shm_list(now);
  for (int i = 0; i < now->n; i++) {
    int seen = 0, pid = atoi(now->name[i] + 6);
    for (int j = 0; j < before->n && !seen; j++) seen = strcmp(before->name[j], now->name[i]) == 0;
    if (!seen && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) {
      fprintf(stderr, "leftover shared-memory segment /dev/shm/%s\n", now->name[i]);
      leaks++;
    }
  }
  free(now);
  return leaks;
}

static const layout_case kLayouts[] = {
    {"1x4", 4, {0, 0, 0, 0}, NULL, 0},       {"2x2", 4, {0, 0, 1, 1}, NULL, 0},
    {"2x3", 6, {0, 0, 0, 1, 1, 1}, NULL, 0}, {"3+2+2", 7, {0, 0, 0, 1, 1, 2, 2}, NULL, 0},
    {"4x1", 4, {0, 1, 2, 3}, NULL, 0},       {"2x2 interleaved", 4, {0, 1, 0, 1}, NULL, 0},
};
#define NLAYOUTS (sizeof(kLayouts) / sizeof(kLayouts[0]))

static void run_layouts(const char* algo, int shm_disable) {
  for (size_t i = 0; i < NLAYOUTS; i++) {
    layout_case lc = kLayouts[i];
    lc.algo = algo;
    lc.shm_disable = shm_disable;
    shm_names* before = malloc(sizeof(*before));
    shm_list(before);
    assert_int_equal(mp_launch(lc.nranks, layout_body, &lc, NULL), 0);
    assert_int_equal(shm_leftovers(before), 0);
    free(before);
  }
}

static void test_auto(void** state) {
  (void)state;
  run_layouts(NULL, 0);
}
static void test_ring(void** state) {
  (void)state;
  run_layouts("Ring", 0);
}
static void test_tree(void** state) {
  (void)state;
  run_layouts("Tree", 0);
}
static void test_recdoubling(void** state) {
  (void)state;
  run_layouts("RecDoubling", 0);
}
static void test_hier(void** state) {
  (void)state;
  run_layouts("Hier", 0);
}
/* TCP everywhere: same answers. */
static void test_shm_disabled(void** state) {
  (void)state;
  run_layouts(NULL, 1);
  run_layouts("Hier", 1);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_auto), cmocka_unit_test(test_ring),
      cmocka_unit_test(test_tree), cmocka_unit_test(test_recdoubling),
      cmocka_unit_test(test_hier), cmocka_unit_test(test_shm_disabled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
