/* Knobs set to values that cannot be right (0 or negative chunks, 1-byte
 * socket buffers and slots, too many sockets, no steps) are clamped with a
 * WARN, and every collective and send/recv stays exact; calls larger than
 * one piece of the executor (EXEC_PIECE_CHUNKS chunks) are exact under
 * every algorithm. */
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

#define MAX_VARS 4
#define P2P_BYTES ((size_t)3 << 20)
/* With 4 KiB chunks a piece is 32 MiB of all blocks together: these counts
 * make every collective run as two pieces or more, the last one short. */
#define BIG_FLOATS ((size_t)(9u << 20) + 7)

typedef struct knob_case {
  const char* vars[MAX_VARS]; /* "NAME=value" */
  int nwarn;                  /* "out of range" warnings expected per rank */
  int two_nodes;              /* ranks 0..n/2-1 and the rest on fake hosts */
} knob_case;

/* Send/recv around the ring: each rank's bytes arrive intact. */
static int p2p_ring(const mp_env* env, ncclComm_t comm) {
  int n = env->nranks, next = (env->rank + 1) % n, prev = (env->rank + n - 1) % n, bad = 0;
  unsigned char *out = malloc(P2P_BYTES), *in = malloc(P2P_BYTES);
  if (out == NULL || in == NULL) return 1;
  for (size_t i = 0; i < P2P_BYTES; i++) out[i] = (unsigned char)(i * 7u + (unsigned)env->rank);
  memset(in, 0, P2P_BYTES);
  bad += mp_sendrecv(env, comm, out, in, P2P_BYTES, next, prev);
  for (size_t i = 0; i < P2P_BYTES && bad == 0; i++)
    if (in[i] != (unsigned char)(i * 7u + (unsigned)prev)) {
      mp_fail(env, "send/recv: byte %zu from rank %d is %u", i, prev, in[i]);
      bad++;
    }
  free(out);
  free(in);
  return bad;
}

/* Every collective, each larger than one piece; exact or the test fails. */
static int big_calls(const mp_env* env, ncclComm_t comm) {
  int bad = 0;
  for (int coll = 0; coll < CC_NCOLLS; coll++) {
    int blocked = coll == CC_ALLGATHER || coll == CC_REDUCESCATTER || coll == CC_ALLTOALL ||
                  coll == CC_GATHER || coll == CC_SCATTER;
    cc_call c = {.coll = coll,
                 .type = ncclFloat32,
                 .kind = AR_SUM,
                 .op = ncclSum,
                 .count = blocked ? BIG_FLOATS / (size_t)env->nranks : BIG_FLOATS,
                 .root = env->nranks - 1,
                 .inplace = coll & 1,
                 .salt = 4242u + (uint64_t)coll};
    int r = cc_run(&c, env, comm);
    if (r < 0) return bad + 1;
    bad += r;
  }
  return bad;
}

static int knob_body(const mp_env* env) {
  const knob_case* k = env->arg;
  ncclComm_t comm = NULL;
  char host[32];
  for (int i = 0; i < MAX_VARS && k->vars[i]; i++) putenv((char*)k->vars[i]);
  if (k->two_nodes) {
    snprintf(host, sizeof(host), "knobnode%d", env->rank < env->nranks / 2);
    setenv("NCCL_HOSTID", host, 1);
  }
  mp_capture cap;
  if (mp_capture_begin(&cap) != 0) return 1;
  int bad = mp_comm_init(env, &comm);
  if (bad == 0) bad += big_calls(env, comm);
  if (bad == 0) bad += p2p_ring(env, comm);
  int warned = mp_capture_end(&cap, "out of range");
  if (comm) bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  if (warned < k->nwarn) {
    mp_fail(env, "%s: %d \"out of range\" warnings, expected %d", k->vars[0], warned, k->nwarn);
    bad++;
  }
  return bad != 0;
}

static void run_case(int nranks, const knob_case* k) {
  mp_opts o = MP_OPTS_INIT;
  fprintf(stderr, "case: %s%s%s\n", k->vars[0], k->vars[1] ? " " : "",
          k->vars[1] ? k->vars[1] : "");
  assert_int_equal(mp_launch(nranks, knob_body, (void*)k, &o), 0);
}

/* Chunks of 0, a negative size or a few bytes: 0 made the staging slots
 * 0 bytes long and every call wrong; 1 made a 1 MiB call 500x slower. */
static void test_chunk_size(void** state) {
  (void)state;
  static const knob_case cases[] = {
      {{"BRAID_CHUNK_SIZE=0"}, 1, 0},
      {{"BRAID_CHUNK_SIZE=-5"}, 1, 0},
      {{"BRAID_CHUNK_SIZE=3"}, 1, 0},
      {{"BRAID_CHUNK_SIZE=1G"}, 1, 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) run_case(3, &cases[i]);
}

/* TCP: 1-byte socket buffers, no sockets, more sockets than connections
 * can hold. Shared memory: 1-byte slots, no slots. Steps and spin. */
static void test_transport_knobs(void** state) {
  (void)state;
  static const knob_case cases[] = {
      {{"NCCL_SHM_DISABLE=1", "BRAID_SOCKET_BUF=1"}, 1, 0},
      {{"NCCL_SHM_DISABLE=1", "NCCL_SOCKET_NTHREADS=0", "NCCL_NSOCKS_PERTHREAD=1000"}, 2, 0},
      {{"BRAID_SHM_SLOT_BYTES=1", "BRAID_SHM_NSLOTS=0"}, 2, 0},
      /* BRAID_SPIN_US is read at the first idle wait, which may not come */
      {{"BRAID_NSTEPS=0", "BRAID_SPIN_US=-1", "NCCL_SHM_DISABLE=7"}, 2, 0},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) run_case(3, &cases[i]);
}

/* Calls of several pieces under every algorithm (Hier on two fake hosts). */
static void test_pieces(void** state) {
  (void)state;
  static const knob_case cases[] = {
      {{"BRAID_CHUNK_SIZE=4096", "NCCL_ALGO=Ring"}, 0, 0},
      {{"BRAID_CHUNK_SIZE=4096", "NCCL_ALGO=Tree"}, 0, 0},
      {{"BRAID_CHUNK_SIZE=4096", "NCCL_ALGO=RecDoubling"}, 0, 0},
      {{"BRAID_CHUNK_SIZE=4096", "NCCL_ALGO=Hier"}, 0, 1},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) run_case(4, &cases[i]);
}

/* The transport table's choice, as the log tells it (one line per peer):
 * both peers of each rank of a 3-rank comm on one host via SHM, or via
 * NET/Socket with NCCL_SHM_DISABLE=1; NCCL_NET naming a network this
 * build lacks fails init with ncclInvalidArgument on every rank. */
typedef struct choice_case {
  const char* var;  /* set on every rank, or NULL */
  const char* want; /* "via ..." expected for every peer */
} choice_case;

static int choice_body(const mp_env* env) {
  const choice_case* k = env->arg;
  ncclComm_t comm = NULL;
  float x[64] = {0};
  if (k->var) putenv((char*)k->var);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT", 1);
  mp_capture cap;
  if (mp_capture_begin(&cap) != 0) return 1;
  int bad = mp_comm_init(env, &comm);
  if (bad == 0)
    bad += mp_expect_rc(env, comm, ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comm, NULL),
                        ncclSuccess, "ncclAllReduce");
  if (comm) bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  int want = mp_capture_end(&cap, k->want);
  if (want != env->nranks - 1) { /* a ring of 3 ranks talks to both others */
    mp_fail(env, "%d lines \"%s\", expected %d", want, k->want, env->nranks - 1);
    bad++;
  }
  return bad != 0;
}

/* A network this build does not know fails init with ncclInvalidArgument;
 * IB, known but without a usable device or transport here, with
 * ncclInvalidUsage (arg set). */
static int bad_net_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  setenv("NCCL_NET", env->arg ? "IB" : "Carrier-Pigeon", 1);
  return mp_expect_rc(env, NULL, ncclCommInitRank(&comm, env->nranks, env->id, env->rank),
                      env->arg ? ncclInvalidUsage : ncclInvalidArgument,
                      "ncclCommInitRank with a network this build cannot use");
}

static void test_transport_choice(void** state) {
  (void)state;
  static const choice_case cases[] = {
      {NULL, ": peer * via SHM"},
      {"NCCL_SHM_DISABLE=1", ": peer * via NET/Socket"},
      {"NCCL_NET=socket", ": peer * via SHM"},
  };
  mp_opts o = MP_OPTS_INIT;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    fprintf(stderr, "case: %s\n", cases[i].var ? cases[i].var : "(defaults)");
    assert_int_equal(mp_launch(3, choice_body, (void*)&cases[i], &o), 0);
  }
  assert_int_equal(mp_launch(2, bad_net_body, NULL, &o), 0);
#ifdef BRAID_HAVE_IBVERBS
  static int ib = 1;
  assert_int_equal(mp_launch(2, bad_net_body, &ib, &o), 0);
#endif
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  mp_default_env("NCCL_DEBUG", "WARN"); /* the clamps are checked in the log */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chunk_size),
      cmocka_unit_test(test_transport_knobs),
      cmocka_unit_test(test_pieces),
      cmocka_unit_test(test_transport_choice),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
