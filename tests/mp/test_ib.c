/* The verbs transport (NET/IB) under the verbs emulation: ranks of one host
 * made to talk over the network (NCCL_SHM_DISABLE=1, NCCL_NET=IB,
 * BRAID_IBVERBS_LIB naming build/tests/fakeverbs/libibverbs.so.1): every
 * collective x types x ops x counts x in place on 1..8 ranks on Ring,
 * Tree and the tuner's choice, groups of send/recv, a size mismatch
 * reported by the receiver, faults the NIC reports (a remote access error,
 * retry exceeded, a fatal event, a receiver-not-ready), a killed peer: every rank gets an
 * error, none hangs, none succeeds with wrong data. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include "collcheck.h"
#include "dtypes.h"
#include "launcher.h"

static const ncclDataType_t kTypes[] = {ncclFloat32, ncclInt8,    ncclFloat16, ncclBfloat16,
                                        ncclUint64,  ncclFloat64, ncclInt32,   ncclFloat8e5m2};
#define NTYPES (sizeof(kTypes) / sizeof(kTypes[0]))
static const size_t kCounts[] = {0, 1, 1001, 300007};
#define NCOUNTS (sizeof(kCounts) / sizeof(kCounts[0]))

/* Every rank on the emulated HCA, over the network. */
static void ib_env(void) {
  setenv("BRAID_IBVERBS_LIB", "build/tests/fakeverbs/libibverbs.so.1", 1);
  setenv("FAKEVERBS_HCAS", "mlx5_0:1", 1);
  setenv("NCCL_NET", "IB", 1);
  setenv("NCCL_SHM_DISABLE", "1", 1);
}

/* ---- The matrix ---- */

static const char* const kAlgos[] = {NULL, "Ring", "Tree"};

static int matrix_body(const mp_env* env) {
  const char* algo = kAlgos[(size_t)env->nranks % 3];
  ncclComm_t comm;
  int bad = 0, i = 0;
  ib_env();
  if (algo) setenv("NCCL_ALGO", algo, 1);
  if (mp_comm_init(env, &comm)) return 1;
  for (int coll = 0; coll < CC_NCOLLS && !bad; coll++)
    for (size_t ci = 0; ci < NCOUNTS && !bad; ci++)
      for (int ip = 0; ip < 2 && !bad; ip++, i++) {
        cc_call c = {.coll = coll, .type = kTypes[i % NTYPES], .count = kCounts[ci]};
        c.kind = cc_is_reduction(coll) ? i % AR_NKINDS : AR_SUM;
        c.root = cc_has_root(coll) ? (i / 2) % env->nranks : 0;
        c.inplace = ip && coll != CC_ALLTOALL;
        c.salt = (uint64_t)i;
        if (cc_is_reduction(coll) && ar_op_create(env, comm, c.type, c.kind, &c.op)) return 1;
        int r = cc_run(&c, env, comm);
        bad += r != 0;
        if (c.kind == AR_PREMUL) ncclRedOpDestroy(c.op, comm);
      }
  if (env->rank == 0)
    mp_log(env, "NET/IB matrix on %d ranks (%s): %s", env->nranks, algo ? algo : "tuner",
           bad ? "FAILED" : "ok");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_matrix(void** state) {
  (void)state;
  for (int n = 1; n <= 4; n++) assert_int_equal(mp_launch(n, matrix_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(8, matrix_body, NULL, NULL), 0);
}

/* ---- send/recv groups, and a size mismatch ---- */

#define P2P_COUNT 70001

/* Each rank sends to every other in one group, sizes differing by pair. */
static int p2p_body(const mp_env* env) {
  ncclComm_t comm;
  int n = env->nranks, bad = 0;
  ib_env();
  if (mp_comm_init(env, &comm)) return 1;
  int32_t** out = calloc((size_t)n, sizeof(*out));
  int32_t** in = calloc((size_t)n, sizeof(*in));
  for (int p = 0; p < n; p++) {
    size_t cnt = P2P_COUNT + (size_t)p * 13 + (size_t)env->rank;
    out[p] = malloc(P2P_COUNT * 2 * sizeof(int32_t));
    in[p] = malloc(P2P_COUNT * 2 * sizeof(int32_t));
    for (size_t k = 0; k < cnt; k++) out[p][k] = env->rank * 1000003 + p * 7919 + (int32_t)k;
  }
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int p = 0; p < n; p++) {
    if (p == env->rank) continue;
    ncclSend(out[p], P2P_COUNT + (size_t)p * 13 + (size_t)env->rank, ncclInt32, p, comm, NULL);
    ncclRecv(in[p], P2P_COUNT + (size_t)env->rank * 13 + (size_t)p, ncclInt32, p, comm, NULL);
  }
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
  for (int p = 0; p < n && !bad; p++) {
    if (p == env->rank) continue;
    size_t cnt = P2P_COUNT + (size_t)env->rank * 13 + (size_t)p;
    for (size_t k = 0; k < cnt && !bad; k++)
      if (in[p][k] != p * 1000003 + env->rank * 7919 + (int32_t)k)
        mp_fail(env, "from rank %d: [%zu] = %d", p, k, in[p][k]), bad++;
  }
  for (int p = 0; p < n; p++) free(out[p]), free(in[p]);
  free(out), free(in);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

/* Rank 1 receives more than rank 0 sends: rank 1's call fails with
 * ncclInvalidUsage ("Message truncated"), its buffer untouched. */
static int mismatch_body(const mp_env* env) {
  ncclComm_t comm;
  int bad = 0;
  int32_t buf[64];
  ib_env();
  if (mp_comm_init(env, &comm)) return 1;
  for (int k = 0; k < 64; k++) buf[k] = env->rank ? -1 : k;
  ncclResult_t rc = env->rank == 0 ? ncclSend(buf, 32, ncclInt32, 1, comm, NULL)
                                   : ncclRecv(buf, 40, ncclInt32, 0, comm, NULL);
  if (env->rank == 1) {
    bad += mp_expect_rc(env, comm, rc, ncclInvalidUsage, "a receive larger than its send");
    for (int k = 0; k < 64 && !bad; k++)
      if (buf[k] != -1) mp_fail(env, "[%d] written: %d", k, buf[k]), bad++;
  }
  ncclCommAbort(comm);
  return bad;
}

static void test_p2p(void** state) {
  (void)state;
  assert_int_equal(mp_launch(4, p2p_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(2, mismatch_body, NULL, NULL), 0);
}

/* ---- Registered buffers, and a slow HCA ---- */

#define REG_SLICE (1 << 18)
#define REG_SLICES 8

/* The emulation's test hooks beside the verbs. */
static void* hook(const char* name) {
  void* lib = dlopen(getenv("BRAID_IBVERBS_LIB"), RTLD_NOW | RTLD_NOLOAD);
  return lib ? dlsym(lib, name) : NULL;
}

/* How many regions this process registered so far. */
static uint64_t registrations(void) {
  uint64_t (*count)(void) = (uint64_t(*)(void))hook("fakeverbs_registrations");
  return count ? count() : UINT64_MAX;
}

/* How many live regions overlap [p, p + bytes) (-1: no hook). */
static int registered_on(const void* p, size_t bytes) {
  int (*count)(const void*, size_t) = (int (*)(const void*, size_t))hook("fakeverbs_registered");
  return count ? count(p, bytes) : -1;
}

/* All-reduces on REG_SLICES slices of buf at offsets no earlier slice's
 * registration covers; how many registrations they made. */
static uint64_t slices_allreduce(const mp_env* env, ncclComm_t comm, float* buf, int* bad) {
  uint64_t before = registrations();
  for (int k = 0; k < REG_SLICES; k++) {
    float* x = buf + (size_t)k * (REG_SLICE + 4096);
    *bad +=
        mp_expect_rc(env, comm, ncclAllReduce(x, x, REG_SLICE, ncclFloat32, ncclSum, comm, NULL),
                     ncclSuccess, "allreduce on a slice");
  }
  return registrations() - before;
}

/* A buffer given to ncclCommRegister is registered once, at registration:
 * calls on any part of it register nothing more, and its deregistration
 * leaves nothing pinned. A buffer nobody registered goes through bounce
 * slots (messages of a pipeline chunk): nothing registered on it, during
 * or after. With FAKEVERBS_DELAY_US on one rank (a slow HCA) the results
 * stay right. */
static int registered_body(const mp_env* env) {
  ncclComm_t comm;
  void* handle = NULL;
  int bad = 0;
  size_t bytes = (size_t)REG_SLICES * (REG_SLICE + 4096) * sizeof(float);
  float *a = calloc(1, bytes), *b = calloc(1, bytes);
  ib_env();
  if (env->rank == 1) setenv("FAKEVERBS_DELAY_US", "200", 1);
  if (a == NULL || b == NULL || mp_comm_init(env, &comm)) return 1;
  for (size_t i = 0; i < bytes / sizeof(float); i++) a[i] = b[i] = (float)(i % 7);
  (void)slices_allreduce(env, comm, b, &bad); /* the slots are registered by now */
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, a, bytes, &handle), ncclSuccess,
                      "ncclCommRegister");
  uint64_t on_registered = slices_allreduce(env, comm, a, &bad);
  uint64_t on_plain = slices_allreduce(env, comm, b + 1024, &bad);
  if (on_registered != 0 || on_plain != 0 || registered_on(b, bytes) != 0)
    mp_fail(env,
            "registrations: %llu on the registered buffer, %llu on another (0 expected), %d "
            "left on it",
            (unsigned long long)on_registered, (unsigned long long)on_plain,
            registered_on(b, bytes)),
        bad++;
  for (int k = 0; k < REG_SLICES && !bad; k++) /* i % 7 summed over 2 ranks, once */
    for (size_t i = (size_t)k * (REG_SLICE + 4096); i < (size_t)k * (REG_SLICE + 4096) + REG_SLICE;
         i += 4099)
      if (a[i] != 2.0f * (float)(i % 7)) mp_fail(env, "[%zu] = %g", i, a[i]), bad++;
  bad += mp_expect_rc(env, comm, ncclCommDeregister(comm, handle), ncclSuccess, "deregister");
  if (registered_on(a, bytes) != 0)
    mp_fail(env, "%d registrations left on a deregistered buffer", registered_on(a, bytes)), bad++;
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  free(a), free(b);
  return bad;
}

static void test_registered(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, registered_body, NULL, NULL), 0);
}

/* ---- Large messages, a buffer mapped again, QPs per connection ---- */

#define BIG_BYTES ((size_t)(4 << 20) + 12345)

/* Both ranks send each other BIG_BYTES of `seed`'s pattern from one
 * mapping to another and check what came. */
static int big_exchange(const mp_env* env, ncclComm_t comm, unsigned char* out, unsigned char* in,
                        unsigned seed) {
  int peer = 1 - env->rank, bad = 0;
  for (size_t i = 0; i < BIG_BYTES; i++) out[i] = (unsigned char)(i * 31 + seed * 7 + env->rank);
  memset(in, 0, BIG_BYTES);
  bad += mp_sendrecv(env, comm, out, in, BIG_BYTES, peer, peer);
  for (size_t i = 0; i < BIG_BYTES && !bad; i++)
    if (in[i] != (unsigned char)(i * 31 + seed * 7 + peer))
      mp_fail(env, "round %u: byte %zu is %u", seed, i, in[i]), bad++;
  return bad;
}

static void* map_at(void* where) {
  void* p = mmap(where, 2 * BIG_BYTES, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (where ? MAP_FIXED_NOREPLACE : 0), -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Messages larger than a bounce slot are registered while they are out,
 * and no longer: after the call nothing is left pinned on the buffer, so
 * the program may unmap it and map new pages at the same address, and
 * the next call moves the new pages' bytes. arg: NCCL_IB_QPS_PER_CONNECTION;
 * with several, every QP carries writes (the messages are striped). */
static int big_body(const mp_env* env) {
  ncclComm_t comm;
  int bad = 0, qps = atoi(env->arg);
  ib_env();
  setenv("NCCL_IB_QPS_PER_CONNECTION", env->arg, 1);
  unsigned char* buf = map_at(NULL);
  if (buf == NULL || mp_comm_init(env, &comm)) return 1;
  uint64_t before = registrations();
  bad += big_exchange(env, comm, buf, buf + BIG_BYTES, 1);
  if (registrations() == before || registered_on(buf, 2 * BIG_BYTES) != 0)
    mp_fail(env, "%llu registrations made, %d left on the buffer after the call",
            (unsigned long long)(registrations() - before), registered_on(buf, 2 * BIG_BYTES)),
        bad++;
  munmap(buf, 2 * BIG_BYTES);
  if (map_at(buf) != buf) mp_fail(env, "cannot map the same address again"), bad++;
  if (!bad) bad += big_exchange(env, comm, buf, buf + BIG_BYTES, 2);
  int (*writing)(void) = (int (*)(void))hook("fakeverbs_qps_writing");
  int busy = writing ? writing() : -1;
  if (qps > 1 && busy < qps) mp_fail(env, "%d QPs wrote, with %d per connection", busy, qps), bad++;
  mp_log(env, "%d QPs per connection: %d QPs wrote", qps, busy);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  munmap(buf, 2 * BIG_BYTES);
  return bad;
}

static void test_big_messages(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, big_body, "1", NULL), 0);
  assert_int_equal(mp_launch(2, big_body, "4", NULL), 0);
}

/* The matrix's reductions over striped connections. */
static int striped_body(const mp_env* env) {
  ncclComm_t comm;
  int bad = 0, i = 0;
  ib_env();
  setenv("NCCL_IB_QPS_PER_CONNECTION", "3", 1);
  if (mp_comm_init(env, &comm)) return 1;
  for (int coll = 0; coll < CC_NCOLLS && !bad; coll++)
    for (size_t ci = 0; ci < NCOUNTS && !bad; ci++, i++) {
      cc_call c = {.coll = coll, .type = kTypes[i % NTYPES], .count = kCounts[ci]};
      c.kind = cc_is_reduction(coll) ? i % AR_NKINDS : AR_SUM;
      c.root = cc_has_root(coll) ? i % env->nranks : 0;
      c.salt = (uint64_t)i;
      if (cc_is_reduction(coll) && ar_op_create(env, comm, c.type, c.kind, &c.op)) return 1;
      bad += cc_run(&c, env, comm) != 0;
      if (c.kind == AR_PREMUL) ncclRedOpDestroy(c.op, comm);
    }
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_striped(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, striped_body, NULL, NULL), 0);
}

/* ---- Faults: every rank fails, none hangs ---- */

/* arg: the FAKEVERBS_FAULT of rank 0 (the others run clean). Each rank
 * all-reduces until a call fails; rank 0's fault makes one fail on every
 * rank (the others through their connections' ends). */
static int fault_body(const mp_env* env) {
  ncclComm_t comm;
  int bad = 0;
  float* x = calloc(100003, sizeof(float));
  ib_env();
  setenv("BRAID_TIMEOUT_MS", "5000", 1);
  if (env->rank == 0) setenv("FAKEVERBS_FAULT", env->arg, 1);
  if (x == NULL || mp_comm_init(env, &comm)) return 1;
  ncclResult_t rc = ncclSuccess;
  for (int k = 0; k < 20 && rc == ncclSuccess; k++)
    rc = ncclAllReduce(x, x, 100003, ncclFloat32, ncclSum, comm, NULL);
  if (rc == ncclSuccess)
    mp_fail(env, "fault %s: every call succeeded", (const char*)env->arg), bad++;
  if (rc != ncclSuccess && rc != ncclSystemError && rc != ncclRemoteError)
    mp_fail(env, "fault %s: %s, not the NIC's error or its peer's", (const char*)env->arg,
            ncclGetErrorString(rc)),
        bad++;
  mp_log(env, "fault %s: %s", (const char*)env->arg, ncclGetErrorString(rc));
  ncclCommAbort(comm);
  free(x);
  return bad;
}

static void test_faults(void** state) {
  (void)state;
  static const char* const faults[] = {"access:3", "retry:5", "fatal:4", "rnr:6"};
  for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
    assert_int_equal(mp_launch(3, fault_body, (void*)faults[i], NULL), 0);
}

/* ---- The topology's report names the port ---- */

/* The host's first rank logs the port its comm uses (one host here: the
 * others log nothing of it). */
static int topology_body(const mp_env* env) {
  ncclComm_t comm;
  mp_capture cap;
  ib_env();
  if (mp_capture_debug(&cap, "GRAPH") != 0 || mp_comm_init(env, &comm) != 0) return 1;
  int lines = mp_capture_count(&cap, "Topology: NET/IB, rank 0 (NUMA * on mlx5_0:1 IB * Mb/s");
  mp_capture_end_quiet(&cap);
  int bad = lines != (env->rank == 0);
  if (bad) mp_fail(env, "%d lines of the topology's report name rank 0's port", lines);
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

static void test_topology(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, topology_body, NULL, NULL), 0);
}

/* A peer killed between calls: the others' next call fails. */
static int killed_body(const mp_env* env) {
  ncclComm_t comm;
  float x[4096] = {0};
  int bad = 0, victim = env->nranks - 1;
  ib_env();
  setenv("BRAID_TIMEOUT_MS", "5000", 1);
  if (mp_comm_init(env, &comm)) return 1;
  bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, 4096, ncclFloat32, ncclSum, comm, NULL),
                      ncclSuccess, "allreduce before the kill");
  if (env->rank == victim) {
    mp_notify_parent(); /* SIGKILLed here */
    for (;;) mp_sleep_ms(1000);
  }
  mp_sleep_ms(200);
  ncclResult_t rc = ncclAllReduce(x, x, 4096, ncclFloat32, ncclSum, comm, NULL);
  if (rc == ncclSuccess) mp_fail(env, "an all-reduce with a dead peer succeeded"), bad++;
  mp_log(env, "with a dead peer: %s", ncclGetErrorString(rc));
  ncclCommAbort(comm);
  return bad;
}

static void test_killed_peer(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.victim = 2;
  o.kill_on_notify = 1;
  assert_int_equal(mp_launch(3, killed_body, NULL, &o), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matrix),      cmocka_unit_test(test_p2p),
      cmocka_unit_test(test_registered),  cmocka_unit_test(test_big_messages),
      cmocka_unit_test(test_striped),     cmocka_unit_test(test_faults),
      cmocka_unit_test(test_killed_peer), cmocka_unit_test(test_topology),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
