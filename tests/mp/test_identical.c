/* Every rank ends with bitwise the same result, also for inputs whose sum
 * depends on the order of reduction (random floats, signed zeros, NaN-free
 * but inexact), for both algorithms the tuner can pick. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "launcher.h"

#define MAX_COUNT ((size_t)(1 << 20) + 3)

struct identical_case {
  size_t count;
  ncclDataType_t type;
  ncclRedOp_t op;
};

static size_t type_size(ncclDataType_t t) {
  return t == ncclDouble ? 8 : (t == ncclHalf || t == ncclBfloat16) ? 2 : 4;
}

/* Random values of mixed magnitude, so floating-point sums are inexact. */
static void fill_random(void* buf, size_t count, ncclDataType_t type, unsigned seed) {
  for (size_t i = 0; i < count; i++) {
    seed = seed * 1103515245u + 12345u;
    double v = ((double)(seed >> 8) / (1 << 24) - 0.5) * (double)(1u << (seed % 12));
    if (seed % 3 == 0) v = (seed & 16) ? 0.0 : -0.0; /* signed zeros meet often */
    if (type == ncclFloat) ((float*)buf)[i] = (float)v;
    if (type == ncclDouble) ((double*)buf)[i] = v;
    if (type == ncclHalf || type == ncclBfloat16) {
      float f = (float)(v / 64);
      uint32_t b;
      memcpy(&b, &f, 4);
      /* truncation is fine for inputs: any valid encoding will do */
      ((uint16_t*)buf)[i] =
          type == ncclBfloat16 ? (uint16_t)(b >> 16) : (uint16_t)(0x3c00 ^ (b & 0x3ff));
    }
  }
}

static uint64_t fnv(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ull;
  return h;
}

/* Each rank publishes its result's hash in shared memory; once all have,
 * every rank compares its hash with rank 0's. */
static int identical_body(const mp_env* env) {
  const struct identical_case* c = env->arg;
  ncclComm_t comm;
  int bad = 0;
  if (mp_comm_init(env, &comm)) return 1;
  size_t bytes = c->count * type_size(c->type);
  void *in = malloc(bytes + 1), *out = malloc(bytes + 1);
  fill_random(in, c->count, c->type, 7919u * (unsigned)(env->rank + 1));
  bad += mp_expect_rc(env, comm, ncclAllReduce(in, out, c->count, c->type, c->op, comm, NULL),
                      ncclSuccess, "all-reduce");
  uint64_t h = fnv(out, bytes);
  volatile uint64_t* hashes = (volatile uint64_t*)(env->shm + 8);
  hashes[env->rank] = h;
  __atomic_fetch_add((int*)&env->shm[0], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n((int*)&env->shm[0], __ATOMIC_SEQ_CST) < env->nranks) mp_sleep_ms(1);
  if (hashes[0] != h) {
    mp_fail(env, "count %zu type %d op %d: result differs from rank 0's", c->count, (int)c->type,
            (int)c->op);
    bad++;
  }
  free(in);
  free(out);
  ncclCommDestroy(comm);
  return bad;
}

static void test_results_bitwise_identical(void** state) {
  (void)state;
  static const size_t counts[] = {7, 1000, 100003, MAX_COUNT};
  static const ncclDataType_t types[] = {ncclFloat, ncclDouble, ncclHalf, ncclBfloat16};
  static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  static const int nranks[] = {3, 4, 5};
  for (size_t n = 0; n < 3; n++)
    for (size_t ci = 0; ci < 4; ci++)
      for (size_t t = 0; t < 4; t++)
        for (size_t o = 0; o < 5; o++) {
          struct identical_case c = {counts[ci], types[t], ops[o]};
          mp_opts opts = MP_OPTS_INIT;
          if (counts[ci] == MAX_COUNT && (o % 2 || t % 2)) continue; /* keep the suite fast */
          assert_int_equal(mp_launch(nranks[n], identical_body, &c, &opts), 0);
        }
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_results_bitwise_identical)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
