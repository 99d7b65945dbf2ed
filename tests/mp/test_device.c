/* Device buffers on CUDA streams (docs/architecture.md 4): every collective and
 * send/recv on memory from ncclMemAlloc, enqueued on a stream and checked
 * after the stream is synchronized; dependent calls ordered on one stream
 * with the stream's own copies between them; groups on two streams and
 * across comms of one process on one device; a killed peer whose
 * survivors' streams still drain; the synchronous fallback; all streams on
 * one queue; the synchronous path, whose collectives run as kernels, on
 * every algorithm. `make test` runs it on the simulated driver (where the host
 * cannot touch device memory, as on a GPU); BRAID_CUDA_LIB=libcuda.so.1
 * runs it on a real one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collcheck.h"
#include "devmem.h"
#include "launcher.h"

static const ncclDataType_t kTypes[] = {ncclFloat32,    ncclInt8,    ncclFloat16,    ncclBfloat16,
                                        ncclUint64,     ncclFloat64, ncclFloat8e4m3, ncclInt32,
                                        ncclFloat8e5m2, ncclUint8,   ncclUint32,     ncclInt64};
#define NTYPES (sizeof(kTypes) / sizeof(kTypes[0]))
/* The last one is lowered by MP_BIG_COUNT (mp_big_count). */
static const size_t kCounts[] = {0, 1, 1001, 200003};
#define NCOUNTS (sizeof(kCounts) / sizeof(kCounts[0]))

/* One call on device buffers: prepare on the host, upload, issue on s,
 * synchronize, fetch, verify. 0 exact. */
static int dev_one(const mp_env* env, ncclComm_t comm, cudaStream_t s, cc_call* proto) {
  dev_call d = {.host = *proto};
  char what[160];
  int bad = dev_call_prepare(&d, env);
  if (!bad) {
    ncclResult_t rc = cc_issue(&d.dev, comm, s);
    if (rc != ncclSuccess) cc_report_rc(&d.host, env, comm, rc), bad = 1;
  }
  if (!bad) bad = dev_sync(env, s) || dev_call_fetch(&d, env) || cc_verify(&d.host, env);
  if (bad) {
    cc_describe(&d.host, what, sizeof(what));
    mp_fail(env, "device buffers: %s", what);
  }
  dev_call_release(&d);
  return bad;
}

static ncclRedOp_t op_of(const mp_env* env, ncclComm_t comm, ncclDataType_t type, int kind) {
  ncclRedOp_t op = ncclSum;
  ar_op_create(env, comm, type, kind, &op);
  return op;
}

/* ---- (1) the matrix ---- */

/* The matrix on `comm` (env says its rank and size), on stream s. */
static int matrix_run(const mp_env* env, ncclComm_t comm, cudaStream_t s) {
  int bad = 0, i = 0;
  for (int coll = 0; coll < CC_NCOLLS && !bad; coll++)
    for (size_t ci = 0; ci < NCOUNTS && !bad; ci++)
      for (int ip = 0; ip < 2 && !bad; ip++, i++) {
        size_t count = ci == NCOUNTS - 1 ? mp_big_count(kCounts[ci]) : kCounts[ci];
        cc_call c = {.coll = coll, .type = kTypes[i % NTYPES], .count = count};
        c.kind = cc_is_reduction(coll) ? i % AR_NKINDS : AR_SUM;
        c.root = cc_has_root(coll) ? (i / 2) % env->nranks : 0;
        c.inplace = ip && coll != CC_ALLTOALL;
        c.salt = (uint64_t)i;
        if (cc_is_reduction(coll)) c.op = op_of(env, comm, c.type, c.kind);
        bad += dev_one(env, comm, s, &c);
        if (c.kind == AR_PREMUL) ncclRedOpDestroy(c.op, comm);
      }
  /* every type x op once, all-reduce in place */
  for (size_t t = 0; t < NTYPES && !bad; t++)
    for (int k = 0; k < AR_NKINDS && !bad; k++) {
      cc_call c = {.coll = CC_ALLREDUCE, .type = kTypes[t], .kind = k, .count = 4099, .inplace = 1};
      c.salt = 1000 + t * AR_NKINDS + (size_t)k;
      c.op = op_of(env, comm, c.type, k);
      bad += dev_one(env, comm, s, &c);
      if (k == AR_PREMUL) ncclRedOpDestroy(c.op, comm);
    }
  if (env->rank == 0)
    mp_log(env, "device matrix on %d ranks: %s", env->nranks, bad ? "FAILED" : "ok");
  return bad;
}

static int matrix_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  int bad = matrix_run(env, comm, s);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_matrix(void** state) {
  (void)state;
  for (int n = 1; n <= 4; n++) assert_int_equal(mp_launch(n, matrix_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(8, matrix_body, NULL, NULL), 0);
}

/* The same matrix run synchronously (no stream memory operations): the
 * collectives then run as kernels on the executor's device backend, every
 * message through its pinned slots; each algorithm once, so every step
 * kind is staged (recursive doubling's exchanges too). */
static const char* const kSyncAlgos[] = {"Ring", "RecDoubling", "Tree", "^Direct"};

static int sync_matrix_body(const mp_env* env) {
  setenv("BRAID_STREAM_MEMOPS", "0", 1);
  setenv("NCCL_ALGO", kSyncAlgos[env->nranks - 2], 1);
  return matrix_body(env);
}

static void test_matrix_synchronous(void** state) {
  (void)state;
  for (int n = 2; n <= 5; n++) assert_int_equal(mp_launch(n, sync_matrix_body, NULL, NULL), 0);
}

/* The matrix on the direct algorithm (NCCL_ALGO naming it: ranks in
 * processes of their own go direct only so), peers' buffers mapped by CUDA
 * IPC (ncclMemAlloc's cuMem memory: fds over the Unix-socket links);
 * PreMulSum ops too (each input multiplied on the device first), gated
 * (2 ranks) or synchronous. */
static int direct_matrix_body(const mp_env* env) {
  mp_capture cap;
  if (env->nranks > 2) setenv("BRAID_STREAM_MEMOPS", "0", 1);
  setenv("NCCL_ALGO", "Direct,Ring", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  if (mp_capture_begin(&cap) != 0) return 1;
  int bad = matrix_body(env);
  if (mp_capture_count(&cap, "AllReduce *: Direct instead") == 0) {
    mp_fail(env, "no all-reduce ran direct on %d ranks", env->nranks);
    bad++;
  }
  mp_capture_end_quiet(&cap);
  return bad;
}

/* 2, 3 and 8 ranks, and 9: more than 8, a task's sources and
 * destinations past what the kernel took before (16 now). */
static void test_matrix_direct(void** state) {
  (void)state;
  static const int sizes[] = {2, 3, 8, 9};
  for (int i = 0; i < 4; i++)
    assert_int_equal(mp_launch(sizes[i], direct_matrix_body, NULL, NULL), 0);
}

/* The direct matrix with rank r held on allowed CPU r mod their count:
 * where CPUs have caches of their own, each node's order (and a rank's
 * index, which names the buffers it exchanges) is by cache, 0 2 .. 1 3
 * .., while the plan's blocks, slices and roots stay by rank
 * (algorithms/layout.c, src/cuda/cuda_direct.c). */
static int direct_bound_body(const mp_env* env) {
  if (mp_bind_rank(env, env->rank)) return 1;
  return direct_matrix_body(env);
}

static void test_matrix_direct_bound(void** state) {
  (void)state;
  for (int n = 3; n <= 4; n++) assert_int_equal(mp_launch(n, direct_bound_body, NULL, NULL), 0);
}

/* The same with the ranks on two simulated devices (peers of each other):
 * every rank maps buffers of the other device too. */
static int direct_two_devices_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  setenv("CUDASIM_DEVICES", "2", 1);
  setenv("NCCL_ALGO", "Direct,Ring", 1);
  if (dev_open(env, env->rank % 2) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  int bad = matrix_run(env, comm, s);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_direct_two_devices(void** state) {
  (void)state;
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) skip();
  assert_int_equal(mp_launch(4, direct_two_devices_body, NULL, NULL), 0);
}

/* Hier on devices: ranks faked into nodes by NCCL_HOSTID (so nodes talk
 * TCP, ranks of a node CUDA IPC), NCCL_ALGO naming Direct. All-reduce,
 * reduce-scatter and all-gather run their node stages direct around pinned
 * scratch and the stage between nodes on the host; the other collectives
 * are staged. Every type and op (avg's division on the total). Layouts:
 * node-major (gated on 2 x 2 and 2 x 3, synchronous on 3 x 2),
 * round-robin, mirrored (a column's ranks step down: 0 1 2 | 5 4 3), one
 * whose columns are uneven (nodes {0,1} {2,4} {3,5}: the kernels read the
 * rows' table), and nodes of unequal sizes ({0,1,2,3} {4,5}: a column of
 * two rows a node, one junk, its tasks spread over the node's ranks; the
 * column's pairs are not host Hier's, so the unit links them),
 * gated and synchronous (rows made on the host), and a node of more ranks
 * than 8 ({0..8} {9}: tasks of 9 sources, a column of 9 rows). The TUNING log says which
 * ran: Hier, every collective of the three. */
enum hier_kind {
  HIER_NODE_MAJOR,
  HIER_ROUND_ROBIN,
  HIER_MIRRORED,
  HIER_UNEVEN,
  HIER_UNEQUAL,
  HIER_BIG
};

struct hier_layout {
  int ppn, nnodes;
  int sync;
  int kind; /* enum hier_kind */
};

static int hier_node_of(const struct hier_layout* l, int r) {
  static const int uneven[] = {0, 0, 1, 2, 1, 2};
  switch (l->kind) {
    case HIER_ROUND_ROBIN:
      return r % l->nnodes;
    case HIER_MIRRORED:
      return (r / l->nnodes) % 2 ? l->nnodes - 1 - r % l->nnodes : r % l->nnodes;
    case HIER_UNEVEN:
      return uneven[r % 6];
    case HIER_UNEQUAL:
      return r >= 4;
    case HIER_BIG:
      return r >= 9;
    default:
      return r / l->ppn;
  }
}

/* Whether the TUNING log says `coll` ran as Hier with direct node stages
 * (want) or never did (!want). */
static int hier_ran(const mp_env* env, const mp_capture* cap, const char* coll, int want) {
  char pattern[96];
  snprintf(pattern, sizeof(pattern), "%s *: Hier with direct node stages", coll);
  int n = mp_capture_count(cap, pattern);
  if ((want && n == 0) || (!want && n > 0)) {
    mp_fail(env, "%d %s calls ran as Hier with direct node stages, want %s", n, coll,
            want ? "some" : "none");
    return 1;
  }
  return 0;
}

static int hier_direct_body(const mp_env* env) {
  const struct hier_layout* l = env->arg;
  char host[32];
  mp_capture cap;
  snprintf(host, sizeof(host), "fake-node-%d", hier_node_of(l, env->rank));
  setenv("NCCL_HOSTID", host, 1);
  setenv("NCCL_ALGO", "Direct,Ring", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  if (l->sync) setenv("BRAID_STREAM_MEMOPS", "0", 1);
  /* gated: every stream on one queue, as CUDA_DEVICE_MAX_CONNECTIONS=1
   * can make them, so that GPU work the proxy queues while a stream waits
   * at its gate (a copy of the rows' table, once) hangs here */
  if (!l->sync) setenv("CUDASIM_ONE_QUEUE", "1", 1);
  if (mp_capture_begin(&cap) != 0) return 1;
  int bad = matrix_body(env);
  bad += hier_ran(env, &cap, "AllReduce", 1);
  bad += hier_ran(env, &cap, "ReduceScatter", 1);
  bad += hier_ran(env, &cap, "AllGather", 1);
  mp_capture_end_quiet(&cap);
  return bad;
}

static void test_hier_direct(void** state) {
  (void)state;
  static const struct hier_layout two_by_two = {2, 2, 0, HIER_NODE_MAJOR},
                                  three_by_two = {2, 3, 1, HIER_NODE_MAJOR},
                                  two_by_three = {3, 2, 0, HIER_NODE_MAJOR},
                                  round_robin = {2, 3, 0, HIER_ROUND_ROBIN},
                                  mirrored = {2, 3, 0, HIER_MIRRORED},
                                  uneven = {2, 3, 0, HIER_UNEVEN},
                                  unequal = {2, 2, 0, HIER_UNEQUAL},
                                  unequal_sync = {2, 2, 1, HIER_UNEQUAL}, big = {2, 2, 0, HIER_BIG};
  assert_int_equal(mp_launch(4, hier_direct_body, (void*)&two_by_two, NULL), 0);
  assert_int_equal(mp_launch(6, hier_direct_body, (void*)&three_by_two, NULL), 0);
  assert_int_equal(mp_launch(6, hier_direct_body, (void*)&two_by_three, NULL), 0);
  assert_int_equal(mp_launch(6, hier_direct_body, (void*)&round_robin, NULL), 0);
  assert_int_equal(mp_launch(6, hier_direct_body, (void*)&mirrored, NULL), 0);
  assert_int_equal(mp_launch(6, hier_direct_body, (void*)&uneven, NULL), 0);
  assert_int_equal(mp_launch(6, hier_direct_body, (void*)&unequal, NULL), 0);
  assert_int_equal(mp_launch(6, hier_direct_body, (void*)&unequal_sync, NULL), 0);
  assert_int_equal(mp_launch(10, hier_direct_body, (void*)&big, NULL), 0);
}

/* The matrix with the ranks as threads of one process (ncclCommInitAll),
 * each driving its own comm: the tuner takes direct for the large counts
 * (the peers' pointers used as they are, no IPC); on one device, and (arg
 * set) alternating between two. */
#define DIRECT_THREADS 4

struct direct_thread {
  mp_env env; /* the process's, with this comm's rank and size */
  ncclComm_t comm;
  int dev;
  int bad;
};

static void* direct_thread_main(void* arg) {
  struct direct_thread* t = arg;
  cudaStream_t s;
  if (dev_open(&t->env, t->dev) || (s = dev_stream(&t->env)) == NULL) {
    t->bad = 1;
    return NULL;
  }
  t->bad = matrix_run(&t->env, t->comm, s);
  return NULL;
}

static int direct_threads_body(const mp_env* env) {
  ncclComm_t comms[DIRECT_THREADS];
  struct direct_thread th[DIRECT_THREADS];
  pthread_t ids[DIRECT_THREADS];
  int devs[DIRECT_THREADS] = {0}, bad = 0;
  if (env->arg) setenv("CUDASIM_DEVICES", "2", 1);
  for (int r = 0; r < DIRECT_THREADS; r++) devs[r] = env->arg ? r % 2 : 0;
  if (dev_open(env, 0)) return 1;
  bad += mp_expect_rc(env, NULL, ncclCommInitAll(comms, DIRECT_THREADS, devs), ncclSuccess,
                      "ncclCommInitAll");
  for (int r = 0; r < DIRECT_THREADS && !bad; r++) {
    th[r] = (struct direct_thread){*env, comms[r], devs[r], 0};
    th[r].env.rank = r;
    th[r].env.nranks = DIRECT_THREADS;
    if (pthread_create(&ids[r], NULL, direct_thread_main, &th[r]) != 0) return 1;
  }
  for (int r = 0; r < DIRECT_THREADS && !bad; r++) {
    pthread_join(ids[r], NULL);
    bad += th[r].bad;
  }
  for (int r = 0; r < DIRECT_THREADS; r++)
    bad += mp_expect_rc(env, comms[r], ncclCommDestroy(comms[r]), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_direct_threads(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  assert_int_equal(mp_launch(1, direct_threads_body, NULL, &o), 0);
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) return; /* one GPU there */
  static int two_devices = 1;
  assert_int_equal(mp_launch(1, direct_threads_body, &two_devices, &o), 0);
}

/* A group of collectives on one comm runs direct, each in turn (as
 * PyTorch groups a bucket's calls). */
static int direct_group_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  dev_call c[3] = {
      {.host = {.coll = CC_ALLREDUCE, .type = ncclFloat32, .kind = AR_SUM, .count = 40001}},
      {.host = {.coll = CC_ALLGATHER, .type = ncclBfloat16, .count = 3001}},
      {.host = {.coll = CC_REDUCESCATTER, .type = ncclInt64, .kind = AR_MAX, .count = 777}}};
  setenv("NCCL_ALGO", "Direct", 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  c[0].host.op = ncclSum, c[2].host.op = ncclMax;
  for (int i = 0; i < 3; i++) {
    c[i].host.salt = 50 + (uint64_t)i;
    if (dev_call_prepare(&c[i], env)) return 1;
  }
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int i = 0; i < 3; i++)
    bad += mp_expect_rc(env, comm, cc_issue(&c[i].dev, comm, s), ncclSuccess, "in the group");
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
  bad += dev_sync(env, s);
  for (int i = 0; i < 3; i++) {
    bad += dev_call_fetch(&c[i], env) + cc_verify(&c[i].host, env);
    dev_call_release(&c[i]);
  }
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_direct_group(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, direct_group_body, NULL, NULL), 0);
}

/* A gated direct call returns before its peers make theirs: rank 1 calls
 * only once rank 0's call has returned (a call that waited for its peers
 * would deadlock here, and fail the launch's deadline), and the results
 * are right once the streams drain. */
#define ASYNC_COUNT 262147

static int direct_async_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0, n = env->nranks;
  size_t bytes = ASYNC_COUNT * sizeof(int32_t);
  int32_t* h = malloc(bytes);
  void* d = NULL;
  setenv("NCCL_ALGO", "Direct", 1);
  if (!h || dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, bytes)) return 1;
  for (int i = 0; i < ASYNC_COUNT; i++) h[i] = (env->rank + 1) * i;
  bad += dev_copy(env, d, h, bytes);
  if (env->rank > 0 && !mp_wait_flag(&env->shm[env->rank - 1], 30000))
    mp_fail(env, "rank %d's call never returned", env->rank - 1), bad++;
  bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, ASYNC_COUNT, ncclInt32, ncclSum, comm, s),
                      ncclSuccess, "direct allreduce");
  __atomic_store_n((int*)&env->shm[env->rank], 1, __ATOMIC_SEQ_CST);
  bad += dev_sync(env, s) + dev_copy(env, h, d, bytes);
  for (int i = 0; i < ASYNC_COUNT && !bad; i++)
    if (h[i] != n * (n + 1) / 2 * i) mp_fail(env, "[%d] = %d", i, h[i]), bad++;
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  ncclMemFree(d);
  free(h);
  return bad;
}

static void test_direct_async(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, direct_async_body, NULL, NULL), 0);
}

/* A direct call on one node reaches the peers' buffers over links of its
 * own (cuda_direct.h): it connects none of the host schedule's peers, a
 * PreMulSum's neither (its input multiplied on the device first). A call
 * on host buffers, which the executor runs, then connects them, which
 * shows the count looks where connections are logged. */
#define LINKS_COUNT 4099

static int host_links(const mp_capture* cap) {
  return mp_capture_count(cap, " via SHM") + mp_capture_count(cap, " via NET/");
}

/* An all-reduce in place of x, on the device (d) or on the host (d NULL):
 * rank r's element i is (r + 1) (i % 1000), the sum times `scale`. */
static int links_allreduce(const mp_env* env, ncclComm_t comm, cudaStream_t s, float* d,
                           ncclRedOp_t op, float scale) {
  static float h[LINKS_COUNT];
  float* x = d ? d : h;
  int bad = 0, n = env->nranks;
  for (int i = 0; i < LINKS_COUNT; i++) h[i] = (float)((env->rank + 1) * (i % 1000));
  if (d) bad += dev_copy(env, d, h, sizeof(h));
  bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, LINKS_COUNT, ncclFloat32, op, comm, s),
                      ncclSuccess, "allreduce");
  bad += dev_sync(env, s);
  if (d) bad += dev_copy(env, h, d, sizeof(h));
  for (int i = 0; i < LINKS_COUNT && !bad; i++)
    if (h[i] != scale * (float)(n * (n + 1) / 2 * (i % 1000)))
      mp_fail(env, "[%d] = %g", i, (double)h[i]), bad++;
  return bad;
}

static int direct_no_links_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  ncclRedOp_t premul;
  mp_capture cap;
  float two = 2.0f, *d = NULL;
  int bad = 0;
  setenv("NCCL_ALGO", "Direct,Ring", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,TUNING", 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc((void**)&d, LINKS_COUNT * sizeof(float)) || mp_capture_begin(&cap)) return 1;
  bad += links_allreduce(env, comm, s, d, ncclSum, 1.0f);
  bad += mp_expect_rc(
      env, comm,
      ncclRedOpCreatePreMulSum(&premul, &two, ncclFloat32, ncclScalarHostImmediate, comm),
      ncclSuccess, "ncclRedOpCreatePreMulSum");
  bad += links_allreduce(env, comm, s, d, premul, 2.0f);
  int direct = mp_capture_count(&cap, "AllReduce * Direct instead"), early = host_links(&cap);
  bad += links_allreduce(env, comm, s, NULL, ncclSum, 1.0f);
  int later = host_links(&cap);
  mp_capture_end_quiet(&cap);
  if (direct != 2) mp_fail(env, "%d all-reduces ran Direct, want 2", direct), bad++;
  if (early) mp_fail(env, "the direct calls made %d host connections", early), bad++;
  if (!later) mp_fail(env, "the call on host buffers made no host connection either"), bad++;
  bad += mp_expect_rc(env, comm, ncclRedOpDestroy(premul, comm), ncclSuccess, "ncclRedOpDestroy");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  ncclMemFree(d);
  return bad;
}

static void test_direct_no_host_links(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, direct_no_links_body, NULL, NULL), 0);
}

/* Direct calls on buffers freed and allocated again between calls (the
 * allocator hands the same addresses back): each call must read the new
 * buffers, never a stale mapping of the old ones. */
#define REALLOC_COUNT 300001
#define REALLOC_ROUNDS 8

static int direct_realloc_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0, n = env->nranks, reused = 0;
  size_t bytes = REALLOC_COUNT * sizeof(int32_t);
  int32_t* h = malloc(bytes);
  void* last = NULL;
  setenv("NCCL_ALGO", "Direct", 1);
  if (!h || dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  for (int round = 0; round < REALLOC_ROUNDS && !bad; round++) {
    void* d = NULL;
    if (ncclMemAlloc(&d, bytes)) return 1;
    reused += d == last;
    last = d;
    for (int i = 0; i < REALLOC_COUNT; i++) h[i] = (round + 1) * (env->rank + 1) + i;
    bad += dev_copy(env, d, h, bytes);
    bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, REALLOC_COUNT, ncclInt32, ncclSum, comm, s),
                        ncclSuccess, "allreduce on a new buffer");
    bad += dev_sync(env, s) + dev_copy(env, h, d, bytes);
    for (int i = 0; i < REALLOC_COUNT && !bad; i++)
      if (h[i] != (round + 1) * n * (n + 1) / 2 + n * i)
        mp_fail(env, "round %d: [%d] = %d: a stale buffer was read", round, i, h[i]), bad++;
    ncclMemFree(d);
  }
  if (env->rank == 0) mp_log(env, "%d of %d rounds on a reused address", reused, REALLOC_ROUNDS);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  free(h);
  return bad;
}

static void test_direct_realloc(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, direct_realloc_body, NULL, NULL), 0);
}

/* Direct calls run gated on their stream where a process has stream
 * memory operations (the call returns at once; its error comes through
 * ncclCommGetAsyncError once the stream drained), synchronously without
 * (the call returns its error). The failure tests run both: arg NULL
 * gated, else synchronous (launch_twice). */
static void direct_mode(const mp_env* env) {
  setenv("NCCL_ALGO", "Direct", 1);
  if (env->arg) setenv("BRAID_STREAM_MEMOPS", "0", 1);
}

/* Run body with arg NULL, then with arg set (each body says what that
 * changes). */
static void launch_twice(int nranks, mp_body_fn body, const mp_opts* o) {
  static int set = 1;
  assert_int_equal(mp_launch(nranks, body, NULL, o), 0);
  assert_int_equal(mp_launch(nranks, body, &set, o), 0);
}

/* ncclCommRegister'ed buffers are exported once: with the simulated
 * driver refusing every export from then on, direct calls on them still
 * work, and a call on a buffer that is not registered fails (so the knob
 * bites, and nothing hangs: every rank fails before it posts). */
#define REG_COUNT 70001

static int direct_registered_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  void *d = NULL, *out = NULL, *other = NULL, *hs = NULL, *hr = NULL;
  int bad = 0, n = env->nranks;
  size_t bytes = REG_COUNT * sizeof(int32_t);
  int32_t* h = malloc(bytes);
  direct_mode(env);
  if (!h || dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, bytes) || ncclMemAlloc(&out, bytes) || ncclMemAlloc(&other, bytes)) return 1;
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, d, bytes, &hs), ncclSuccess, "register");
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, out, bytes, &hr), ncclSuccess, "register");
  setenv("CUDASIM_NO_EXPORT", "1", 1);
  for (int round = 1; round <= 2 && !bad; round++) {
    for (int i = 0; i < REG_COUNT; i++) h[i] = round * (env->rank + 1) + i;
    bad += dev_copy(env, d, h, bytes);
    bad += mp_expect_rc(env, comm, ncclAllReduce(d, out, REG_COUNT, ncclInt32, ncclSum, comm, s),
                        ncclSuccess, "direct allreduce on registered buffers");
    bad += dev_sync(env, s) + dev_copy(env, h, out, bytes);
    for (int i = 0; i < REG_COUNT && !bad; i++)
      if (h[i] != round * n * (n + 1) / 2 + n * i)
        mp_fail(env, "round %d: [%d] = %d", round, i, h[i]), bad++;
  }
  ncclResult_t rc = ncclAllReduce(other, other, REG_COUNT, ncclInt32, ncclSum, comm, s);
  if (dev_outcome(env, comm, s, rc) == ncclSuccess)
    mp_fail(env, "an unregistered buffer was exported with exports refused"), bad++;
  unsetenv("CUDASIM_NO_EXPORT");
  ncclCommAbort(comm);
  ncclMemFree(d);
  ncclMemFree(out);
  ncclMemFree(other);
  free(h);
  return bad;
}

static void test_direct_registered(void** state) {
  (void)state;
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) skip();
  launch_twice(3, direct_registered_body, NULL);
}

/* Rank 1's direct call fails on its own, the simulated driver refusing
 * what `knob` names: it tells its peers, which fail at once with
 * ncclRemoteError, naming a failed rank (rank 1, or one that failed
 * because of it), instead of waiting out the timeout. */
static int rank1_fails(const mp_env* env, const char* knob) {
  ncclComm_t comm;
  cudaStream_t s;
  void* d = NULL;
  int bad = 0;
  direct_mode(env);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, REG_COUNT * sizeof(float))) return 1;
  if (env->rank == 1) setenv(knob, "1", 1);
  ncclResult_t rc = ncclAllReduce(d, d, REG_COUNT, ncclFloat32, ncclSum, comm, s);
  const char* why = ncclGetLastError(comm);
  rc = dev_outcome(env, comm, s, rc);
  if (rc == ncclSuccess) mp_fail(env, "a direct call with a failing rank succeeded"), bad++;
  if (env->rank != 1 && rc != ncclRemoteError)
    mp_fail(env, "a peer's failure gave %d, not ncclRemoteError", (int)rc), bad++;
  if (env->arg && env->rank != 1 && strstr(why, "failed in call") == NULL)
    mp_fail(env, "the failure does not name a failed rank: \"%s\"", why), bad++;
  ncclCommAbort(comm);
  ncclMemFree(d);
  return bad;
}

/* Before its peers got its buffers: its export refused. */
static int direct_failure_body(const mp_env* env) {
  return rank1_fails(env, "CUDASIM_NO_EXPORT");
}

static void test_direct_failure(void** state) {
  (void)state;
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) skip();
  launch_twice(3, direct_failure_body, NULL);
}

/* After every peer got its buffers (it cannot map theirs): it holds its
 * stream until each peer said its last word, since their kernels may be
 * using its buffers. */
static int direct_late_failure_body(const mp_env* env) {
  return rank1_fails(env, "CUDASIM_NO_IMPORT");
}

static void test_direct_late_failure(void** state) {
  (void)state;
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) skip();
  launch_twice(3, direct_late_failure_body, NULL);
}

/* Processes that number devices differently (CUDA_VISIBLE_DEVICES: each
 * sees its own GPU as device 0) cannot check that their GPUs reach each
 * other: no direct, unless they share one GPU. Shown with exports refused
 * (CUDASIM_NO_EXPORT), which only a direct call needs: on two physical
 * GPUs the call stages and succeeds; on one (arg set) it goes direct and
 * fails, so the knob bites. */
static int visible_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  void* d = NULL;
  char physical[8];
  int bad = 0;
  snprintf(physical, sizeof(physical), "%d", env->arg ? 0 : env->rank);
  setenv("CUDASIM_VISIBLE", physical, 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, REG_COUNT * sizeof(float))) return 1;
  setenv("CUDASIM_NO_EXPORT", "1", 1);
  ncclResult_t rc = ncclAllReduce(d, d, REG_COUNT, ncclFloat32, ncclSum, comm, s);
  rc = dev_outcome(env, comm, s, rc);
  if (!env->arg && rc != ncclSuccess)
    mp_fail(env, "ranks on different GPUs numbered alike went direct: %d", (int)rc), bad++;
  if (env->arg && rc == ncclSuccess)
    mp_fail(env, "ranks sharing a GPU did not go direct (the knob did not bite)"), bad++;
  ncclCommAbort(comm);
  ncclMemFree(d);
  return bad;
}

static void test_direct_visible_devices(void** state) {
  (void)state;
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) skip();
  launch_twice(2, visible_body, NULL);
}

/* A rank killed while the others wait for its buffers in a direct call
 * (gated: their streams wait on their flags): they get an error (its links
 * close), not a hang, their streams drain, and the next call fails. */
#define DIRECT_KILL_COUNT 100003

static int direct_killed_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  void* d = NULL;
  int bad = 0, victim = env->nranks - 1;
  direct_mode(env);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, DIRECT_KILL_COUNT * sizeof(float))) return 1;
  bad +=
      mp_expect_rc(env, comm, ncclAllReduce(d, d, DIRECT_KILL_COUNT, ncclFloat32, ncclSum, comm, s),
                   ncclSuccess, "direct allreduce before the kill");
  bad += dev_sync(env, s);
  if (env->rank == victim) {
    for (int r = 0; r < victim; r++) mp_wait_flag(&env->shm[r], 30000);
    mp_notify_parent(); /* SIGKILLed here */
    for (;;) mp_sleep_ms(1000);
  }
  __atomic_store_n((int*)&env->shm[env->rank], 1, __ATOMIC_SEQ_CST);
  ncclResult_t rc = ncclAllReduce(d, d, DIRECT_KILL_COUNT, ncclFloat32, ncclSum, comm, s);
  rc = dev_outcome(env, comm, s, rc);
  if (rc == ncclSuccess) mp_fail(env, "a direct call with a dead peer succeeded"), bad++;
  ncclResult_t next = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s);
  if (next == ncclSuccess) mp_fail(env, "the next call after the failure returned success"), bad++;
  mp_log(env, "direct call with a dead peer: %d, next call %d", (int)rc, (int)next);
  ncclCommAbort(comm);
  return bad;
}

/* One buffer on the device, the other on the host: an all-reduce from
 * device to host and an all-gather from host to device, gated and
 * synchronous (the host buffer's call runs on the host, the device one
 * staged, never a kernel on pageable memory). */
#define MIXED_COUNT 5003

static int mixed_round(const mp_env* env, ncclComm_t comm, cudaStream_t s) {
  int n = env->nranks, bad = 0;
  size_t bytes = MIXED_COUNT * sizeof(int32_t);
  int32_t* h = malloc((size_t)n * bytes);
  int32_t* got = malloc((size_t)n * bytes);
  void* d = NULL;
  if (!h || !got || ncclMemAlloc(&d, (size_t)n * bytes)) return 1;
  for (int i = 0; i < MIXED_COUNT; i++) h[i] = env->rank * 1000 + i;
  bad += dev_copy(env, d, h, bytes);
  bad += mp_expect_rc(env, comm, ncclAllReduce(d, got, MIXED_COUNT, ncclInt32, ncclSum, comm, s),
                      ncclSuccess, "allreduce device -> host");
  bad += mp_expect_rc(env, comm, ncclAllGather(h, d, MIXED_COUNT, ncclInt32, comm, s), ncclSuccess,
                      "allgather host -> device");
  bad += dev_sync(env, s);
  for (int i = 0; i < MIXED_COUNT && !bad; i++)
    if (got[i] != 1000 * n * (n - 1) / 2 + n * i)
      mp_fail(env, "allreduce device -> host: [%d] = %d", i, got[i]), bad++;
  bad += dev_copy(env, got, d, (size_t)n * bytes);
  for (int r = 0; r < n && !bad; r++)
    for (int i = 0; i < MIXED_COUNT && !bad; i++)
      if (got[r * MIXED_COUNT + i] != r * 1000 + i)
        mp_fail(env, "allgather host -> device: block %d [%d] = %d", r, i,
                got[r * MIXED_COUNT + i]),
            bad++;
  ncclMemFree(d);
  free(h);
  free(got);
  return bad;
}

static int mixed_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  if (env->rank % 2) setenv("BRAID_STREAM_MEMOPS", "0", 1); /* odd ranks synchronous */
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  bad += mixed_round(env, comm, s);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_mixed_buffers(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, mixed_body, NULL, NULL), 0);
}

/* ---- (2) ordering: dependent calls and the stream's own copies ---- */

#define ORDER_COUNT 100003
#define ORDER_K 5

static int order_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int n = env->nranks, bad = 0;
  size_t bytes = ORDER_COUNT * sizeof(uint64_t);
  void *dx = NULL, *dy = NULL, *dz = NULL;
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  uint64_t* x = malloc(bytes);
  uint64_t* y = malloc(bytes);
  if (!x || !y || ncclMemAlloc(&dx, bytes) || ncclMemAlloc(&dy, bytes) ||
      ncclMemAlloc(&dz, (size_t)n * bytes))
    return 1;
  for (size_t i = 0; i < ORDER_COUNT; i++) x[i] = (uint64_t)env->rank * 7919u + i;
  bad += dev_copy(env, dx, x, bytes);
  /* x <- sum(x), then y <- x by the stream's copy, y <- sum(y), ... : each
   * step reads what the step before wrote, with no synchronization */
  for (int k = 0; k < ORDER_K && !bad; k++) {
    void* from = k % 2 ? dy : dx;
    void* to = k % 2 ? dx : dy;
    bad += mp_expect_rc(env, comm,
                        ncclAllReduce(from, from, ORDER_COUNT, ncclUint64, ncclSum, comm, s),
                        ncclSuccess, "allreduce on a stream");
    bad += dev_copy_async(env, to, from, bytes, s);
  }
  void* last = ORDER_K % 2 ? dy : dx;
  bad += mp_expect_rc(env, comm, ncclAllGather(last, dz, ORDER_COUNT, ncclUint64, comm, s),
                      ncclSuccess, "allgather on a stream");
  bad += dev_sync(env, s);
  uint64_t nn = 1;
  for (int k = 1; k < ORDER_K; k++) nn *= (uint64_t)n;
  for (int r = 0; r < n && !bad; r++) {
    bad += dev_copy(env, y, (char*)dz + (size_t)r * bytes, bytes);
    for (size_t i = 0; i < ORDER_COUNT && !bad; i++) {
      uint64_t want = ((uint64_t)n * i + 7919u * (uint64_t)(n * (n - 1) / 2)) * nn;
      if (y[i] != want)
        mp_fail(env, "after %d dependent steps: block %d [%zu] = %llu, expected %llu", ORDER_K, r,
                i, (unsigned long long)y[i], (unsigned long long)want),
            bad++;
    }
  }
  free(x);
  free(y);
  ncclMemFree(dx);
  ncclMemFree(dy);
  ncclMemFree(dz);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_ordering(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, order_body, NULL, NULL), 0);
}

/* Many calls queued on one stream before any runs: more than a chunk of
 * stream gates (count 1, staged) and of deferred kernels (direct), each
 * call on its own slice of one allocation; every result right once the
 * stream drains. */
#define QUEUED_CALLS 100
#define QUEUED_BIG 20011

static int queued_round(const mp_env* env, ncclComm_t comm, cudaStream_t s, size_t count) {
  int n = env->nranks, bad = 0;
  size_t total = count * QUEUED_CALLS, bytes = total * sizeof(int32_t);
  int32_t* h = malloc(bytes);
  void *in = NULL, *out = NULL;
  if (!h || ncclMemAlloc(&in, bytes) || ncclMemAlloc(&out, bytes)) return 1;
  for (size_t k = 0; k < total; k++) h[k] = env->rank + (int32_t)k;
  bad += dev_copy(env, in, h, bytes);
  for (int i = 0; i < QUEUED_CALLS && !bad; i++)
    bad += mp_expect_rc(env, comm,
                        ncclAllReduce((int32_t*)in + i * count, (int32_t*)out + i * count, count,
                                      ncclInt32, ncclSum, comm, s),
                        ncclSuccess, "queued allreduce");
  bad += dev_sync(env, s) + dev_copy(env, h, out, bytes);
  for (size_t k = 0; k < total && !bad; k++)
    if (h[k] != n * (int32_t)k + n * (n - 1) / 2)
      mp_fail(env, "count %zu: [%zu] = %d", count, k, h[k]), bad++;
  ncclMemFree(in);
  ncclMemFree(out);
  free(h);
  return bad;
}

static int queued_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  int bad = queued_round(env, comm, s, 1) + queued_round(env, comm, s, QUEUED_BIG);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_many_queued(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, queued_body, NULL, NULL), 0);
}

/* The same with every stream on one queue: nothing Braid enqueues may
 * wait for work on another stream. */
static int one_queue_body(const mp_env* env) {
  setenv("CUDASIM_ONE_QUEUE", "1", 1);
  return order_body(env);
}

static void test_one_queue(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, one_queue_body, NULL, NULL), 0);
}

/* Without stream memory operations: the same calls, synchronous. */
static int sync_order_body(const mp_env* env) {
  setenv("BRAID_STREAM_MEMOPS", "0", 1);
  return order_body(env);
}

static int group_body(const mp_env* env);

static int sync_group_body(const mp_env* env) {
  setenv("BRAID_STREAM_MEMOPS", "0", 1);
  return group_body(env);
}

/* The same where the executor's CUDA backend could not be set up (the
 * driver refuses to pin its slots): the collectives are staged instead. */
static int sync_unpinned_body(const mp_env* env) {
  setenv("CUDASIM_NO_REGISTER", "1", 1);
  return sync_order_body(env);
}

static void test_fallback(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, sync_order_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(3, sync_group_body, NULL, NULL), 0);
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim"))
    assert_int_equal(mp_launch(2, sync_unpinned_body, NULL, NULL), 0);
}

/* ---- (3) a group on two streams, and send/recv in a ring ---- */

static int group_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s1, s2;
  int bad = 0, n = env->nranks;
  if (dev_open(env, 0) || mp_comm_init(env, &comm)) return 1;
  if ((s1 = dev_stream(env)) == NULL || (s2 = dev_stream(env)) == NULL) return 1;
  dev_call a = {
      .host = {.coll = CC_ALLREDUCE, .type = ncclFloat32, .kind = AR_SUM, .count = 70001}};
  dev_call g = {.host = {.coll = CC_ALLGATHER, .type = ncclBfloat16, .count = 30011}};
  a.host.op = ncclSum;
  a.host.salt = 1, g.host.salt = 2;
  if (dev_call_prepare(&a, env) || dev_call_prepare(&g, env)) return 1;
  /* send to the next rank, receive from the previous one, on s2 */
  size_t cnt = 12345, bytes = cnt * sizeof(int32_t);
  int32_t* h = malloc(bytes);
  void *ds = NULL, *dr = NULL;
  if (!h || ncclMemAlloc(&ds, bytes) || ncclMemAlloc(&dr, bytes)) return 1;
  for (size_t i = 0; i < cnt; i++) h[i] = env->rank * 100000 + (int32_t)i;
  bad += dev_copy(env, ds, h, bytes);
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  bad += mp_expect_rc(env, comm, cc_issue(&a.dev, comm, s1), ncclSuccess, "allreduce on s1");
  bad += mp_expect_rc(env, comm, cc_issue(&g.dev, comm, s2), ncclSuccess, "allgather on s2");
  bad += mp_expect_rc(env, comm, ncclSend(ds, cnt, ncclInt32, (env->rank + 1) % n, comm, s2),
                      ncclSuccess, "ncclSend on s2");
  bad += mp_expect_rc(env, comm, ncclRecv(dr, cnt, ncclInt32, (env->rank + n - 1) % n, comm, s2),
                      ncclSuccess, "ncclRecv on s2");
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
  bad += dev_sync(env, s1) + dev_sync(env, s2);
  bad += dev_call_fetch(&a, env) + dev_call_fetch(&g, env);
  bad += cc_verify(&a.host, env) + cc_verify(&g.host, env);
  bad += dev_copy(env, h, dr, bytes);
  int from = (env->rank + n - 1) % n;
  for (size_t i = 0; i < cnt && !bad; i++)
    if (h[i] != from * 100000 + (int32_t)i)
      mp_fail(env, "recv from %d: [%zu] = %d", from, i, h[i]), bad++;
  dev_call_release(&a);
  dev_call_release(&g);
  ncclMemFree(ds);
  ncclMemFree(dr);
  free(h);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_group_two_streams(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, group_body, NULL, NULL), 0);
}

/* ---- (3b) a PreMulSum scalar in device memory, read in stream order ---- */

#define SCALAR_COUNT 10007

static int scalar_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  ncclRedOp_t op;
  int bad = 0, n = env->nranks;
  size_t bytes = SCALAR_COUNT * sizeof(float);
  float h[SCALAR_COUNT], half = 0.5f, two = 2.0f, *out = malloc(2 * bytes);
  void *dscalar = NULL, *dx = NULL, *dy = NULL;
  if (out == NULL || dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  if (ncclMemAlloc(&dscalar, sizeof(float)) || ncclMemAlloc(&dx, bytes) ||
      ncclMemAlloc(&dy, 2 * bytes))
    return 1;
  for (size_t i = 0; i < SCALAR_COUNT; i++) h[i] = (float)(env->rank + 1) * (float)(i % 7);
  bad += dev_copy(env, dx, h, bytes) + dev_copy(env, dscalar, &half, sizeof(float));
  bad += mp_expect_rc(env, comm,
                      ncclRedOpCreatePreMulSum(&op, dscalar, ncclFloat32, ncclScalarDevice, comm),
                      ncclSuccess, "ncclRedOpCreatePreMulSum (device scalar)");
  /* the second call must see the scalar the stream wrote between the calls */
  bad += mp_expect_rc(env, comm, ncclAllReduce(dx, dy, SCALAR_COUNT, ncclFloat32, op, comm, s),
                      ncclSuccess, "premulsum x 0.5");
  bad += dev_copy_async(env, dscalar, &two, sizeof(float), s);
  bad += mp_expect_rc(env, comm,
                      ncclAllReduce(dx, (char*)dy + bytes, SCALAR_COUNT, ncclFloat32, op, comm, s),
                      ncclSuccess, "premulsum x 2 (scalar written on the stream)");
  bad += dev_sync(env, s) + dev_copy(env, out, dy, 2 * bytes);
  float sum_r = (float)(n * (n + 1) / 2);
  for (size_t i = 0; i < SCALAR_COUNT && !bad; i++) {
    float w0 = 0.5f * sum_r * (float)(i % 7), w1 = 2.0f * sum_r * (float)(i % 7);
    if (out[i] != w0 || out[SCALAR_COUNT + i] != w1)
      mp_fail(env, "premulsum with a device scalar [%zu]: %g and %g, expected %g and %g", i, out[i],
              out[SCALAR_COUNT + i], w0, w1),
          bad++;
  }
  ncclRedOpDestroy(op, comm);
  ncclMemFree(dscalar);
  ncclMemFree(dx);
  ncclMemFree(dy);
  free(out);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_device_scalar(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, scalar_body, NULL, NULL), 0);
}

/* ---- (3c) PreMulSum with a scalar of each rank's own, direct ---- */

#define PREMUL_COUNT 10007 /* per rank's block of the reduce-scatter too */

/* Rank r's element i, and the sum of every rank's times its scalar r + 1. */
static float premul_in(int r, size_t i) {
  return (float)(i % 100) + (float)r;
}

static float premul_want(int n, size_t i) {
  float w = 0;
  for (int r = 0; r < n; r++) w += (float)(r + 1) * premul_in(r, i);
  return w;
}

/* One collective of the PreMulSum `op` (rank r's scalar r + 1), checked:
 * all-reduce in place and out, reduce-scatter, reduce to the last rank. */
static int premul_call(const mp_env* env, ncclComm_t comm, cudaStream_t s, ncclRedOp_t op, int k,
                       float* dx, float* dy, float* h) {
  int n = env->nranks, r = env->rank, bad = 0, root = n - 1;
  size_t total = (size_t)n * PREMUL_COUNT, out = k == 2 ? PREMUL_COUNT : total;
  static const char* const names[] = {"allreduce in place", "allreduce", "reducescatter", "reduce"};
  for (size_t i = 0; i < total; i++) h[i] = premul_in(r, i);
  bad += dev_copy(env, dx, h, total * sizeof(float));
  ncclResult_t rc = k == 0   ? ncclAllReduce(dx, dx, total, ncclFloat32, op, comm, s)
                    : k == 1 ? ncclAllReduce(dx, dy, total, ncclFloat32, op, comm, s)
                    : k == 2 ? ncclReduceScatter(dx, dy, PREMUL_COUNT, ncclFloat32, op, comm, s)
                             : ncclReduce(dx, dy, total, ncclFloat32, op, root, comm, s);
  bad += mp_expect_rc(env, comm, rc, ncclSuccess, names[k]);
  bad += dev_sync(env, s) + dev_copy(env, h, k == 0 ? dx : dy, out * sizeof(float));
  if (k == 3 && r != root) return bad;
  for (size_t i = 0; i < out && !bad; i++) {
    size_t at = k == 2 ? (size_t)r * PREMUL_COUNT + i : i;
    if (h[i] != premul_want(n, at))
      mp_fail(env, "premulsum %s [%zu] = %g, want %g", names[k], i, (double)h[i],
              (double)premul_want(n, at)),
          bad++;
  }
  return bad;
}

/* Each rank's scalar is its own (r + 1; in device memory on odd ranks,
 * immediate on even ones), as NCCL allows: the direct path multiplies each
 * input by its own rank's scalar before the sum (cuda_direct.c,
 * premul_input), on one node and (arg: 2 x 2, NCCL_HOSTID) under Hier's
 * direct node stages; gated, or synchronous (BRAID_STREAM_MEMOPS=0). */
static int premul_ranks_body(const mp_env* env) {
  const int* how = env->arg; /* {hosts of two ranks, synchronous} */
  ncclComm_t comm;
  cudaStream_t s;
  ncclRedOp_t op;
  mp_capture cap;
  char host[32];
  int bad = 0, n = env->nranks;
  float scalar = (float)(env->rank + 1), *dscalar = NULL, *dx = NULL, *dy = NULL;
  float* h = malloc((size_t)n * PREMUL_COUNT * sizeof(float));
  setenv("NCCL_ALGO", "Direct,Ring", 1);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  if (how[1]) setenv("BRAID_STREAM_MEMOPS", "0", 1);
  snprintf(host, sizeof(host), "fake-node-%d", how[0] ? env->rank / 2 : 0);
  if (how[0]) setenv("NCCL_HOSTID", host, 1);
  if (h == NULL || dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  size_t bytes = (size_t)n * PREMUL_COUNT * sizeof(float);
  if (ncclMemAlloc((void**)&dscalar, sizeof(float)) || ncclMemAlloc((void**)&dx, bytes) ||
      ncclMemAlloc((void**)&dy, bytes) || mp_capture_begin(&cap))
    return 1;
  int on_device = env->rank % 2;
  if (on_device) bad += dev_copy(env, dscalar, &scalar, sizeof(float));
  bad += mp_expect_rc(
      env, comm,
      ncclRedOpCreatePreMulSum(&op, on_device ? (void*)dscalar : (void*)&scalar, ncclFloat32,
                               on_device ? ncclScalarDevice : ncclScalarHostImmediate, comm),
      ncclSuccess, "ncclRedOpCreatePreMulSum");
  for (int k = 0; k < 4 && !bad; k++) {
    if (how[0] && k == 3)
      continue; /* a reduce goes Hier only where the network moves device
                   memory (cuda_direct_policy.c) */
    bad += premul_call(env, comm, s, op, k, dx, dy, h);
  }
  int direct = mp_capture_count(&cap, how[0] ? "Hier with direct node stages" : "Direct instead");
  mp_capture_end_quiet(&cap);
  if (!bad && direct != (how[0] ? 3 : 4))
    mp_fail(env, "%d PreMulSum calls ran direct, want %d", direct, how[0] ? 3 : 4), bad++;
  ncclRedOpDestroy(op, comm);
  ncclMemFree(dscalar);
  ncclMemFree(dx);
  ncclMemFree(dy);
  free(h);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_premul_ranks(void** state) {
  (void)state;
  static const int node[2] = {0, 0}, node_sync[2] = {0, 1}, hier[2] = {1, 0}, hier_sync[2] = {1, 1};
  assert_int_equal(mp_launch(3, premul_ranks_body, (void*)node, NULL), 0);
  assert_int_equal(mp_launch(3, premul_ranks_body, (void*)node_sync, NULL), 0);
  assert_int_equal(mp_launch(4, premul_ranks_body, (void*)hier, NULL), 0);
  assert_int_equal(mp_launch(4, premul_ranks_body, (void*)hier_sync, NULL), 0);
}

/* ---- (4) several ranks of one process on one device ---- */

#define THREADS_RANKS 4
#define THREADS_COUNT 50021

static int threads_body(const mp_env* env) {
  ncclComm_t comms[THREADS_RANKS];
  cudaStream_t s[THREADS_RANKS];
  void* d[THREADS_RANKS];
  int devs[THREADS_RANKS] = {0}, bad = 0;
  size_t bytes = THREADS_COUNT * sizeof(float);
  float* h = malloc(bytes);
  if (h == NULL || dev_open(env, 0)) return 1;
  bad += mp_expect_rc(env, NULL, ncclCommInitAll(comms, THREADS_RANKS, devs), ncclSuccess,
                      "ncclCommInitAll on one device");
  if (bad) return 1;
  for (int r = 0; r < THREADS_RANKS; r++) {
    int dev = -1;
    bad += mp_expect_rc(env, comms[r], ncclCommCuDevice(comms[r], &dev), ncclSuccess,
                        "ncclCommCuDevice");
    if (dev != 0) mp_fail(env, "comm %d reports device %d, made on 0", r, dev), bad++;
    if ((s[r] = dev_stream(env)) == NULL || ncclMemAlloc(&d[r], bytes)) return 1;
    for (size_t i = 0; i < THREADS_COUNT; i++) h[i] = (float)(r + 1) * (float)(i % 1000);
    bad += dev_copy(env, d[r], h, bytes);
  }
  /* one thread drives all four: only a group can (each call waits for the others) */
  bad += mp_expect_rc(env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  for (int r = 0; r < THREADS_RANKS; r++)
    bad +=
        mp_expect_rc(env, comms[r],
                     ncclAllReduce(d[r], d[r], THREADS_COUNT, ncclFloat32, ncclSum, comms[r], s[r]),
                     ncclSuccess, "allreduce in the group");
  bad += mp_expect_rc(env, NULL, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
  for (int r = 0; r < THREADS_RANKS && !bad; r++) {
    bad += dev_sync(env, s[r]) + dev_copy(env, h, d[r], bytes);
    for (size_t i = 0; i < THREADS_COUNT && !bad; i++)
      if (h[i] != 10.0f * (float)(i % 1000))
        mp_fail(env, "comm %d [%zu] = %g, expected %g", r, i, h[i], 10.0 * (double)(i % 1000)),
            bad++;
  }
  for (int r = 0; r < THREADS_RANKS; r++) {
    ncclMemFree(d[r]);
    bad += mp_expect_rc(env, comms[r], ncclCommDestroy(comms[r]), ncclSuccess, "ncclCommDestroy");
  }
  free(h);
  return bad;
}

/* On one queue too: ranks of one process share a CUDA context, where a
 * stream waiting for the host must not be what holds back the stream of
 * another rank (4 ranks as threads hung on the H200 while they did). */
static int threads_one_queue_body(const mp_env* env) {
  setenv("CUDASIM_ONE_QUEUE", "1", 1);
  return threads_body(env);
}

static void test_ranks_as_threads(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  assert_int_equal(mp_launch(1, threads_body, NULL, &o), 0);
  assert_int_equal(mp_launch(1, threads_one_queue_body, NULL, &o), 0);
}

/* ---- (5) a killed peer: the survivors' streams drain ---- */

#define KILL_COUNT 300007

/* The survivors enqueue their calls, then the victim dies (SIGKILL) before
 * making its own: the survivors' streams wait at gates (and, direct, at
 * their kernels' go flags) of calls that can only fail, and must still
 * drain. arg NULL: the tuner's choice (direct at this size), else staged
 * (NCCL_ALGO=^Direct). */
static int killed_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  void* d = NULL;
  int bad = 0, victim = env->nranks - 1;
  if (env->arg) setenv("NCCL_ALGO", "^Direct", 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, KILL_COUNT * sizeof(float))) return 1;
  /* one healthy call first, so every connection exists */
  bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, KILL_COUNT, ncclFloat32, ncclSum, comm, s),
                      ncclSuccess, "allreduce before the kill");
  bad += dev_sync(env, s);
  if (env->rank == victim) {
    for (int r = 0; r < victim; r++) mp_wait_flag(&env->shm[r], 30000);
    mp_notify_parent(); /* SIGKILLed here */
    for (;;) mp_sleep_ms(1000);
  }
  for (int k = 0; k < 3; k++) /* queued behind each other: all must drain */
    bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, KILL_COUNT, ncclFloat32, ncclSum, comm, s),
                        ncclSuccess, "allreduce enqueued before the kill");
  double t0 = mp_now();
  __atomic_store_n((int*)&env->shm[env->rank], 1, __ATOMIC_SEQ_CST);
  bad += dev_sync(env, s); /* must return: the proxy opens every gate */
  double waited = mp_now() - t0;
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  if (async == ncclSuccess || async == ncclInProgress)
    mp_fail(env, "after the peer died: async error %d, expected an error", (int)async), bad++;
  ncclResult_t next = ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s);
  if (next == ncclSuccess) mp_fail(env, "the next call after the failure returned success"), bad++;
  mp_log(env, "stream drained %.2f s after the calls were queued; async error %d, next call %d",
         waited, (int)async, (int)next);
  ncclCommAbort(comm);
  return bad;
}

/* ---- (6) non-blocking comms, and abort: the stream drains ---- */

/* Polls ncclCommGetAsyncError until it stops saying ncclInProgress. */
static ncclResult_t settle(ncclComm_t comm) {
  ncclResult_t st = ncclInProgress;
  double end = mp_now() + 30;
  while (ncclCommGetAsyncError(comm, &st) == ncclSuccess && st == ncclInProgress && mp_now() < end)
    mp_sleep_ms(1);
  return st;
}

static int nonblocking_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  int bad = 0;
  cfg.blocking = 0;
  if (dev_open(env, 0) || (s = dev_stream(env)) == NULL) return 1;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, env->nranks, env->id, env->rank, &cfg);
  if (rc != ncclSuccess && rc != ncclInProgress)
    return mp_expect_rc(env, NULL, rc, ncclSuccess, "init");
  bad += mp_expect_rc(env, comm, settle(comm), ncclSuccess, "non-blocking init");
  dev_call a = {.host = {.coll = CC_ALLREDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 77777}};
  a.host.op = ncclSum;
  if (bad || dev_call_prepare(&a, env)) return 1;
  rc = cc_issue(&a.dev, comm, s);
  if (rc != ncclSuccess && rc != ncclInProgress)
    bad += mp_expect_rc(env, comm, rc, ncclInProgress, "allreduce on a non-blocking comm");
  bad += dev_sync(env, s);
  bad += mp_expect_rc(env, comm, settle(comm), ncclSuccess, "after the stream synchronized");
  bad += dev_call_fetch(&a, env) + cc_verify(&a.host, env);
  dev_call_release(&a);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_nonblocking(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, nonblocking_body, NULL, NULL), 0);
}

/* Rank 0 queues a call its peer never makes, then aborts the comm from the
 * host well before the timeout: its stream must drain, and the comm's
 * pinned memory must outlive what the stream still reads (ASan checks the
 * simulated GPU's copy-out). */
static int abort_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  void* d = NULL;
  int bad = 0;
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, 4096 * sizeof(float))) return 1;
  if (env->rank == 0) {
    bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, 4096, ncclFloat32, ncclSum, comm, s),
                        ncclSuccess, "allreduce the peer never makes");
    mp_sleep_ms(300);
    double t0 = mp_now();
    bad += mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort");
    bad += dev_sync(env, s);
    double waited = mp_now() - t0;
    if (waited > 2.0)
      mp_fail(env, "the stream drained %.2f s after the abort (timeout is 3 s)", waited), bad++;
    __atomic_store_n((int*)&env->shm[0], 1, __ATOMIC_SEQ_CST);
  } else {
    mp_wait_flag(&env->shm[0], 30000);
    ncclCommAbort(comm);
  }
  ncclMemFree(d);
  return bad;
}

static void test_abort(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, abort_body, NULL, NULL), 0);
}

/* A stream under CUDA graph capture: refused with ncclInvalidUsage and a
 * message, nothing enqueued, the comm still usable. */
static int capture_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  void* d = NULL;
  int bad = 0;
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, 1024 * sizeof(float))) return 1;
  setenv("CUDASIM_CAPTURING", "all", 1);
  bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, 1024, ncclFloat32, ncclSum, comm, s),
                      ncclInvalidUsage, "allreduce on a capturing stream");
  bad += mp_expect_last_error(env, comm, "after the capture refusal");
  unsetenv("CUDASIM_CAPTURING");
  bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, 1024, ncclFloat32, ncclSum, comm, s),
                      ncclSuccess, "allreduce after the capture ended");
  bad += dev_sync(env, s);
  ncclMemFree(d);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_graph_capture_refused(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, capture_body, NULL, NULL), 0);
}

/* A stream that fails before it reaches a queued call (a broken context):
 * the proxy notices, the comm reports the CUDA error, nothing hangs. The
 * stream is held before the call by a wait on a host flag, then the
 * simulated driver is told to report the context broken. */
static int stream_error_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  void* d = NULL;
  static volatile uint64_t hold;
  int bad = 0;
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc(&d, 1024 * sizeof(float))) return 1;
  if (env->rank == 0) {
    bad += dev_wait_flag(env, s, &hold, 1);
    bad += mp_expect_rc(env, comm, ncclAllReduce(d, d, 1024, ncclFloat32, ncclSum, comm, s),
                        ncclSuccess, "allreduce queued behind the held stream");
    setenv("CUDASIM_STREAM_ERROR", "1", 1);
    ncclResult_t async = ncclSuccess;
    double end = mp_now() + 2.0; /* the proxy checks every 100 ms; the timeout is 3 s */
    while (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess &&
           mp_now() < end)
      mp_sleep_ms(10);
    if (async != ncclUnhandledCudaError)
      mp_fail(env, "a failed stream: async error %d, expected ncclUnhandledCudaError", (int)async),
          bad++;
    unsetenv("CUDASIM_STREAM_ERROR");
    __atomic_store_n(&hold, 1, __ATOMIC_RELEASE); /* the stream goes on: its gate is open */
    bad += dev_sync(env, s);
  }
  __atomic_fetch_add((int*)&env->shm[0], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n((int*)&env->shm[0], __ATOMIC_SEQ_CST) < env->nranks) mp_sleep_ms(1);
  ncclCommAbort(comm);
  ncclMemFree(d);
  return bad;
}

static void test_stream_error(void** state) {
  (void)state;
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) skip();
  assert_int_equal(mp_launch(2, stream_error_body, NULL, NULL), 0);
}

/* The simulated driver holds the host off device memory, as a GPU does:
 * a rank that reads it dies. */
static int touch_body(const mp_env* env) {
  void* d = NULL;
  if (dev_open(env, 0) || ncclMemAlloc(&d, 4096) != ncclSuccess)
    return 0; /* not the failure sought */
  mp_log(env, "reading device memory from the host (a SIGSEGV is expected)");
  return *(volatile char*)d == 0x7f ? 2 : 3;
}

static void test_host_cannot_touch(void** state) {
  (void)state;
  if (strstr(getenv("BRAID_CUDA_LIB"), "cudasim") == NULL) skip();
  assert_int_equal(mp_launch(1, touch_body, NULL, NULL), 1);
}

/* Hier on devices with a rank killed on the second node: its node peer's
 * direct stage and its column peer's ring fail at once, the others hear
 * of it through their failing peers; every stream drains. Gated, then
 * synchronous. */
static int hier_killed_body(const mp_env* env) {
  char host[32];
  snprintf(host, sizeof(host), "fake-node-%d", env->rank / 2);
  setenv("NCCL_HOSTID", host, 1);
  return direct_killed_body(env);
}

static void test_hier_direct_killed_peer(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.victim = 3;
  o.kill_on_notify = 1;
  launch_twice(4, hier_killed_body, &o);
}

static void test_direct_killed_peer(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.victim = 2;
  o.kill_on_notify = 1;
  launch_twice(3, direct_killed_body, &o);
}

static void test_killed_peer(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.victim = 2;
  o.kill_on_notify = 1;
  o.deadline_s = 60;
  launch_twice(3, killed_body, &o);
}

int main(void) {
  mp_default_env("BRAID_CUDA_LIB", "build/tests/libcudasim.so");
  mp_default_env("BRAID_TIMEOUT_MS", "3000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_matrix),
      cmocka_unit_test(test_matrix_synchronous),
      cmocka_unit_test(test_matrix_direct),
      cmocka_unit_test(test_matrix_direct_bound),
      cmocka_unit_test(test_direct_two_devices),
      cmocka_unit_test(test_hier_direct),
      cmocka_unit_test(test_direct_threads),
      cmocka_unit_test(test_direct_group),
      cmocka_unit_test(test_direct_async),
      cmocka_unit_test(test_direct_no_host_links),
      cmocka_unit_test(test_direct_realloc),
      cmocka_unit_test(test_direct_registered),
      cmocka_unit_test(test_direct_failure),
      cmocka_unit_test(test_direct_late_failure),
      cmocka_unit_test(test_direct_visible_devices),
      cmocka_unit_test(test_direct_killed_peer),
      cmocka_unit_test(test_hier_direct_killed_peer),
      cmocka_unit_test(test_mixed_buffers),
      cmocka_unit_test(test_ordering),
      cmocka_unit_test(test_many_queued),
      cmocka_unit_test(test_one_queue),
      cmocka_unit_test(test_fallback),
      cmocka_unit_test(test_group_two_streams),
      cmocka_unit_test(test_device_scalar),
      cmocka_unit_test(test_premul_ranks),
      cmocka_unit_test(test_ranks_as_threads),
      cmocka_unit_test(test_killed_peer),
      cmocka_unit_test(test_nonblocking),
      cmocka_unit_test(test_abort),
      cmocka_unit_test(test_graph_capture_refused),
      cmocka_unit_test(test_stream_error),
      cmocka_unit_test(test_host_cannot_touch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
