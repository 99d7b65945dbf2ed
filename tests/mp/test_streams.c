/* Host streams (braid.h): in-order dependent work, overlap with the caller,
 * independence across comms, groups on a stream, sticky errors, bad input,
 * host functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "braid.h"
#include "collcheck.h"
#include "launcher.h"

#define LATE_MS 1000
#define FAST_S 0.25 /* an enqueue must return well before a late peer comes */

/* shm ints 0..63: barriers (one counter per use) */
static void barrier(const mp_env* env, int slot) {
  __atomic_fetch_add((int*)&env->shm[slot], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n((int*)&env->shm[slot], __ATOMIC_SEQ_CST) < env->nranks) mp_sleep_ms(1);
}

static int make_stream(const mp_env* env, cudaStream_t* s) {
  *s = NULL;
  return mp_expect_rc(env, NULL, braidStreamCreate(s), ncclSuccess, "braidStreamCreate");
}

static int sync_ok(const mp_env* env, cudaStream_t s, const char* what) {
  return mp_expect_rc(env, NULL, braidStreamSynchronize(s), ncclSuccess, what);
}

static int end_comm(const mp_env* env, ncclComm_t comm, int bad) {
  if (bad) {
    ncclCommAbort(comm);
    return 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

/* ---- (1) ordering: each call consumes the previous one's output ---- */

#define ORDER_COUNT 100003
#define ORDER_K 6
#define GATHER_M 1000

static int order_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int n = env->nranks, bad = 0;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  uint64_t* x = malloc(ORDER_COUNT * sizeof(uint64_t));
  uint64_t* z = malloc((size_t)n * GATHER_M * sizeof(uint64_t));
  uint64_t* y = malloc(ORDER_COUNT * sizeof(uint64_t));
  if (!x || !y || !z) return 1;
  for (size_t i = 0; i < ORDER_COUNT; i++) x[i] = (uint64_t)env->rank * 7919u + i;
  memset(z, 0, (size_t)n * GATHER_M * sizeof(uint64_t));
  /* x <- sum(x) ORDER_K times; y <- bcast(x from root n-1) + ... ; z <- allgather(x[0..M)) */
  for (int k = 0; k < ORDER_K && !bad; k++)
    bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, ORDER_COUNT, ncclUint64, ncclSum, comm, s),
                        ncclSuccess, "allreduce on a stream");
  bad += mp_expect_rc(env, comm, ncclBroadcast(x, y, ORDER_COUNT, ncclUint64, n - 1, comm, s),
                      ncclSuccess, "broadcast on a stream");
  bad += mp_expect_rc(env, comm, ncclAllGather(y, z, GATHER_M, ncclUint64, comm, s), ncclSuccess,
                      "allgather on a stream");
  bad += sync_ok(env, s, "braidStreamSynchronize (ordering)");
  bad += mp_expect_rc(env, NULL, braidStreamQuery(s), ncclSuccess, "braidStreamQuery after sync");
  /* sum over r of (r*7919 + i) = n*i + 7919*n(n-1)/2, then times n per step */
  uint64_t nn = 1;
  for (int k = 1; k < ORDER_K; k++) nn *= (uint64_t)n;
  for (size_t i = 0; i < ORDER_COUNT && !bad; i++) {
    uint64_t want = ((uint64_t)n * i + 7919u * (uint64_t)(n * (n - 1) / 2)) * nn;
    if (x[i] != want || y[i] != want) {
      mp_fail(env,
              "%d dependent allreduces + broadcast on one stream: [%zu] expected %llu, got "
              "x %llu y %llu",
              ORDER_K, i, (unsigned long long)want, (unsigned long long)x[i],
              (unsigned long long)y[i]);
      bad++;
    }
    if (i < GATHER_M)
      for (int r = 0; r < n && !bad; r++)
        if (z[(size_t)r * GATHER_M + i] != want)
          mp_fail(env, "allgather after them: block %d [%zu] expected %llu got %llu", r, i,
                  (unsigned long long)want, (unsigned long long)z[(size_t)r * GATHER_M + i]),
              bad++;
  }
  free(x);
  free(y);
  free(z);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  return end_comm(env, comm, bad);
}

static void test_ordering(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, order_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(1, order_body, NULL, NULL), 0);
}

/* ---- (2) overlap: the caller computes while the stream waits and works ---- */

static double spin(double seconds, uint64_t* iters) {
  double t0 = mp_now(), acc = 1.0;
  while (mp_now() - t0 < seconds) {
    for (int i = 0; i < 10000; i++) acc = acc * 1.0000001 + 1e-9;
    (*iters)++;
  }
  return acc;
}

static int overlap_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  cc_call c = {.coll = CC_ALLREDUCE, .type = ncclFloat32, .kind = AR_SUM, .count = 1 << 20};
  cc_call r = {.coll = CC_REDUCE, .type = ncclInt8, .kind = AR_MAX, .count = 77777, .root = 0};
  c.salt = 1, r.salt = 2;
  ar_op_create(env, comm, r.type, r.kind, &r.op);
  if (cc_prepare(&c, env) || cc_prepare(&r, env)) return 1;
  barrier(env, 0);
  if (env->rank == 1) mp_sleep_ms(LATE_MS);
  double t0 = mp_now();
  ncclResult_t rc1 = cc_issue(&c, comm, s), rc2 = cc_issue(&r, comm, s);
  double t_enq = mp_now() - t0;
  bad += mp_expect_rc(env, comm, rc1, ncclSuccess, "allreduce enqueue");
  bad += mp_expect_rc(env, comm, rc2, ncclSuccess, "reduce enqueue");
  if (env->rank == 0) {
    ncclResult_t q0 = braidStreamQuery(s);
    uint64_t iters = 0;
    double acc = spin(LATE_MS / 3000.0, &iters); /* compute while rank 1 is away */
    ncclResult_t q1 = braidStreamQuery(s);
    double t_q1 = mp_now() - t0;
    if (t_enq > FAST_S)
      mp_fail(env, "enqueueing 2 calls took %.3f s; a peer %d ms late must not block it", t_enq,
              LATE_MS),
          bad++;
    if (q0 != ncclInProgress || (q1 != ncclInProgress && t_q1 < LATE_MS / 1000.0 * 0.8))
      mp_fail(env,
              "braidStreamQuery while a peer is late: %d then %d (at %.3f s), expected "
              "ncclInProgress",
              (int)q0, (int)q1, t_q1),
          bad++;
    /* then poll until done, computing in between */
    ncclResult_t q;
    int queries = 2;
    double end = t0 + 30;
    while ((q = braidStreamQuery(s)) == ncclInProgress && mp_now() < end) {
      spin(0.002, &iters);
      queries++;
    }
    double t_done = mp_now() - t0;
    bad += mp_expect_rc(env, NULL, q, ncclSuccess, "braidStreamQuery once done");
    if (t_done < LATE_MS / 1000.0 * 0.8)
      mp_fail(env, "stream reported done after %.3f s, before the late peer came", t_done), bad++;
    mp_log(env, "overlap: enqueue %.4f s, done after %.3f s, %d queries, %llu compute slices (%g)",
           t_enq, t_done, queries, (unsigned long long)iters, acc);
  }
  bad += sync_ok(env, s, "braidStreamSynchronize (overlap)");
  if (!bad) bad += cc_verify(&c, env) + cc_verify(&r, env);
  cc_release(&c);
  cc_release(&r);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  return end_comm(env, comm, bad);
}

static void test_overlap(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, overlap_body, NULL, NULL), 0);
}

/* ---- (3) independence: a stream blocked on comm A does not hold back comm B's ---- */

/* Comm B of the same ranks: from a second unique id, or split from A. */
static int second_comm(const mp_env* env, ncclComm_t a, int split, ncclComm_t* b) {
  ncclUniqueId idb;
  if (split)
    return mp_expect_rc(env, a, ncclCommSplit(a, 0, env->rank, b, NULL), ncclSuccess,
                        "ncclCommSplit (comm B)");
  if (cc_share_id(env, 0, 0, &idb)) return 1;
  return mp_expect_rc(env, NULL, ncclCommInitRank(b, env->nranks, idb, env->rank), ncclSuccess,
                      "ncclCommInitRank (comm B)");
}

static int indep_body(const mp_env* env) {
  ncclComm_t a, b;
  cudaStream_t sa, sb;
  int bad = 0, split = *(const int*)env->arg;
  if (mp_comm_init(env, &a) || second_comm(env, a, split, &b)) return 1;
  if (make_stream(env, &sa) || make_stream(env, &sb)) return 1;
  cc_call ca = {.coll = CC_ALLREDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 300007};
  cc_call cb = {.coll = CC_ALLGATHER, .type = ncclFloat16, .count = 100003};
  ca.salt = 10, cb.salt = 11;
  if (cc_prepare(&ca, env) || cc_prepare(&cb, env)) return 1;
  barrier(env, 1);
  double t0 = mp_now();
  if (env->rank == 1) {
    bad += mp_expect_rc(env, b, cc_issue(&cb, b, sb), ncclSuccess, "enqueue on B");
    mp_sleep_ms(LATE_MS);
    bad += mp_expect_rc(env, a, cc_issue(&ca, a, sa), ncclSuccess, "enqueue on A (late)");
  } else {
    bad += mp_expect_rc(env, a, cc_issue(&ca, a, sa), ncclSuccess, "enqueue on A");
    bad += mp_expect_rc(env, b, cc_issue(&cb, b, sb), ncclSuccess, "enqueue on B");
  }
  if (env->rank != 1) {
    ncclResult_t qb, qa = ncclInProgress;
    while ((qb = braidStreamQuery(sb)) == ncclInProgress && mp_now() - t0 < 30) mp_sleep_ms(1);
    double t_b = mp_now() - t0;
    qa = braidStreamQuery(sa);
    bad += mp_expect_rc(env, NULL, qb, ncclSuccess, "stream B once done");
    if (qa != ncclInProgress || t_b > LATE_MS / 1000.0 * 0.8) {
      mp_fail(env,
              "stream B (comm B) finished after %.3f s, stream A (comm A, peer %d ms late) "
              "then reported %d (%s): B must finish while A still waits",
              t_b, LATE_MS, (int)qa, ncclGetErrorString(qa));
      bad++;
    }
    if (env->rank == 0)
      mp_log(env, "independence (B %s): stream B done after %.3f s, A pending",
             split ? "split from A" : "from its own id", t_b);
  }
  bad += sync_ok(env, sa, "braidStreamSynchronize(A)");
  bad += sync_ok(env, sb, "braidStreamSynchronize(B)");
  if (!bad) bad += cc_verify(&ca, env) + cc_verify(&cb, env);
  cc_release(&ca);
  cc_release(&cb);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(sa), ncclSuccess, "braidStreamDestroy(A)");
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(sb), ncclSuccess, "braidStreamDestroy(B)");
  bad += end_comm(env, b, bad);
  return end_comm(env, a, bad);
}

static void test_independence(void** state) {
  (void)state;
  static const int split[2] = {0, 1};
  for (int i = 0; i < 2; i++) assert_int_equal(mp_launch(3, indep_body, (void*)&split[i], NULL), 0);
}

/* Two streams on one comm: calls run whole, in the order they were issued
 * (the same on every rank). */
static int shared_comm_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s[2];
  int bad = 0;
  if (mp_comm_init(env, &comm) || make_stream(env, &s[0]) || make_stream(env, &s[1])) return 1;
  enum { NCALLS = 8 };
  cc_call c[NCALLS];
  for (int i = 0; i < NCALLS; i++) {
    cc_call t = {.coll = i % CC_NCOLLS, .type = (ncclDataType_t)((i * 5) % ncclNumTypes)};
    t.kind = i % (AR_NKINDS - 1);
    t.count = (size_t)(i % 3 == 0 ? 200003 : 1000 + i * 77);
    t.root = i % env->nranks;
    t.salt = 90u + (uint64_t)i;
    c[i] = t;
    if (cc_is_reduction(t.coll)) ar_op_create(env, comm, t.type, t.kind, &c[i].op);
    if (cc_prepare(&c[i], env)) return 1;
  }
  for (int i = 0; i < NCALLS; i++) {
    ncclResult_t rc = cc_issue(&c[i], comm, s[i % 2]);
    if (rc != ncclSuccess) cc_report_rc(&c[i], env, comm, rc), bad++;
  }
  bad += sync_ok(env, s[1], "braidStreamSynchronize(s1)");
  bad += sync_ok(env, s[0], "braidStreamSynchronize(s0)");
  for (int i = 0; i < NCALLS; i++) {
    if (!bad) bad += cc_verify(&c[i], env);
    cc_release(&c[i]);
  }
  for (int i = 0; i < 2; i++)
    bad += mp_expect_rc(env, NULL, braidStreamDestroy(s[i]), ncclSuccess, "braidStreamDestroy");
  return end_comm(env, comm, bad);
}

static void test_two_streams_one_comm(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, shared_comm_body, NULL, NULL), 0);
}

/* A call on a stream, then a blocking (NULL stream) call on the same comm:
 * the blocking one must run after the queued one, as issued. */
static int stream_then_blocking_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  for (int round = 0; round < 4 && !bad; round++) {
    cc_call a = {.coll = CC_ALLREDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 200003};
    cc_call b = {.coll = CC_BROADCAST, .type = ncclInt8, .count = 1077, .root = 0};
    a.salt = 40u + (uint64_t)round, b.salt = 50u + (uint64_t)round;
    if (cc_prepare(&a, env) || cc_prepare(&b, env)) return 1;
    if (round & 1) barrier(env, 10 + round);
    if ((round & 1) && env->rank == 1) mp_sleep_ms(LATE_MS / 4);
    bad += mp_expect_rc(env, comm, cc_issue(&a, comm, s), ncclSuccess, "allreduce on a stream");
    ncclResult_t rc = cc_issue(&b, comm, NULL);
    if (rc != ncclSuccess) cc_report_rc(&b, env, comm, rc), bad++;
    bad += sync_ok(env, s, "braidStreamSynchronize (stream, then blocking call)");
    if (!bad) bad += cc_verify(&a, env) + cc_verify(&b, env);
    cc_release(&a);
    cc_release(&b);
  }
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  return end_comm(env, comm, bad);
}

static void test_stream_then_blocking(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, stream_then_blocking_body, NULL, NULL), 0);
}

/* One group on one stream spanning two comms (B split from A, reversed). */
static int group_two_comms_body(const mp_env* env) {
  ncclComm_t a, b = NULL;
  cudaStream_t s;
  int bad = 0, n = env->nranks;
  if (mp_comm_init(env, &a) || make_stream(env, &s)) return 1;
  bad += mp_expect_rc(env, a, ncclCommSplit(a, 0, n - env->rank, &b, NULL), ncclSuccess,
                      "ncclCommSplit (reversed)");
  if (bad) return 1;
  mp_env eb = *env;
  ncclCommUserRank(b, &eb.rank);
  cc_call ca = {.coll = CC_REDUCESCATTER, .type = ncclFloat32, .kind = AR_SUM, .count = 50001};
  cc_call cb = {.coll = CC_ALLGATHER, .type = ncclUint64, .count = 7777};
  cc_call cc = {.coll = CC_REDUCE, .type = ncclInt64, .kind = AR_MIN, .count = 999, .root = 1};
  ca.salt = 1, cb.salt = 2, cc.salt = 3;
  ar_op_create(&eb, b, cc.type, cc.kind, &cc.op);
  if (cc_prepare(&ca, env) || cc_prepare(&cb, &eb) || cc_prepare(&cc, &eb)) return 1;
  bad += mp_expect_rc(env, NULL, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  ncclResult_t r1 = cc_issue(&cb, b, s), r2 = cc_issue(&ca, a, s), r3 = cc_issue(&cc, b, s);
  if (r1 || r2 || r3) mp_fail(env, "group calls returned %d %d %d", r1, r2, r3), bad++;
  bad += mp_expect_rc(env, NULL, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd (two comms, stream)");
  bad += sync_ok(env, s, "braidStreamSynchronize (group over two comms)");
  if (!bad) bad += cc_verify(&ca, env) + cc_verify(&cb, &eb) + cc_verify(&cc, &eb);
  cc_release(&ca);
  cc_release(&cb);
  cc_release(&cc);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  bad += end_comm(env, b, bad);
  return end_comm(env, a, bad);
}

static void test_group_two_comms(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, group_two_comms_body, NULL, NULL), 0);
}

/* ---- groups on a host stream ---- */

static int group_round(const mp_env* env, ncclComm_t comm, cudaStream_t s, int late, int round) {
  int n = env->nranks, bad = 0, right = (env->rank + 1) % n, left = (env->rank + n - 1) % n;
  enum { PN = 50000 };
  int32_t *snd = malloc(PN * sizeof(int32_t)), *rcv = malloc(PN * sizeof(int32_t));
  int32_t self_in[16], self_out[16];
  cc_call c[2] = {{.coll = CC_ALLREDUCE, .type = ncclBfloat16, .kind = AR_SUM, .count = 70001},
                  {.coll = CC_BROADCAST, .type = ncclUint8, .count = 9999, .root = n - 1}};
  if (!snd || !rcv) return 1;
  for (int i = 0; i < PN; i++) snd[i] = env->rank * 100000 + i + round, rcv[i] = -1;
  for (int i = 0; i < 16; i++) self_in[i] = i * env->rank, self_out[i] = -1;
  for (int i = 0; i < 2; i++) {
    c[i].salt = (uint64_t)(round * 2 + i);
    if (cc_prepare(&c[i], env)) return 1;
  }
  barrier(env, 2 + round);
  if (late && env->rank == 1) mp_sleep_ms(LATE_MS / 2);
  double t0 = mp_now();
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  bad += mp_expect_rc(env, comm, ncclRecv(rcv, PN, ncclInt32, left, comm, s), ncclSuccess, "recv");
  bad += mp_expect_rc(env, comm, cc_issue(&c[0], comm, s), ncclSuccess, "allreduce in group");
  bad += mp_expect_rc(env, comm, ncclSend(snd, PN, ncclInt32, right, comm, s), ncclSuccess, "send");
  bad += mp_expect_rc(env, comm, ncclSend(self_in, 16, ncclInt32, env->rank, comm, s), ncclSuccess,
                      "send to self");
  bad += mp_expect_rc(env, comm, cc_issue(&c[1], comm, s), ncclSuccess, "broadcast in group");
  bad += mp_expect_rc(env, comm, ncclRecv(self_out, 16, ncclInt32, env->rank, comm, s), ncclSuccess,
                      "recv from self");
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd on a stream");
  double t_end = mp_now() - t0;
  if (late && env->rank == 0 && t_end > FAST_S) {
    mp_fail(env,
            "ncclGroupEnd of a group on a host stream took %.3f s (peer %d ms late, round "
            "%d): it must only enqueue",
            t_end, LATE_MS / 2, round);
    bad++;
  }
  bad += sync_ok(env, s, "braidStreamSynchronize (group)");
  for (int i = 0; i < PN && !bad; i++)
    if (rcv[i] != left * 100000 + i + round)
      mp_fail(env, "group on a stream: recv from %d [%d] expected %d got %d", left, i,
              left * 100000 + i + round, rcv[i]),
          bad++;
  for (int i = 0; i < 16 && !bad; i++)
    if (self_out[i] != i * env->rank)
      mp_fail(env, "group on a stream: self recv [%d] expected %d got %d", i, i * env->rank,
              self_out[i]),
          bad++;
  for (int i = 0; i < 2; i++) {
    if (!bad) bad += cc_verify(&c[i], env);
    cc_release(&c[i]);
  }
  free(snd);
  free(rcv);
  return bad;
}

static int group_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  int bad = group_round(env, comm, s, 1, 0); /* first use of the p2p connections */
  if (!bad) bad += group_round(env, comm, s, 1, 1);
  if (!bad) bad += group_round(env, comm, s, 0, 2);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  return end_comm(env, comm, bad);
}

static void test_group_on_stream(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, group_body, NULL, NULL), 0);
}

/* braidStreamDestroy with work pending waits for it. */
static int destroy_pending_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  cc_call c = {.coll = CC_REDUCESCATTER, .type = ncclFloat64, .kind = AR_AVG, .count = 33333};
  ar_op_create(env, comm, c.type, c.kind, &c.op);
  if (cc_prepare(&c, env)) return 1;
  barrier(env, 0);
  if (env->rank == 1) mp_sleep_ms(LATE_MS / 2);
  bad += mp_expect_rc(env, comm, cc_issue(&c, comm, s), ncclSuccess, "reducescatter enqueue");
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess,
                      "braidStreamDestroy with pending work");
  if (!bad) bad += cc_verify(&c, env);
  cc_release(&c);
  return end_comm(env, comm, bad);
}

static void test_destroy_pending(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, destroy_pending_body, NULL, NULL), 0);
}

/* ncclCommDestroy while the comm's work is still queued on a stream: the
 * destroy waits for that work, which completes with correct results. */
static int comm_destroy_pending_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  cc_call c = {.coll = CC_ALLGATHER, .type = ncclInt32, .kind = AR_SUM, .count = 20011};
  if (cc_prepare(&c, env)) return 1;
  if (env->rank == 1) mp_sleep_ms(LATE_MS / 2); /* rank 0's work waits in the queue */
  bad += mp_expect_rc(env, comm, cc_issue(&c, comm, s), ncclSuccess, "allgather enqueue");
  bad += mp_expect_rc(env, NULL, ncclCommDestroy(comm), ncclSuccess,
                      "ncclCommDestroy with work queued on a stream");
  bad += mp_expect_rc(env, NULL, braidStreamSynchronize(s), ncclSuccess, "stream after destroy");
  if (!bad) bad += cc_verify(&c, env);
  cc_release(&c);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  return bad != 0;
}

static void test_comm_destroy_pending(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, comm_destroy_pending_body, NULL, NULL), 0);
}

/* ---- (4) errors: a peer vanishes; the stream's error is sticky ---- */

/* mode 0: the peer leaves between two calls (connections up); mode 1: it
 * leaves before the first call (detected at the latest by BRAID_TIMEOUT_MS). */
static int error_body(const mp_env* env) {
  int mode = *(const int*)env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  int bad = 0;
  float* x = calloc(1 << 20, sizeof(float));
  if (!x) return 1;
  if (mode == 0) {
    bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, 1 << 20, ncclFloat, ncclSum, comm, s),
                        ncclSuccess, "allreduce enqueue");
    bad += sync_ok(env, s, "braidStreamSynchronize (both ranks there)");
  }
  barrier(env, 0);
  if (env->rank == 1) _exit(bad != 0); /* leaves without a word: its sockets close */
  mp_sleep_ms(100);
  bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, 1 << 20, ncclFloat, ncclSum, comm, s),
                      ncclSuccess, "allreduce enqueue (peer gone)");
  double t0 = mp_now();
  ncclResult_t e1 = braidStreamSynchronize(s);
  double dt = mp_now() - t0;
  ncclResult_t e2 = braidStreamQuery(s), e3 = braidStreamSynchronize(s), async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  mp_log(env, "peer gone (%s): synchronize returned %d (%s) after %.2f s: \"%s\"",
         mode ? "before the first call" : "between calls", (int)e1, ncclGetErrorString(e1), dt,
         ncclGetLastError(comm));
  if (e1 == ncclSuccess || e1 == ncclInProgress) {
    mp_fail(env, "braidStreamSynchronize returned %d although a peer left", (int)e1);
    bad++;
  }
  if (e2 != e1 || e3 != e1)
    mp_fail(env, "stream error not sticky: sync %d, then query %d, sync %d", (int)e1, (int)e2,
            (int)e3),
        bad++;
  if (async == ncclSuccess || async == ncclInProgress)
    mp_fail(env, "ncclCommGetAsyncError reports %d after the stream's failure", (int)async), bad++;
  /* later work on the failed stream is not run: the error stays */
  ncclResult_t e4 = ncclAllReduce(x, x, 16, ncclFloat, ncclSum, comm, s);
  if (e4 == ncclSuccess) e4 = braidStreamSynchronize(s);
  if (e4 == ncclSuccess)
    mp_fail(env, "work enqueued on the failed stream/comm synchronized with ncclSuccess"), bad++;
  free(x);
  ncclResult_t d = braidStreamDestroy(s);
  if (d != ncclSuccess && d != e1)
    mp_fail(env, "braidStreamDestroy of the failed stream returned %d", (int)d), bad++;
  bad += mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort");
  return bad != 0;
}

static void test_error_sticky(void** state) {
  (void)state;
  /* mode 1 waits for BRAID_TIMEOUT_MS; test_fault covers that path */
  static const int mode = 0;
  assert_int_equal(mp_launch(2, error_body, (void*)&mode, NULL), 0);
}

/* ncclCommAbort from the caller wakes a stream blocked on that comm (a peer
 * that never calls): synchronize then fails promptly. */
static int abort_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  int bad = 0;
  barrier(env, 0);
  if (env->rank == 1) { /* never joins; leaves once rank 0 is done */
    mp_wait_flag(&env->shm[1], 20000);
    ncclCommAbort(comm);
    return 0;
  }
  static float x[1 << 16];
  bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, 1 << 16, ncclFloat, ncclSum, comm, s),
                      ncclSuccess, "allreduce enqueue");
  mp_sleep_ms(300);
  ncclResult_t q = braidStreamQuery(s);
  if (q != ncclInProgress)
    mp_fail(env, "query before abort: %d, expected ncclInProgress", q), bad++;
  double t0 = mp_now();
  bad +=
      mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort (stream blocked)");
  ncclResult_t e = braidStreamSynchronize(s);
  double dt = mp_now() - t0;
  mp_log(env, "abort: synchronize returned %d (%s) %.2f s after ncclCommAbort", (int)e,
         ncclGetErrorString(e), dt);
  if (e == ncclSuccess || e == ncclInProgress)
    mp_fail(env, "braidStreamSynchronize returned %d after its comm was aborted", (int)e), bad++;
  if (dt > 2.5) mp_fail(env, "the blocked stream took %.2f s to notice the abort", dt), bad++;
  ncclResult_t d = braidStreamDestroy(s);
  if (d != ncclSuccess && d != e) mp_fail(env, "braidStreamDestroy returned %d", (int)d), bad++;
  __atomic_store_n((int*)&env->shm[1], 1, __ATOMIC_SEQ_CST);
  return bad != 0;
}

static void test_abort_wakes_stream(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, abort_body, NULL, NULL), 0);
}

/* ---- bad input ---- */

static int expect_arg_error(const mp_env* env, ncclComm_t comm, ncclResult_t rc, const char* what) {
  if (rc != ncclInvalidArgument && rc != ncclInvalidUsage) {
    mp_fail(env, "%s returned %d (%s), expected ncclInvalidArgument or ncclInvalidUsage", what,
            (int)rc, ncclGetErrorString(rc));
    return 1;
  }
  return mp_expect_last_error(env, comm, what);
}

static int bad_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s, s2;
  int bad = 0, n = env->nranks;
  double not_a_stream[4];
  bad += expect_arg_error(env, NULL, braidStreamCreate(NULL), "braidStreamCreate(NULL)");
  bad += expect_arg_error(env, NULL, braidStreamQuery((cudaStream_t)not_a_stream),
                          "braidStreamQuery(not a stream)");
  bad += expect_arg_error(env, NULL, braidStreamSynchronize((cudaStream_t)not_a_stream),
                          "braidStreamSynchronize(not a stream)");
  bad += expect_arg_error(env, NULL, braidStreamDestroy((cudaStream_t)not_a_stream),
                          "braidStreamDestroy(not a stream)");
  if (mp_comm_init(env, &comm) || make_stream(env, &s) || make_stream(env, &s2)) return 1;
  float buf[64] = {0};
  /* rejected at enqueue; the stream stays healthy */
  bad += expect_arg_error(env, comm, ncclAllReduce(NULL, buf, 8, ncclFloat, ncclSum, comm, s),
                          "ncclAllReduce(sendbuff=NULL) on a stream");
  bad += expect_arg_error(env, comm, ncclBroadcast(buf, buf, 8, ncclFloat, n, comm, s),
                          "ncclBroadcast(root=nranks) on a stream");
  bad += expect_arg_error(env, comm, ncclSend(buf, 8, ncclFloat, -1, comm, s),
                          "ncclSend(peer=-1) on a stream");
  bad += expect_arg_error(env, NULL, ncclReduce(buf, buf, 8, ncclFloat, ncclSum, 0, NULL, s),
                          "ncclReduce(comm=NULL) on a stream");
  bad += mp_expect_rc(env, NULL, braidStreamQuery(s), ncclSuccess,
                      "braidStreamQuery after rejected calls");
  /* one group naming two streams: the calls and/or ncclGroupEnd say so */
  ncclGroupStart();
  ncclResult_t r1 = ncclAllReduce(buf, buf + 8, 8, ncclFloat, ncclSum, comm, s);
  ncclResult_t r2 = ncclAllReduce(buf, buf + 16, 8, ncclFloat, ncclSum, comm, s2);
  ncclResult_t r3 = ncclGroupEnd();
  int r2ok = r2 == ncclSuccess || r2 == ncclInvalidArgument || r2 == ncclInvalidUsage;
  int r3ok = r3 == ncclSuccess || r3 == ncclInvalidArgument || r3 == ncclInvalidUsage;
  if (r1 != ncclSuccess && r1 != ncclInvalidArgument && r1 != ncclInvalidUsage) r2ok = 0;
  if (!r2ok || !r3ok || (r2 == ncclSuccess && r3 == ncclSuccess)) {
    mp_fail(env,
            "a group naming two streams: calls %d, %d, ncclGroupEnd %d; expected an argument "
            "error",
            (int)r1, (int)r2, (int)r3);
    bad++;
  }
  braidStreamSynchronize(s);
  braidStreamSynchronize(s2);
  /* both streams and the comm still work */
  cc_call c = {.coll = CC_ALLREDUCE, .type = ncclInt32, .kind = AR_SUM, .count = 4099, .salt = 5};
  cc_call g = {.coll = CC_ALLGATHER, .type = ncclInt8, .count = 333, .salt = 6};
  if (cc_prepare(&c, env) || cc_prepare(&g, env)) return 1;
  bad += mp_expect_rc(env, comm, cc_issue(&c, comm, s), ncclSuccess, "allreduce on s after errors");
  bad += sync_ok(env, s, "braidStreamSynchronize(s) after rejected calls");
  bad += mp_expect_rc(env, comm, cc_issue(&g, comm, s2), ncclSuccess, "allgather on s2");
  bad += sync_ok(env, s2, "braidStreamSynchronize(s2) after rejected calls");
  if (!bad) bad += cc_verify(&c, env) + cc_verify(&g, env);
  cc_release(&c);
  cc_release(&g);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s2), ncclSuccess, "braidStreamDestroy");
  if (env->rank == 0 || bad) mp_log(env, "stream bad input: %d failed", bad);
  return end_comm(env, comm, bad);
}

static void test_bad_input(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, bad_body, NULL, NULL), 0);
}

/* ---- (5) host functions: each call's completion, in order, with the outcome ---- */

#define HF_CALLS 5
#define HF_COUNT 65537

struct hf_seen {
  int calls;               /* host functions run so far */
  int order[HF_CALLS + 1]; /* the tag of each, in the order they ran */
  ncclResult_t status[HF_CALLS + 1];
  double value[HF_CALLS + 1]; /* x[HF_COUNT - 1] when it ran */
  const double* x;
};
struct hf_arg {
  struct hf_seen* seen;
  int tag;
};

static void hf_record(void* p, ncclResult_t status) {
  struct hf_arg* a = p;
  struct hf_seen* s = a->seen;
  int i = s->calls++;
  s->order[i] = a->tag;
  s->status[i] = status;
  s->value[i] = s->x[HF_COUNT - 1];
}

/* x <- allreduce(x) HF_CALLS times, a host function after each: the k-th sees
 * the k-th result (not a later one), all in order, all with ncclSuccess. */
static int host_fn_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0, n = env->nranks;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  double* x = malloc(HF_COUNT * sizeof(double));
  if (!x) return 1;
  for (int i = 0; i < HF_COUNT; i++) x[i] = 1.0;
  struct hf_seen seen = {.x = x};
  struct hf_arg args[HF_CALLS];
  if (env->rank == 1) mp_sleep_ms(200); /* the calls are still queued when rank 0 returns */
  for (int k = 0; k < HF_CALLS; k++) {
    args[k] = (struct hf_arg){&seen, k};
    bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, HF_COUNT, ncclFloat64, ncclSum, comm, s),
                        ncclSuccess, "allreduce enqueue");
    bad += mp_expect_rc(env, NULL, braidStreamLaunchHostFunc(s, hf_record, &args[k]), ncclSuccess,
                        "braidStreamLaunchHostFunc");
  }
  bad += sync_ok(env, s, "braidStreamSynchronize (host functions)");
  if (seen.calls != HF_CALLS)
    mp_fail(env, "%d host functions ran, expected %d", seen.calls, HF_CALLS), bad++;
  double want = 1.0;
  for (int k = 0; k < seen.calls && k < HF_CALLS; k++) {
    want *= n;
    if (seen.order[k] != k || seen.status[k] != ncclSuccess || seen.value[k] != want) {
      mp_fail(env, "host function %d: ran as #%d with status %d seeing %g, expected #%d, 0, %g",
              seen.order[k], k, (int)seen.status[k], seen.value[k], k, want);
      bad++;
    }
  }
  /* bad input leaves the stream healthy */
  bad += expect_arg_error(env, NULL, braidStreamLaunchHostFunc(s, NULL, NULL),
                          "braidStreamLaunchHostFunc(fn=NULL)");
  double not_a_stream[4];
  bad += expect_arg_error(env, NULL,
                          braidStreamLaunchHostFunc((cudaStream_t)not_a_stream, hf_record, NULL),
                          "braidStreamLaunchHostFunc(not a stream)");
  bad += mp_expect_rc(env, NULL, braidStreamQuery(s), ncclSuccess, "braidStreamQuery after them");
  free(x);
  bad += mp_expect_rc(env, NULL, braidStreamDestroy(s), ncclSuccess, "braidStreamDestroy");
  return end_comm(env, comm, bad);
}

/* A call fails (its peer left): the host function after it still runs and is
 * told the error; so is one enqueued after the failure. */
static int host_fn_error_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  if (mp_comm_init(env, &comm) || make_stream(env, &s)) return 1;
  int bad = 0;
  double* x = calloc(HF_COUNT, sizeof(double));
  if (!x) return 1;
  bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, HF_COUNT, ncclFloat64, ncclSum, comm, s),
                      ncclSuccess, "allreduce enqueue");
  bad += sync_ok(env, s, "braidStreamSynchronize (both ranks there)");
  barrier(env, 0);
  if (env->rank == 1) _exit(bad != 0);
  struct hf_seen seen = {.x = x};
  struct hf_arg a0 = {&seen, 0}, a1 = {&seen, 1};
  bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, HF_COUNT, ncclFloat64, ncclSum, comm, s),
                      ncclSuccess, "allreduce enqueue (peer gone)");
  bad += mp_expect_rc(env, NULL, braidStreamLaunchHostFunc(s, hf_record, &a0), ncclSuccess,
                      "braidStreamLaunchHostFunc after the failing call");
  ncclResult_t e = braidStreamSynchronize(s);
  bad += mp_expect_rc(env, NULL, braidStreamLaunchHostFunc(s, hf_record, &a1), ncclSuccess,
                      "braidStreamLaunchHostFunc on the failed stream");
  braidStreamSynchronize(s);
  if (e == ncclSuccess) mp_fail(env, "synchronize succeeded although the peer left"), bad++;
  if (seen.calls != 2 || seen.status[0] != e || seen.status[1] != e)
    mp_fail(env, "%d host functions ran (statuses %d, %d), expected 2 told the error %d",
            seen.calls, (int)seen.status[0], (int)seen.status[1], (int)e),
        bad++;
  free(x);
  braidStreamDestroy(s);
  ncclCommAbort(comm);
  return bad != 0;
}

static void test_host_func(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, host_fn_body, NULL, NULL), 0);
  assert_int_equal(mp_launch(2, host_fn_error_body, NULL, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "8000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_ordering),
      cmocka_unit_test(test_overlap),
      cmocka_unit_test(test_independence),
      cmocka_unit_test(test_two_streams_one_comm),
      cmocka_unit_test(test_group_on_stream),
      cmocka_unit_test(test_destroy_pending),
      cmocka_unit_test(test_comm_destroy_pending),
      cmocka_unit_test(test_error_sticky),
      cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_stream_then_blocking),
      cmocka_unit_test(test_group_two_comms),
      cmocka_unit_test(test_abort_wakes_stream),
      cmocka_unit_test(test_host_func),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
