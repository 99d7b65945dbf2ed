/* Calls that do not match across ranks, over shared memory and over TCP: a
 * send and a receive of different sizes ("Message truncated"), and
 * collectives that differ in count, type, op, root, collective or chunk
 * size. Every rank gets an error (at the call, or at the next one for a
 * rank whose part ended before a peer noticed), no rank gets another
 * call's bytes, and a new communicator then works. */
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

#define NFLOATS 4096

/* A fresh communicator of the same ranks (id slot `slot`), a correct
 * all-reduce on it, destroyed: the job recovers by making a new comm. */
static int fresh_comm_works(const mp_env* env, int slot) {
  mp_env e = *env;
  ncclComm_t comm = NULL;
  if (cc_share_id(env, 0, slot, &e.id) != 0 || mp_comm_init(&e, &comm) != 0) return 1;
  cc_call c = {.coll = CC_ALLREDUCE,
               .type = ncclFloat32,
               .kind = AR_SUM,
               .op = ncclSum,
               .count = 1027,
               .salt = 99};
  int bad = cc_run(&c, &e, comm) != 0;
  bad += mp_expect_rc(&e, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy (new comm)");
  return bad;
}

/* ---- a send and its receive of different sizes ---- */

typedef struct p2p_case {
  int shm_off;
  size_t send_count, recv_count;
} p2p_case;

static int p2p_mismatch_body(const mp_env* env) {
  const p2p_case* k = env->arg;
  float* buf = calloc(2 * NFLOATS, sizeof(float));
  ncclComm_t comm = NULL;
  int bad = 0;
  if (k->shm_off) setenv("NCCL_SHM_DISABLE", "1", 1);
  if (buf == NULL || mp_comm_init(env, &comm) != 0) return 1;
  for (int i = 0; i < 2 * NFLOATS; i++) buf[i] = (float)i;
  ncclResult_t first = env->rank == 0 ? ncclSend(buf, k->send_count, ncclFloat, 1, comm, NULL)
                                      : ncclRecv(buf, k->recv_count, ncclFloat, 0, comm, NULL);
  if (env->rank == 1) {
    bad += mp_expect_rc(env, comm, first, ncclInvalidUsage, "ncclRecv of another size");
    if (strstr(ncclGetLastError(comm), "truncated") == NULL) {
      mp_fail(env, "the error does not say what happened: \"%s\"", ncclGetLastError(comm));
      bad++;
    }
    __atomic_store_n(&env->shm[0], 1, __ATOMIC_SEQ_CST);
  } else if (!mp_wait_flag(&env->shm[0], 20000)) {
    mp_fail(env, "rank 1 never finished its receive");
    bad++;
  }
  /* A correct pair next: never served the leftover bytes. Rank 0's send
   * completed once its bytes were in the transport, before rank 1 noticed:
   * rank 0 hears of it now. */
  memset(buf, 0, NFLOATS * sizeof(float));
  ncclResult_t second = env->rank == 0 ? ncclSend(buf + NFLOATS, 16, ncclFloat, 1, comm, NULL)
                                       : ncclRecv(buf, 16, ncclFloat, 0, comm, NULL);
  if (first == ncclSuccess && second == ncclSuccess) {
    mp_fail(env, "neither the mismatched nor the next call failed");
    bad++;
  }
  ncclCommAbort(comm);
  free(buf);
  return bad + fresh_comm_works(env, 0);
}

static void test_p2p_size_mismatch(void** state) {
  (void)state;
  for (int shm_off = 0; shm_off < 2; shm_off++) {
    p2p_case fewer = {shm_off, NFLOATS, NFLOATS / 2}, more = {shm_off, 100, 200};
    assert_int_equal(mp_launch(2, p2p_mismatch_body, &fewer, NULL), 0);
    assert_int_equal(mp_launch(2, p2p_mismatch_body, &more, NULL), 0);
  }
}

/* ---- collectives that differ on the last rank ---- */

typedef struct coll_case {
  const char* what;
  cc_call common, odd; /* the last rank calls `odd`, the others `common` */
  const char* odd_env; /* set on the last rank only, NULL: none */
  int shm_off;
} coll_case;

static int coll_mismatch_body(const mp_env* env) {
  const coll_case* k = env->arg;
  int odd = env->rank == env->nranks - 1;
  cc_call c = odd ? k->odd : k->common;
  ncclComm_t comm = NULL;
  if (k->shm_off) setenv("NCCL_SHM_DISABLE", "1", 1);
  if (odd && k->odd_env) putenv((char*)k->odd_env);
  if (mp_comm_init(env, &comm) != 0 || cc_prepare(&c, env) != 0) return 1;
  ncclResult_t first = cc_issue(&c, comm, NULL);
  cc_release(&c);
  cc_call next = {.coll = CC_ALLREDUCE,
                  .type = ncclInt32,
                  .kind = AR_SUM,
                  .op = ncclSum,
                  .count = 64,
                  .salt = 7};
  int r = first == ncclSuccess ? cc_run(&next, env, comm) : -1;
  int bad = 0;
  if (first == ncclSuccess && r >= 0) {
    mp_fail(env, "%s: neither the mismatched call nor the next one failed", k->what);
    bad++;
  } else if (mp_verbose()) {
    mp_log(env, "%s: %s call failed: %s", k->what, first != ncclSuccess ? "the" : "the next",
           ncclGetLastError(comm));
  }
  ncclCommAbort(comm);
  /* a knob stays set in this process: a new comm would differ again */
  return bad + (k->odd_env ? 0 : fresh_comm_works(env, 1));
}

#define AR(n, t, o) \
  { .coll = CC_ALLREDUCE, .type = t, .kind = AR_SUM, .op = o, .count = n, .salt = 1 }
static const coll_case kColl[] = {
    {"count", AR(1024, ncclFloat32, ncclSum), AR(2048, ncclFloat32, ncclSum), NULL, 0},
    {"type", AR(1024, ncclFloat32, ncclSum), AR(1024, ncclInt32, ncclSum), NULL, 0},
    {"op (sum/max)", AR(1024, ncclFloat32, ncclSum), AR(1024, ncclFloat32, ncclMax), NULL, 0},
    {"root",
     {.coll = CC_BROADCAST, .type = ncclFloat32, .count = 5000, .root = 0, .salt = 2},
     {.coll = CC_BROADCAST, .type = ncclFloat32, .count = 5000, .root = 1, .salt = 2},
     NULL,
     0},
    {"collective",
     AR(3000, ncclFloat32, ncclSum),
     {.coll = CC_ALLGATHER, .type = ncclFloat32, .count = 1000, .salt = 3},
     NULL,
     0},
    {"BRAID_CHUNK_SIZE", AR(1 << 20, ncclFloat32, ncclSum), AR(1 << 20, ncclFloat32, ncclSum),
     "BRAID_CHUNK_SIZE=128K", 0},
    /* one rank in the deterministic mode: its call runs another algorithm */
    {"BRAID_DETERMINISTIC", AR(1 << 20, ncclFloat32, ncclSum), AR(1 << 20, ncclFloat32, ncclSum),
     "BRAID_DETERMINISTIC=1", 0},
};
#define NCOLL (sizeof(kColl) / sizeof(kColl[0]))

static void test_collective_mismatch(void** state) {
  (void)state;
  for (int shm_off = 0; shm_off < 2; shm_off++)
    for (size_t i = 0; i < NCOLL; i++) {
      coll_case k = kColl[i];
      k.shm_off = shm_off;
      fprintf(stderr, "mismatch: %s over %s\n", k.what, shm_off ? "TCP" : "shared memory");
      assert_int_equal(mp_launch(3, coll_mismatch_body, &k, NULL), 0);
    }
}

int main(void) {
  /* calls whose algorithms talk to other peers wait in connection setup
   * until this timeout: that is how they fail */
  mp_default_env("BRAID_TIMEOUT_MS", "5000");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_p2p_size_mismatch),
      cmocka_unit_test(test_collective_mismatch),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
