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

static const size_t k_counts[] = {7, 1000, 100003, MAX_COUNT};
static const ncclDataType_t k_types[] = {ncclFloat, ncclDouble, ncclHalf, ncclBfloat16};
static const ncclRedOp_t k_ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
#define NCOUNTS (sizeof(k_counts) / sizeof(k_counts[0]))
#define NTYPES (sizeof(k_types) / sizeof(k_types[0]))
#define NOPS (sizeof(k_ops) / sizeof(k_ops[0]))
#define NCASES (NCOUNTS * NTYPES * NOPS)
#define MAX_RANKS 5

/* Case k of the matrix; 0 when it is left out to keep the suite fast. */
static int case_of(size_t k, struct identical_case* c) {
  size_t ci = k / (NTYPES * NOPS), t = k / NOPS % NTYPES, o = k % NOPS;
  *c = (struct identical_case){k_counts[ci], k_types[t], k_ops[o]};
  return !(k_counts[ci] == MAX_COUNT && (o % 2 || t % 2));
}

/* One communicator runs every case, as an application reuses one: each rank
 * publishes each result's hash in shared memory; once all have, every rank
 * compares its hashes with rank 0's. */
static int identical_body(const mp_env* env) {
  ncclComm_t comm;
  int bad = 0;
  if (mp_comm_init(env, &comm)) return 1;
  void *in = malloc(MAX_COUNT * 8 + 1), *out = malloc(MAX_COUNT * 8 + 1);
  volatile uint64_t* hashes = (volatile uint64_t*)(env->shm + 8);
  for (size_t k = 0; k < NCASES && in && out; k++) {
    struct identical_case c;
    if (!case_of(k, &c)) continue;
    fill_random(in, c.count, c.type, 7919u * (unsigned)(env->rank + 1) + (unsigned)k);
    bad += mp_expect_rc(env, comm, ncclAllReduce(in, out, c.count, c.type, c.op, comm, NULL),
                        ncclSuccess, "all-reduce");
    hashes[k * MAX_RANKS + (size_t)env->rank] = fnv(out, c.count * type_size(c.type));
  }
  __atomic_fetch_add((int*)&env->shm[0], 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n((int*)&env->shm[0], __ATOMIC_SEQ_CST) < env->nranks) mp_sleep_ms(1);
  for (size_t k = 0; k < NCASES; k++) {
    struct identical_case c;
    if (!case_of(k, &c) || hashes[k * MAX_RANKS] == hashes[k * MAX_RANKS + (size_t)env->rank])
      continue;
    mp_fail(env, "count %zu type %d op %d: result differs from rank 0's", c.count, (int)c.type,
            (int)c.op);
    bad++;
  }
  if (!in || !out) {
    mp_fail(env, "out of memory");
    bad++;
  }
  free(in);
  free(out);
  ncclCommDestroy(comm);
  return bad;
}

static void test_results_bitwise_identical(void** state) {
  (void)state;
  _Static_assert(8 * sizeof(int) + NCASES * MAX_RANKS * 8 <= MP_SHM_INTS * sizeof(int),
                 "the hashes fit in the launcher's shared memory");
  for (int n = 3; n <= MAX_RANKS; n++) {
    mp_opts opts = MP_OPTS_INIT;
    assert_int_equal(mp_launch(n, identical_body, NULL, &opts), 0);
  }
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_results_bitwise_identical)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
