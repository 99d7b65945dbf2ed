/* A transport and an algorithm of the tests' own (tests/rows), each added to
 * the library as docs/architecture.md says one is added: its file and one row
 * of the library's table (this binary links the two tables compiled again
 * with the rows). Every collective and send/recv runs over them, exact, and
 * the flight recorder names both. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "braid.h"
#include "collcheck.h"
#include "launcher.h"
#include "loop_transport.h"

static const size_t kCounts[] = {0, 1, 1023, 300007}; /* the last spans many slices */
static const ncclDataType_t kTypes[] = {ncclFloat32, ncclInt32, ncclBfloat16, ncclFloat64};
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct rows_case {
  const char* algo; /* NCCL_ALGO; NULL: unset */
  int nranks;
} rows_case;

/* Collectives [from, to) at every count, types, ops, roots and placements
 * rotating: 0 when all are exact, else how many were not (-1 on a failed
 * call). */
static int collectives(const mp_env* env, ncclComm_t comm, int from, int to) {
  int wrong = 0, i = 0;
  for (int coll = from; coll < to; coll++)
    for (size_t ci = 0; ci < COUNT_OF(kCounts); ci++)
      for (int ip = coll == CC_BCAST; ip < 2; ip++, i++) {
        cc_call c = {.coll = coll, .count = kCounts[ci], .salt = (uint64_t)i, .inplace = ip};
        c.type = kTypes[(size_t)i % COUNT_OF(kTypes)];
        c.kind = cc_is_reduction(coll) ? i % AR_NKINDS : AR_SUM;
        c.root = (i / 2) % env->nranks;
        if (cc_is_reduction(coll) && ar_op_create(env, comm, c.type, c.kind, &c.op) != 0) return -1;
        int r = cc_run(&c, env, comm);
        if (cc_is_reduction(coll)) ar_op_destroy(env, comm, c.kind, c.op);
        if (r < 0) return -1;
        if (r > 0) mp_fail(env, "%s count %zu in place %d: wrong", cc_coll_name(coll), c.count, ip);
        wrong += r;
      }
  return wrong;
}

/* Point-to-point around the ring, both ways, small and large. */
static int ring_sendrecv(const mp_env* env, ncclComm_t comm) {
  static const size_t sizes[] = {1, 4099, 3u << 20};
  int n = env->nranks, r = env->rank, bad = 0;
  for (size_t i = 0; i < COUNT_OF(sizes); i++) {
    unsigned char* out = malloc(sizes[i]);
    unsigned char* in = malloc(sizes[i]);
    if (out == NULL || in == NULL) return free(out), free(in), -1;
    for (int way = 1; way <= (n > 2 ? n - 1 : 1); way += n > 2 ? n - 2 : 1) {
      int to = (r + way) % n, from = (r - way + n) % n;
      for (size_t b = 0; b < sizes[i]; b++) out[b] = (unsigned char)(b * 31 + (size_t)r);
      memset(in, 0xee, sizes[i]);
      if (mp_sendrecv(env, comm, out, in, sizes[i], to, from) != 0) bad = -1;
      for (size_t b = 0; b < sizes[i] && bad == 0; b++)
        if (in[b] != (unsigned char)(b * 31 + (size_t)from)) {
          mp_fail(env, "send/recv of %zu bytes from %d: byte %zu wrong", sizes[i], from, b);
          bad = 1;
        }
    }
    free(out);
    free(in);
    if (bad) return bad;
  }
  return 0;
}

/* The recorder's JSON holds `what` (an op's algorithm or a link's transport). */
static int recorder_says(const mp_env* env, ncclComm_t comm, const char* what) {
  char* text = NULL;
  if (braidCommRecorder(comm, &text) != ncclSuccess || text == NULL) {
    mp_fail(env, "braidCommRecorder failed");
    return 1;
  }
  int found = strstr(text, what) != NULL;
  if (!found) mp_fail(env, "the flight recorder never says %s", what);
  free(text);
  return !found;
}

static int rows_body(const mp_env* env) {
  const rows_case* c = env->arg;
  ncclComm_t comm;
  char algo_json[64];
  if (c->algo) setenv("NCCL_ALGO", c->algo, 1);
  if (mp_comm_init(env, &comm) != 0) return 1;
  /* those an algorithm builds, whose last calls the recorder then holds,
   * then those made of sends and receives */
  int bad = collectives(env, comm, 0, CC_ALLTOALL);
  snprintf(algo_json, sizeof(algo_json), "\"algo\":\"%s\"", c->algo ? c->algo : "");
  if (bad >= 0 && c->algo) bad += recorder_says(env, comm, algo_json);
  if (bad >= 0) bad += collectives(env, comm, CC_ALLTOALL, CC_NCOLLS);
  if (bad == 0 && env->nranks > 1) bad = ring_sendrecv(env, comm);
  if (bad < 0) {
    ncclCommAbort(comm);
    return 1;
  }
  if (env->nranks > 1) {
    /* the test's transport joined every pair: nothing else was there to carry it */
    if (loop_transport_messages() == 0) {
      mp_fail(env, "the loop transport carried no message");
      bad++;
    }
    bad += recorder_says(env, comm, "\"transport\":\"loop\"");
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

static void test_rows(void** state) {
  const rows_case* c = *state;
  assert_int_equal(mp_launch(c->nranks, rows_body, (void*)c, NULL), 0);
}

/* The loop transport under the tuner's own picks; the star forced by name,
 * on a hub alone and with two, three and five spokes. */
static const rows_case k_loop4 = {NULL, 4};
static const rows_case k_star1 = {"Star", 1};
static const rows_case k_star3 = {"Star", 3};
static const rows_case k_star6 = {"Star", 6};
static const rows_case k_star2 = {"Star", 2};

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_prestate(test_rows, (void*)&k_loop4),
      cmocka_unit_test_prestate(test_rows, (void*)&k_star1),
      cmocka_unit_test_prestate(test_rows, (void*)&k_star2),
      cmocka_unit_test_prestate(test_rows, (void*)&k_star3),
      cmocka_unit_test_prestate(test_rows, (void*)&k_star6),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
