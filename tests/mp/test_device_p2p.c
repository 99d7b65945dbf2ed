/* Send/recv on device buffers between ranks of one node, over the CUDA IPC
 * transport (transports/cudaipc): the receiver announces its buffer, the
 * sender copies into it device to device. Ring exchanges of several sizes
 * and misalignments with two messages per pair in flight, on cuMem
 * (ncclMemAlloc, fd handles) and cuMemAlloc (legacy handles) memory,
 * registered receive buffers, gated on the stream and synchronous, on one
 * simulated device and on two, as processes and as threads; buffers freed
 * and reallocated at the same address between calls; proof that CUDA IPC
 * carried the data (with exports refused it fails, with NCCL_P2P_DISABLE
 * the same calls are staged and succeed); a size mismatch reported by the
 * receiver with its buffer untouched; a killed peer whose survivor's
 * stream still drains. `make test` runs it on the simulated driver. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "devmem.h"
#include "launcher.h"

#define P2P_MAX_BYTES ((size_t)1 << 20)
#define P2P_SLACK 64 /* bytes past a message that must stay untouched */
#define P2P_UNTOUCHED 0xa5

/* How a body runs: the knobs it sets before init. */
struct p2p_mode {
  const char* name;
  int sync;        /* BRAID_STREAM_MEMOPS=0: calls block, copies on the copy stream */
  int two_devices; /* ranks alternate between two simulated devices */
  int legacy;      /* buffers from cuMemAlloc (legacy IPC handles), else ncclMemAlloc */
  int p2p_disable; /* NCCL_P2P_DISABLE=1: staged through host memory */
};

static const struct p2p_mode kGated = {"gated", 0, 0, 0, 0};
static const struct p2p_mode kSync = {"synchronous", 1, 0, 0, 0};
static const struct p2p_mode kLegacy = {"legacy handles", 0, 0, 1, 0};
static const struct p2p_mode kTwoDevices = {"two devices", 0, 1, 0, 0};
static const struct p2p_mode kTwoDevicesSync = {"two devices, synchronous", 1, 1, 1, 0};
static const struct p2p_mode kDisabled = {"NCCL_P2P_DISABLE", 0, 0, 0, 1};

static int mode_device(const struct p2p_mode* m, int rank) {
  return m->two_devices ? rank % 2 : 0;
}

static int mode_open(const mp_env* env, const struct p2p_mode* m, int rank) {
  if (m->sync) setenv("BRAID_STREAM_MEMOPS", "0", 1);
  if (m->two_devices) setenv("CUDASIM_DEVICES", "2", 1);
  if (m->p2p_disable) setenv("NCCL_P2P_DISABLE", "1", 1);
  return dev_open(env, mode_device(m, rank));
}

static void* buf_alloc(const mp_env* env, const struct p2p_mode* m, size_t bytes) {
  void* p = NULL;
  if (m->legacy) return dev_alloc_legacy(env, bytes);
  return ncclMemAlloc(&p, bytes) == ncclSuccess ? p : NULL;
}

static void buf_free(const struct p2p_mode* m, void* p) {
  if (m->legacy)
    dev_free_legacy(p);
  else
    ncclMemFree(p);
}

static uint8_t pattern(uint64_t salt, int from, size_t i) {
  return (uint8_t)(salt * 31u + (uint64_t)from * 7u + i * 13u + (i >> 8));
}

/* Fill `bytes` of device memory at d with the pattern of (salt, rank). */
static int fill(const mp_env* env, void* d, size_t bytes, uint64_t salt, int rank) {
  uint8_t* h = malloc(bytes ? bytes : 1);
  if (h == NULL) return 1;
  for (size_t i = 0; i < bytes; i++) h[i] = pattern(salt, rank, i);
  int bad = dev_copy(env, d, h, bytes);
  free(h);
  return bad;
}

static int clear(const mp_env* env, void* d, size_t bytes) {
  uint8_t* h = malloc(bytes);
  if (h == NULL) return 1;
  memset(h, P2P_UNTOUCHED, bytes);
  int bad = dev_copy(env, d, h, bytes);
  free(h);
  return bad;
}

/* d holds (salt, from)'s pattern for `bytes`, then P2P_SLACK untouched
 * bytes; with from < 0, all of it is untouched. */
static int check(const mp_env* env, const void* d, size_t bytes, uint64_t salt, int from,
                 const char* what) {
  size_t all = bytes + P2P_SLACK;
  uint8_t* h = malloc(all);
  int bad = h == NULL || dev_copy(env, h, d, all);
  for (size_t i = 0; i < all && !bad; i++) {
    uint8_t want = from >= 0 && i < bytes ? pattern(salt, from, i) : P2P_UNTOUCHED;
    if (h[i] != want)
      mp_fail(env, "%s: byte %zu of %zu is %#x, expected %#x", what, i, bytes, h[i], want), bad++;
  }
  free(h);
  return bad;
}

/* One exchange around the ring in a group: two messages to the next rank
 * (bytes, then bytes / 2 + 1 right after it in the same buffers), two
 * from the previous; received into recv + off. */
static int ring_round(const mp_env* env, ncclComm_t comm, cudaStream_t s, char* send, char* recv,
                      size_t bytes, size_t off, uint64_t salt) {
  int n = env->nranks, next = (env->rank + 1) % n, prev = (env->rank + n - 1) % n, bad = 0;
  size_t second = bytes / 2 + 1, gap = bytes + P2P_SLACK;
  char what[96];
  bad += fill(env, send + off, bytes, salt, env->rank);
  bad += fill(env, send + off + gap, second, salt + 1, env->rank);
  bad += clear(env, recv, 2 * gap + off + P2P_SLACK);
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  bad += mp_expect_rc(env, comm, ncclSend(send + off, bytes, ncclUint8, next, comm, s), ncclSuccess,
                      "ncclSend");
  bad += mp_expect_rc(env, comm, ncclSend(send + off + gap, second, ncclUint8, next, comm, s),
                      ncclSuccess, "ncclSend (second)");
  bad += mp_expect_rc(env, comm, ncclRecv(recv + off, bytes, ncclUint8, prev, comm, s), ncclSuccess,
                      "ncclRecv");
  bad += mp_expect_rc(env, comm, ncclRecv(recv + off + gap, second, ncclUint8, prev, comm, s),
                      ncclSuccess, "ncclRecv (second)");
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
  bad += dev_sync(env, s);
  snprintf(what, sizeof(what), "%zu bytes at offset %zu from rank %d", bytes, off, prev);
  bad += check(env, recv + off, bytes, salt, prev, what);
  bad += check(env, recv + off + gap, second, salt + 1, prev, what);
  return bad;
}

static const size_t kSizes[] = {1, 7, 4099, 65536, P2P_MAX_BYTES / 3};
#define NSIZES (sizeof(kSizes) / sizeof(kSizes[0]))

/* Every size at offsets 0 and 3, then once more with the receive buffer
 * registered (its export made once, at ncclCommRegister). */
static int ring_all(const mp_env* env, const struct p2p_mode* m, ncclComm_t comm, cudaStream_t s) {
  size_t cap = 2 * (P2P_MAX_BYTES + P2P_SLACK) + 64;
  char *send = buf_alloc(env, m, cap), *recv = buf_alloc(env, m, cap);
  void* reg = NULL;
  int bad = send == NULL || recv == NULL;
  for (size_t k = 0; k < NSIZES && !bad; k++)
    for (size_t off = 0; off <= 3 && !bad; off += 3)
      bad += ring_round(env, comm, s, send, recv, kSizes[k], off, 10 * k + off);
  bad += mp_expect_rc(env, comm, ncclCommRegister(comm, recv, cap, &reg), ncclSuccess,
                      "ncclCommRegister");
  for (int k = 0; k < 2 && !bad; k++) bad += ring_round(env, comm, s, send, recv, 40001, 8, 90 + k);
  bad += mp_expect_rc(env, comm, ncclCommDeregister(comm, reg), ncclSuccess, "ncclCommDeregister");
  buf_free(m, send);
  buf_free(m, recv);
  return bad;
}

static int ring_body(const mp_env* env) {
  const struct p2p_mode* m = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  if (mode_open(env, m, env->rank) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  bad += ring_all(env, m, comm, s);
  if (env->rank == 0)
    mp_log(env, "ring on %d ranks, %s: %s", env->nranks, m->name, bad ? "FAILED" : "ok");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_ring(void** state) {
  (void)state;
  const struct p2p_mode* modes[] = {&kGated,      &kSync,           &kLegacy,
                                    &kTwoDevices, &kTwoDevicesSync, &kDisabled};
  for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++)
    assert_int_equal(mp_launch(2, ring_body, (void*)modes[i], NULL), 0);
  assert_int_equal(mp_launch(4, ring_body, (void*)&kGated, NULL), 0);
  assert_int_equal(mp_launch(3, ring_body, (void*)&kTwoDevicesSync, NULL), 0);
}

/* ---- Ranks as threads: the peers' pointers used as they are ---- */

#define P2P_THREADS 3

struct p2p_thread {
  mp_env env;
  ncclComm_t comm;
  const struct p2p_mode* mode;
  int bad;
};

static void* thread_main(void* arg) {
  struct p2p_thread* t = arg;
  cudaStream_t s;
  if (dev_open(&t->env, mode_device(t->mode, t->env.rank)) || (s = dev_stream(&t->env)) == NULL) {
    t->bad = 1;
    return NULL;
  }
  t->bad = ring_all(&t->env, t->mode, t->comm, s);
  return NULL;
}

static int threads_body(const mp_env* env) {
  const struct p2p_mode* m = env->arg;
  ncclComm_t comms[P2P_THREADS];
  struct p2p_thread th[P2P_THREADS];
  pthread_t ids[P2P_THREADS];
  int devs[P2P_THREADS], bad = 0;
  for (int r = 0; r < P2P_THREADS; r++) devs[r] = mode_device(m, r);
  if (mode_open(env, m, 0)) return 1;
  bad += mp_expect_rc(env, NULL, ncclCommInitAll(comms, P2P_THREADS, devs), ncclSuccess,
                      "ncclCommInitAll");
  for (int r = 0; r < P2P_THREADS && !bad; r++) {
    th[r] = (struct p2p_thread){*env, comms[r], m, 0};
    th[r].env.rank = r;
    th[r].env.nranks = P2P_THREADS;
    if (pthread_create(&ids[r], NULL, thread_main, &th[r]) != 0) return 1;
  }
  for (int r = 0; r < P2P_THREADS && !bad; r++) {
    pthread_join(ids[r], NULL);
    bad += th[r].bad;
  }
  for (int r = 0; r < P2P_THREADS; r++)
    bad += mp_expect_rc(env, comms[r], ncclCommDestroy(comms[r]), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_threads(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.no_id = 1;
  assert_int_equal(mp_launch(1, threads_body, (void*)&kGated, &o), 0);
  assert_int_equal(mp_launch(1, threads_body, (void*)&kTwoDevices, &o), 0);
}

/* ---- Buffers freed and reallocated at the same address ---- */

#define REALLOC_BYTES 300001
#define REALLOC_ROUNDS 6

/* Each round both ranks free and reallocate their buffers (the allocator
 * hands the same addresses back): the sender must write the receiver's
 * new buffer, never a stale mapping of the old one. */
static int realloc_body(const mp_env* env) {
  const struct p2p_mode* m = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  void* last = NULL;
  int bad = 0, reused = 0;
  size_t cap = 2 * (REALLOC_BYTES + P2P_SLACK) + 64;
  if (mode_open(env, m, env->rank) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  for (int round = 0; round < REALLOC_ROUNDS && !bad; round++) {
    char *send = buf_alloc(env, m, cap), *recv = buf_alloc(env, m, cap);
    if (send == NULL || recv == NULL) return 1;
    reused += (void*)recv == last;
    last = recv;
    bad += ring_round(env, comm, s, send, recv, REALLOC_BYTES, 0, 200 + (uint64_t)round);
    buf_free(m, send);
    buf_free(m, recv);
  }
  if (env->rank == 0)
    mp_log(env, "%s: %d of %d rounds on a reused address", m->name, reused, REALLOC_ROUNDS);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_reallocated(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, realloc_body, (void*)&kGated, NULL), 0);
  assert_int_equal(mp_launch(2, realloc_body, (void*)&kLegacy, NULL), 0);
}

/* ---- CUDA IPC carries the data ---- */

/* One exchange of 2 ranks on fresh cuMem buffers, its outcome. */
static ncclResult_t swap_once(const mp_env* env, ncclComm_t comm, cudaStream_t s, size_t bytes) {
  void *send = NULL, *recv = NULL;
  int peer = 1 - env->rank;
  if (ncclMemAlloc(&send, bytes) || ncclMemAlloc(&recv, bytes)) return ncclSystemError;
  ncclGroupStart();
  ncclSend(send, bytes, ncclUint8, peer, comm, s);
  ncclRecv(recv, bytes, ncclUint8, peer, comm, s);
  ncclResult_t rc = dev_outcome(env, comm, s, ncclGroupEnd());
  ncclMemFree(send);
  ncclMemFree(recv);
  return rc;
}

/* With the driver refusing every new cuMem export, an exchange on new
 * buffers fails (the receiver cannot describe its buffer: nothing is
 * staged through host memory), and the peer hears of it instead of
 * waiting; under NCCL_P2P_DISABLE the same exchange is staged and
 * succeeds. */
static int refused_body(const mp_env* env) {
  const struct p2p_mode* m = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  if (mode_open(env, m, env->rank) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  bad += mp_expect_rc(env, comm, swap_once(env, comm, s, 5000), ncclSuccess, "a healthy exchange");
  setenv("CUDASIM_NO_EXPORT", "1", 1);
  ncclResult_t rc = swap_once(env, comm, s, 5000);
  if (m->p2p_disable)
    bad += mp_expect_rc(env, comm, rc, ncclSuccess, "a staged exchange without exports");
  else if (rc == ncclSuccess)
    mp_fail(env, "an exchange without exports succeeded: CUDA IPC did not carry it"), bad++;
  mp_log(env, "%s, exports refused: %d", m->name, (int)rc);
  ncclCommAbort(comm);
  return bad;
}

static void test_ipc_carries(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, refused_body, (void*)&kGated, NULL), 0);
  assert_int_equal(mp_launch(2, refused_body, (void*)&kSync, NULL), 0);
  assert_int_equal(mp_launch(2, refused_body, (void*)&kDisabled, NULL), 0);
}

/* ---- A size mismatch: the receiver says so, its buffer untouched ---- */

#define MISMATCH_BYTES 10000

static int mismatch_body(const mp_env* env) {
  const struct p2p_mode* m = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  size_t bytes = MISMATCH_BYTES + (env->rank == 1 ? 8 : 0); /* rank 1 expects more */
  if (mode_open(env, m, env->rank) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  char* buf = buf_alloc(env, m, MISMATCH_BYTES + 8 + P2P_SLACK);
  if (buf == NULL) return 1;
  if (env->rank == 0) {
    bad += fill(env, buf, bytes, 7, 0);
    ncclResult_t rc = dev_outcome(env, comm, s, ncclSend(buf, bytes, ncclUint8, 1, comm, s));
    mp_log(env, "%s: the send of %zu bytes: %d", m->name, bytes, (int)rc);
  } else {
    bad += clear(env, buf, bytes + P2P_SLACK);
    ncclResult_t rc = dev_outcome(env, comm, s, ncclRecv(buf, bytes, ncclUint8, 0, comm, s));
    bad += mp_expect_rc(env, comm, rc, ncclInvalidUsage, "a receive larger than its send");
    bad += check(env, buf, 0, 0, -1, "the receive whose send differs");
  }
  ncclCommAbort(comm);
  buf_free(m, buf);
  return bad;
}

static void test_mismatch(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, mismatch_body, (void*)&kGated, NULL), 0);
  assert_int_equal(mp_launch(2, mismatch_body, (void*)&kSync, NULL), 0);
}

/* ---- A killed peer: the survivor's stream drains, the error is told ---- */

#define KILL_BYTES 200000

static int killed_body(const mp_env* env) {
  const struct p2p_mode* m = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0, victim = 1;
  if (mode_open(env, m, env->rank) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL)
    return 1;
  bad += mp_expect_rc(env, comm, swap_once(env, comm, s, KILL_BYTES), ncclSuccess,
                      "an exchange before the kill");
  if (env->rank == victim) {
    mp_wait_flag(&env->shm[0], 30000);
    mp_notify_parent(); /* SIGKILLed here */
    for (;;) mp_sleep_ms(1000);
  }
  __atomic_store_n((int*)&env->shm[env->rank], 1, __ATOMIC_SEQ_CST);
  double t0 = mp_now();
  ncclResult_t rc = swap_once(env, comm, s, KILL_BYTES); /* drains, or the launch times out */
  if (rc == ncclSuccess) mp_fail(env, "an exchange with a dead peer succeeded"), bad++;
  mp_log(env, "%s: exchange with a dead peer: %d after %.2f s", m->name, (int)rc, mp_now() - t0);
  ncclCommAbort(comm);
  return bad;
}

static void test_killed_peer(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  o.victim = 1;
  o.kill_on_notify = 1;
  assert_int_equal(mp_launch(2, killed_body, (void*)&kGated, &o), 0);
  assert_int_equal(mp_launch(2, killed_body, (void*)&kSync, &o), 0);
}

int main(void) {
  mp_default_env("BRAID_CUDA_LIB", "build/tests/libcudasim.so");
  mp_default_env("BRAID_TIMEOUT_MS", "3000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ring),        cmocka_unit_test(test_threads),
      cmocka_unit_test(test_reallocated), cmocka_unit_test(test_ipc_carries),
      cmocka_unit_test(test_mismatch),    cmocka_unit_test(test_killed_peer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
