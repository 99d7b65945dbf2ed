/*
 * The SIMD paths' plain fp8 sums (kernels/cpu/reduce_simd.h) against the
 * portable path, bit for bit. The plain path takes a block only when no
 * source holds a NaN (or, for e5m2, an infinity); test_kernels' random
 * bytes seldom give whole blocks like that (an e5m2 block of 64 from two
 * sources has one with probability 0.98), and its every-pair test has two
 * sources only. Here every value is finite, sums of 2 to 8 sources go to
 * 1 to 3 destinations, and some calls plant one special value in one
 * source, so that the test for them must look at every source and every
 * block: the blocks then take the NaN-keeping path and the others stay
 * plain.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "cpu/kern_dispatch.h"

#define MAXN 4099
#define MAXS 8 /* sources */
#define MAXD 3 /* destinations */
#define OFF 64 /* room for the misaligned layouts */
#define FILL 0xA5

static uint64_t rng_state;

static uint32_t rnd(void) { /* xorshift64*: the same data every run */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* Whether fp8 bits v are a value the plain path leaves alone. */
static int fp8_special(ncclDataType_t type, unsigned v) {
  return type == ncclFloat8e4m3 ? (v & 0x7f) == 0x7f : (v & 0x7f) > 0x7b;
}

/* A random finite value; one in four near the largest, so that sums
 * overflow and saturate. */
static uint8_t fp8_finite(ncclDataType_t type) {
  uint32_t r = rnd();
  unsigned v = r & 0xff;
  if ((r >> 8) % 4 == 0) v |= 0x70; /* the top exponents */
  while (fp8_special(type, v)) v = (v & 0x80) | (v & 0x7f) >> 1;
  return (uint8_t)v;
}

struct bufs {
  uint8_t src[MAXS][MAXN + OFF]; /* pristine sources */
  uint8_t work[MAXS][MAXN + OFF];
  uint8_t dst[MAXD][MAXN + 2 * OFF];
  uint8_t want[MAXN];
};

/* One call: the sources copied to their layout, one special value planted
 * in source `ns - 1 - plant % ns` at element `at` when plant is set, the
 * portable path's chain as the reference, then the path under test. */
static void chain_case(struct bufs* b, const char* isa, ncclDataType_t type, int ns, int nd,
                       size_t n, int layout, int plant) {
  struct kern_task k;
  memset(&k, 0, sizeof k);
  k.redop = (struct kern_redop){type, KERN_SUM, 0, 1};
  k.nsrcs = ns, k.ndsts = 1, k.n = n;
  for (int s = 0; s < ns; s++) {
    size_t o = layout == 1 ? (size_t)(s * 5 + 1) % 17 : 0;
    memcpy(b->work[s] + o, b->src[s], n);
    k.srcs[s] = b->work[s] + o;
  }
  if (plant) {
    uint8_t* p = (uint8_t*)k.srcs[ns - 1 - plant % ns];
    size_t at = (size_t)plant * 37 % n;
    p[at] = type == ncclFloat8e4m3 ? 0xff : (plant % 2 ? 0x7c : 0xfe); /* NaN, inf, NaN */
  }
  kern_force_isa("portable");
  k.dsts[0] = b->want;
  kern_task_run(&k);
  assert_true(kern_force_isa(isa));
  k.ndsts = nd;
  for (int j = 0; j < nd; j++) {
    memset(b->dst[j], FILL, sizeof b->dst[j]);
    k.dsts[j] = b->dst[j] + (layout == 1 ? (size_t)j + 3 : OFF);
  }
  if (layout == 2) k.dsts[0] = (void*)k.srcs[ns - 1]; /* in place */
  kern_task_run(&k);
  for (int j = 0; j < nd; j++) {
    const uint8_t* d = k.dsts[j];
    for (size_t i = 0; i < n; i++)
      if (d[i] != b->want[i])
        fail_msg("%s %s ns=%d nd=%d n=%zu layout %d plant %d: dst %d [%zu] = %02x, want %02x", isa,
                 type == ncclFloat8e4m3 ? "e4m3" : "e5m2", ns, nd, n, layout, plant, j, i, d[i],
                 b->want[i]);
    if (d != b->dst[j] + OFF) continue;
    for (size_t i = 0; i < OFF; i++)
      if (b->dst[j][i] != FILL || d[n + i] != FILL)
        fail_msg("%s ns=%d nd=%d n=%zu: dst %d written outside", isa, ns, nd, n, j);
  }
}

static void fp8_chains(const char* isa, int nt) {
  static const size_t lens[] = {31, 32, 33, 63, 64, 65, 96, 127, 1000, MAXN};
  static const int nss[] = {2, 3, 5, 8}, nds[] = {1, 2, 3};
  static const ncclDataType_t fp8[] = {ncclFloat8e4m3, ncclFloat8e5m2};
  if (!kern_force_isa(isa)) {
    print_message("path %s not available on this CPU\n", isa);
    skip();
  }
  size_t old_nt = kern_set_nt_threshold(nt ? 1 : SIZE_MAX);
  struct bufs* b = aligned_alloc(64, (sizeof *b + 63) / 64 * 64); /* C11: a multiple */
  assert_non_null(b);
  for (size_t t = 0; t < 2; t++) {
    rng_state = 0x9E3779B97F4A7C15ull + fp8[t];
    for (int s = 0; s < MAXS; s++)
      for (size_t i = 0; i < MAXN; i++) b->src[s][i] = fp8_finite(fp8[t]);
    for (size_t a = 0; a < sizeof nss / sizeof nss[0]; a++)
      for (size_t d = 0; d < sizeof nds / sizeof nds[0]; d++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++)
          for (int layout = 0; layout < 3; layout++)
            for (int plant = 0; plant < 3; plant++)
              chain_case(b, isa, fp8[t], nss[a], nds[d], lens[l], layout, plant);
  }
  free(b);
  kern_set_nt_threshold(old_nt);
  kern_force_isa(NULL);
}

static void test_chains_avx2(void** state) {
  (void)state;
  fp8_chains("avx2", 0);
}
static void test_chains_avx2_nt(void** state) {
  (void)state;
  fp8_chains("avx2", 1);
}
static void test_chains_avx512(void** state) {
  (void)state;
  fp8_chains("avx512", 0);
}
static void test_chains_avx512_nt(void** state) {
  (void)state;
  fp8_chains("avx512", 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_chains_avx2),
      cmocka_unit_test(test_chains_avx2_nt),
      cmocka_unit_test(test_chains_avx512),
      cmocka_unit_test(test_chains_avx512_nt),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
