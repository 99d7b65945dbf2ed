/* braidTaggedSend and braidTaggedRecv (src/p2p_lane.c): transfers that run
 * on their own whatever order the ranks post them in, matched by (peer,
 * tag) in posting order, over shared memory and over TCP:
 *  - every rank posts its receives from every peer, then its sends (rank
 *    order, and reversed): an ordered send/recv would deadlock;
 *  - every rank posts its sends first, each larger than a ring;
 *  - tags received in another order than sent, many tags to one peer;
 *  - a send to self; a size mismatch fails both sides; a tagged receive
 *    waits while the comm runs collectives; receives from any source;
 *  - bad arguments; a peer killed, an abort and a destroy with transfers
 *    pending: each fails its callback, nothing hangs. */
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "braid.h"
#include "launcher.h"

#define DEADLINE_S 120
#define WAIT_S 60.0
#define MAX_REQS 256
#define BIG_BYTES ((size_t)9 << 20) /* more than a shared-memory ring (4 MiB) */

/* The outcome of each posted transfer, set by its callback. */
struct reqs {
  _Atomic int done;
  int n;
  ncclResult_t status[MAX_REQS];
};

struct slot {
  struct reqs* set;
  int i;
};

static struct slot g_slots[MAX_REQS];

static void on_done(void* arg, ncclResult_t status) {
  struct slot* s = arg;
  s->set->status[s->i] = status;
  atomic_fetch_add(&s->set->done, 1);
}

/* Post a send (1) or receive (0) of `bytes` with peer and tag; 0 when the
 * call itself succeeded. */
static int post(const mp_env* env, ncclComm_t comm, struct reqs* set, int send, void* buf,
                size_t bytes, int peer, int tag) {
  int i = set->n++;
  g_slots[i] = (struct slot){set, i};
  set->status[i] = ncclInternalError;
  ncclResult_t rc =
      send ? braidTaggedSend(buf, bytes, ncclUint8, peer, tag, comm, on_done, &g_slots[i])
           : braidTaggedRecv(buf, bytes, ncclUint8, peer, tag, comm, on_done, &g_slots[i]);
  return mp_expect_rc(env, comm, rc, ncclSuccess, send ? "braidTaggedSend" : "braidTaggedRecv");
}

/* Wait for every posted transfer; each must end with `want`. */
static int wait_all(const mp_env* env, struct reqs* set, ncclResult_t want, const char* what) {
  double end = mp_now() + WAIT_S;
  while (atomic_load(&set->done) < set->n)
    if (mp_now() > end) {
      mp_fail(env, "%s: %d of %d transfers done after %.0f s", what, atomic_load(&set->done),
              set->n, WAIT_S);
      return 1;
    } else {
      usleep(200);
    }
  int bad = 0;
  for (int i = 0; i < set->n; i++)
    if (set->status[i] != want) {
      mp_fail(env, "%s: transfer %d ended %d (%s), expected %d", what, i, (int)set->status[i],
              ncclGetErrorString(set->status[i]), (int)want);
      bad++;
    }
  return bad;
}

static unsigned char byte_of(int from, int to, int tag, size_t i) {
  return (unsigned char)(from * 31 + to * 7 + tag * 13 + i * 5 + (i >> 10));
}

static void fill(unsigned char* b, size_t n, int from, int to, int tag) {
  for (size_t i = 0; i < n; i++) b[i] = byte_of(from, to, tag, i);
}

static int check(const mp_env* env, const unsigned char* b, size_t n, int from, int to, int tag) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != byte_of(from, to, tag, i)) {
      mp_fail(env, "message %d -> %d tag %d: byte %zu is %u, expected %u", from, to, tag, i, b[i],
              byte_of(from, to, tag, i));
      return 1;
    }
  return 0;
}

/* ---- every peer, in orders an ordered send/recv could not serve ---- */

enum order { RECVS_FIRST, RECVS_FIRST_REVERSED, SENDS_FIRST_BIG };

struct order_case {
  enum order order;
  int no_shm;
};

static int order_body(const mp_env* env) {
  const struct order_case* k = env->arg;
  ncclComm_t comm;
  struct reqs set = {0};
  int n = env->nranks, me = env->rank, bad = 0;
  size_t bytes = k->order == SENDS_FIRST_BIG ? BIG_BYTES : 3000 + (size_t)me;
  if (k->no_shm) setenv("NCCL_SHM_DISABLE", "1", 1);
  if (mp_comm_init(env, &comm) != 0) return 1;
  unsigned char** in = calloc((size_t)n, sizeof(*in));
  unsigned char** out = calloc((size_t)n, sizeof(*out));
  for (int j = 0; j < n; j++) {
    size_t their = k->order == SENDS_FIRST_BIG ? BIG_BYTES : 3000 + (size_t)j;
    in[j] = malloc(their);
    out[j] = malloc(bytes);
    fill(out[j], bytes, me, j, 5);
  }
  for (int pass = 0; pass < 2; pass++) {
    int sending = k->order == SENDS_FIRST_BIG ? pass == 0 : pass == 1;
    for (int step = 0; step < n; step++) {
      int j = k->order == RECVS_FIRST_REVERSED ? n - 1 - step : step;
      size_t their = k->order == SENDS_FIRST_BIG ? BIG_BYTES : 3000 + (size_t)j;
      bad += sending ? post(env, comm, &set, 1, out[j], bytes, j, 5)
                     : post(env, comm, &set, 0, in[j], their, j, 5);
    }
  }
  bad += wait_all(env, &set, ncclSuccess, "every peer");
  for (int j = 0; j < n && !bad; j++)
    bad += check(env, in[j], k->order == SENDS_FIRST_BIG ? BIG_BYTES : 3000 + (size_t)j, j, me, 5);
  for (int j = 0; j < n; j++) free(in[j]), free(out[j]);
  free(in);
  free(out);
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_orders(void** state) {
  (void)state;
  static const struct order_case cases[] = {{RECVS_FIRST, 0},          {RECVS_FIRST_REVERSED, 0},
                                            {SENDS_FIRST_BIG, 0},      {RECVS_FIRST, 1},
                                            {RECVS_FIRST_REVERSED, 1}, {SENDS_FIRST_BIG, 1}};
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = DEADLINE_S;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    if (mp_launch(4, order_body, (void*)&cases[i], &o) != 0)
      fail_msg("order %d over %s", (int)cases[i].order, cases[i].no_shm ? "TCP" : "shm");
}

/* ---- tags ---- */

#define NTAGS 16

/* Rank 0 sends NTAGS messages to rank 1, tags 0.. in order, each of its
 * own size; rank 1 receives them in reverse tag order, then two more with
 * one tag (they match in posting order). A send to self on the way. */
static int tags_body(const mp_env* env) {
  ncclComm_t comm;
  struct reqs set = {0};
  static unsigned char buf[NTAGS + 2][4096 + NTAGS];
  unsigned char self_out[100], self_in[100];
  int bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  fill(self_out, sizeof(self_out), env->rank, env->rank, 99);
  bad += post(env, comm, &set, 0, self_in, sizeof(self_in), env->rank, 99);
  for (int k = 0; k < NTAGS + 2; k++) {
    int tag = k < NTAGS ? k : 1000; /* the last two share a tag */
    int t = env->rank == 0 ? tag : (k < NTAGS ? NTAGS - 1 - k : tag);
    size_t bytes = k < NTAGS ? 4096 + (size_t)t : 77;
    if (env->rank == 0) fill(buf[k], bytes, 0, 1, t + (k == NTAGS + 1));
    bad += post(env, comm, &set, env->rank == 0, buf[k], bytes, 1 - env->rank, t);
  }
  bad += post(env, comm, &set, 1, self_out, sizeof(self_out), env->rank, 99);
  bad += wait_all(env, &set, ncclSuccess, "tags");
  bad += check(env, self_in, sizeof(self_in), env->rank, env->rank, 99);
  for (int k = 0; env->rank == 1 && k < NTAGS + 2 && !bad; k++) {
    int t = k < NTAGS ? NTAGS - 1 - k : 1000;
    bad += check(env, buf[k], k < NTAGS ? 4096 + (size_t)t : 77, 0, 1, t + (k == NTAGS + 1));
  }
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_tags(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, tags_body, NULL, NULL), 0);
}

/* ---- a mismatch, and independence from the comm's ordered calls ---- */

static int mismatch_body(const mp_env* env) {
  ncclComm_t comm;
  struct reqs set = {0}, later = {0};
  unsigned char a[64], b[64];
  int bad = 0, other = 1 - env->rank;
  if (mp_comm_init(env, &comm) != 0) return 1;
  /* 64 sent where 32 is received: both fail */
  bad += post(env, comm, &set, env->rank == 0, a, env->rank == 0 ? 64 : 32, other, 3);
  bad += wait_all(env, &set, ncclInvalidUsage, "a size mismatch");
  /* rank 1's receive waits while both all-reduce; then rank 0 sends */
  if (env->rank == 1) bad += post(env, comm, &later, 0, b, sizeof(b), other, 4);
  bad += mp_sum_ranks_exact(env, comm, 3.0f);
  if (env->rank == 0) {
    fill(b, sizeof(b), 0, 1, 4);
    bad += post(env, comm, &later, 1, b, sizeof(b), other, 4);
  }
  bad += wait_all(env, &later, ncclSuccess, "a receive across an all-reduce");
  if (env->rank == 1) bad += check(env, b, sizeof(b), 0, 1, 4);
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_mismatch_and_collectives(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, mismatch_body, NULL, NULL), 0);
}

/* ---- a receive from any source ---- */

/* Rank 0 posts three receives from any source with tag 9 (a fourth with
 * tag 8, from itself); ranks 1 and 2 send one each, rank 0 one to itself:
 * each message lands in one receive, which says where it came from. */
static int any_body(const mp_env* env) {
  ncclComm_t comm;
  struct reqs set = {0};
  unsigned char in[3][256], out[256], self_in[8], self_out[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int src[3] = {-1, -1, -1}, self_src = -1, bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (env->rank == 0) {
    for (int k = 0; k < 3; k++) {
      int i = set.n++;
      g_slots[i] = (struct slot){&set, i};
      bad += mp_expect_rc(
          env, comm,
          braidTaggedRecvAny(in[k], 256, ncclUint8, 9, comm, &src[k], on_done, &g_slots[i]),
          ncclSuccess, "braidTaggedRecvAny");
    }
    int i = set.n++;
    g_slots[i] = (struct slot){&set, i};
    bad += mp_expect_rc(
        env, comm,
        braidTaggedRecvAny(self_in, 8, ncclUint8, 8, comm, &self_src, on_done, &g_slots[i]),
        ncclSuccess, "braidTaggedRecvAny (self)");
    fill(out, 256, 0, 0, 9);
    bad += post(env, comm, &set, 1, out, 256, 0, 9);
    bad += post(env, comm, &set, 1, self_out, 8, 0, 8);
  } else {
    fill(out, 256, env->rank, 0, 9);
    bad += post(env, comm, &set, 1, out, 256, 0, 9);
  }
  bad += wait_all(env, &set, ncclSuccess, "receives from any source");
  if (env->rank == 0 && !bad) {
    int seen[3] = {0, 0, 0};
    for (int k = 0; k < 3; k++) {
      if (src[k] < 0 || src[k] > 2 || seen[src[k]]++) {
        mp_fail(env, "receive %d says it came from rank %d", k, src[k]);
        bad++;
        continue;
      }
      bad += check(env, in[k], 256, src[k], 0, 9);
    }
    if (self_src != 0 || memcmp(self_in, self_out, 8) != 0) {
      mp_fail(env, "the receive from any source of tag 8 got rank %d's message", self_src);
      bad++;
    }
  }
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_any_source(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, any_body, NULL, NULL), 0);
}

/* ---- bad arguments ---- */

static int args_body(const mp_env* env) {
  ncclComm_t comm;
  char b[8];
  int bad = 0;
  if (mp_comm_init(env, &comm) != 0) return 1;
  bad += mp_expect_rc(env, comm, braidTaggedSend(b, 8, ncclUint8, 2, 0, comm, on_done, NULL),
                      ncclInvalidArgument, "peer out of range");
  bad += mp_expect_rc(env, comm, braidTaggedRecv(b, 8, ncclUint8, 0, 0, comm, NULL, NULL),
                      ncclInvalidArgument, "no callback");
  bad += mp_expect_rc(env, comm, braidTaggedRecv(NULL, 8, ncclUint8, 0, 0, comm, on_done, NULL),
                      ncclInvalidArgument, "NULL buffer");
  bad += mp_expect_rc(env, NULL, braidTaggedSend(b, 8, ncclUint8, 0, 0, NULL, on_done, NULL),
                      ncclInvalidArgument, "NULL comm");
  bad +=
      mp_expect_rc(env, comm, braidTaggedSend(b, 8, (ncclDataType_t)99, 0, 0, comm, on_done, NULL),
                   ncclInvalidArgument, "bad type");
  return bad + mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
}

static void test_bad_arguments(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, args_body, NULL, NULL), 0);
}

/* ---- a peer killed, an abort, a destroy, with transfers pending ---- */

enum ending { PEER_KILLED, ABORTED, DESTROYED };

static int ending_body(const mp_env* env) {
  enum ending how = *(const enum ending*)env->arg;
  ncclComm_t comm;
  struct reqs set = {0};
  static unsigned char big[BIG_BYTES];
  char small[16];
  if (mp_comm_init(env, &comm) != 0) return 1;
  if (env->rank == 1) {
    if (how == PEER_KILLED) {
      /* connected (a receive nobody sends), then killed with rank 0's waiting */
      post(env, comm, &set, 0, small, sizeof(small), 0, 7);
      mp_sleep_ms(300);
      mp_notify_parent();
      mp_sleep_ms(30000);
      return 1;
    }
    mp_wait_flag(&env->shm[0], DEADLINE_S * 1000); /* alive until rank 0 ended its comm */
    return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  }
  int bad = post(env, comm, &set, 1, big, sizeof(big), 1, 1);
  bad += post(env, comm, &set, 0, small, sizeof(small), 1, 2); /* never sent */
  mp_sleep_ms(200);
  if (how == PEER_KILLED) {
    ncclResult_t want = ncclRemoteError;
    bad += wait_all(env, &set, want, "transfers with a killed peer");
    return bad + mp_expect_rc(env, NULL, ncclCommAbort(comm), ncclSuccess, "ncclCommAbort");
  }
  ncclResult_t rc = how == ABORTED ? ncclCommAbort(comm) : ncclCommDestroy(comm);
  bad += mp_expect_rc(env, NULL, rc, ncclSuccess, how == ABORTED ? "abort" : "destroy");
  bad += wait_all(env, &set, ncclSystemError, "transfers pending at the end");
  env->shm[0] = 1;
  return bad;
}

static void test_endings(void** state) {
  (void)state;
  static const enum ending hows[] = {PEER_KILLED, ABORTED, DESTROYED};
  for (size_t i = 0; i < 3; i++) {
    mp_opts o = MP_OPTS_INIT;
    o.deadline_s = DEADLINE_S;
    o.victim = hows[i] == PEER_KILLED ? 1 : -1;
    o.kill_on_notify = hows[i] == PEER_KILLED;
    if (mp_launch(2, ending_body, (void*)&hows[i], &o) != 0) fail_msg("ending %d", (int)hows[i]);
  }
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_orders),
      cmocka_unit_test(test_tags),
      cmocka_unit_test(test_mismatch_and_collectives),
      cmocka_unit_test(test_any_source),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_endings),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
