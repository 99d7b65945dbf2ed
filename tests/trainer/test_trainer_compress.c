/*
 * braid-train's --compress codes and --sync parsing: fp16/bf16/e4m3 rounding (to nearest
 * even, e4m3 saturating at 448 with subnormals down to 2^-9), the error-feedback residual
 * (what was sent plus what is kept is what was asked), topk's choice (the k largest
 * magnitudes, ties to the lower index) and its sums, and the flags' text.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compress.h"
#include "sync.h"

/* One value through a dense code and back. */
static float round_trip(compress_kind_t kind, float v, float scale) {
  unsigned char buf[4];
  float back, r = 0.0f;
  compress_encode(kind, &v, &r, buf, 1, scale);
  compress_decode(kind, buf, &back, 1, scale);
  return back;
}

static void test_half_and_bf16(void** state) {
  (void)state;
  assert_true(round_trip(COMPRESS_FP16, 1.0f, 1) == 1.0f);
  assert_true(round_trip(COMPRESS_FP16, 1.0f + 0x1p-11f, 1) == 1.0f); /* a tie: to even */
  assert_true(round_trip(COMPRESS_FP16, 1.0f + 0x1p-10f + 0x1p-11f, 1) == 1.0f + 0x1p-9f);
  assert_true(round_trip(COMPRESS_FP16, 70000.0f, 1) == INFINITY);   /* past 65504 */
  assert_true(round_trip(COMPRESS_BF16, 1.0f + 0x1p-8f, 1) == 1.0f); /* a tie: to even */
  assert_true(round_trip(COMPRESS_BF16, 1.0f + 0x1p-7f + 0x1p-8f, 1) == 1.0f + 0x1p-6f);
  assert_true(round_trip(COMPRESS_BF16, -3.0e38f, 1) < -2.9e38f);
  assert_true(isnan(round_trip(COMPRESS_BF16, NAN, 1)));
}

/* A float from a pseudo-random word, spread over every exponent. */
static float any_float(uint64_t* x) {
  *x = *x * 6364136223846793005ull + 1442695040888963407ull;
  uint32_t u = (uint32_t)(*x >> 32);
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

/* The bit-level half conversion against the compiler's (_Float16, to nearest even). */
static void test_half_like_the_compiler(void** state) {
  (void)state;
  uint64_t seed = 1;
  for (int i = 0; i < 2000000; i++) {
    float v = any_float(&seed), got = round_trip(COMPRESS_FP16, v, 1);
    float want = (float)(_Float16)v;
    if (isnan(v)) {
      assert_true(isnan(got));
      continue;
    }
    if (memcmp(&got, &want, sizeof(got)) != 0) fail_msg("half of %a: %a, want %a", v, got, want);
  }
}

/* e4m3 as the format defines it, slowly: the nearest code (ties to an even mantissa),
 * saturating at 448. */
static float e4m3_reference(float v) {
  float a = fabsf(v), best = 0.0f;
  if (a >= 448.0f) return copysignf(448.0f, v);
  for (int code = 0; code <= 0x7e; code++) {
    int e = code >> 3, m = code & 7;
    float c = e ? ldexpf(1.0f + m / 8.0f, e - 7) : ldexpf((float)m, -9);
    float d = fabsf(c - a), bd = fabsf(best - a);
    if (d < bd || (d == bd && (code & 1) == 0)) best = c;
  }
  return copysignf(best, v);
}

static void test_e4m3_like_the_reference(void** state) {
  (void)state;
  uint64_t seed = 7;
  for (int i = 0; i < 200000; i++) {
    float v = ldexpf(any_float(&seed) > 0 ? 1.0f : -1.0f, 0) *
              ldexpf((float)(seed >> 40 & 0xffff) / 65536.0f, (int)(seed >> 20 & 31) - 16);
    float got = round_trip(COMPRESS_FP8, v, 1), want = e4m3_reference(v);
    if (got != want) fail_msg("e4m3 of %a: %a, want %a", v, got, want);
  }
}

static void test_e4m3(void** state) {
  (void)state;
  assert_true(round_trip(COMPRESS_FP8, 448.0f, 1) == 448.0f);
  assert_true(round_trip(COMPRESS_FP8, 1000.0f, 1) == 448.0f); /* saturates */
  assert_true(round_trip(COMPRESS_FP8, -1e9f, 1) == -448.0f);
  assert_true(round_trip(COMPRESS_FP8, 0x1p-9f, 1) == 0x1p-9f); /* the least subnormal */
  assert_true(round_trip(COMPRESS_FP8, 0x1p-11f, 1) == 0.0f);   /* below half of it */
  assert_true(round_trip(COMPRESS_FP8, 1.0625f, 1) == 1.0f);    /* a tie (1 + 1/16): to even */
  assert_true(round_trip(COMPRESS_FP8, 1.1875f, 1) == 1.25f);   /* 1 + 3/16: to even, up */
  assert_true(round_trip(COMPRESS_FP8, 0.0146484375f, 1) == 0.015625f); /* to the first normal */
  assert_true(round_trip(COMPRESS_FP8, 3.0f, 0.5f) == 3.0f);            /* scaled, and back */
  /* every code's value comes back as itself */
  for (int b = 0; b < 256; b++) {
    if ((b & 0x7f) == 0x7f) continue; /* NaN */
    unsigned char in = (unsigned char)b, out;
    float v, r = 0.0f;
    compress_decode(COMPRESS_FP8, &in, &v, 1, 1.0f);
    compress_encode(COMPRESS_FP8, &v, &r, &out, 1, 1.0f);
    if (b != 0x80) assert_int_equal(out, in); /* -0 encodes as -0 too, but compare values */
    assert_true(r == 0.0f);
  }
  assert_true(compress_fp8_scale(0.0f) == 0.0f);
  assert_true(compress_fp8_scale(224.0f) == 1.0f); /* 448 / (2 x 224) */
}

/* Sent plus kept equals asked, over steps: nothing is lost. */
static void test_error_feedback(void** state) {
  (void)state;
  enum { N = 64 };
  float x[N], r[N] = {0}, back[N];
  unsigned char buf[N * 2];
  double asked = 0, sent = 0;
  for (int step = 0; step < 50; step++) {
    for (int i = 0; i < N; i++) x[i] = 0.001f * (float)((i * 7 + step * 3) % 11) - 0.004f;
    compress_encode(COMPRESS_FP8, x, r, buf, N, 300.0f);
    compress_decode(COMPRESS_FP8, buf, back, N, 300.0f);
    for (int i = 0; i < N; i++) asked += x[i], sent += back[i];
  }
  double kept = 0;
  for (int i = 0; i < N; i++) kept += r[i];
  assert_true(fabs(asked - (sent + kept)) < 1e-4);
}

static void test_topk(void** state) {
  (void)state;
  enum { N = 10 };
  float x[N] = {0.5f, -3.0f, 1.0f, 3.0f, -1.0f, 0.0f, 2.0f, -2.0f, 1.0f, 0.25f};
  float r[N] = {0}, out[N] = {0};
  uint32_t pairs[2 * 4], scratch[COMPRESS_TOPK_SCRATCH(N)];
  assert_int_equal(compress_topk_count(0.3, N), 3);
  assert_int_equal(compress_topk_count(1e-9, N), 1);
  compress_topk_encode(x, r, N, 4, 100, pairs, scratch);
  /* |3| twice, then |2| twice: 2.0 at 6 before -2.0 at 7 is taken; both 2s tie, both fit */
  uint32_t want_idx[4] = {101, 103, 106, 107};
  for (int j = 0; j < 4; j++) assert_int_equal(pairs[2 * j], want_idx[j]);
  assert_true(r[1] == 0.0f && r[3] == 0.0f && r[6] == 0.0f && r[7] == 0.0f);
  assert_true(r[0] == 0.5f && r[2] == 1.0f && r[9] == 0.25f); /* the rest stays */
  for (int j = 0; j < 4; j++) pairs[2 * j] -= 100;            /* back to this range's indices */
  compress_topk_add(pairs, 4, out);
  assert_true(out[1] == -3.0f && out[3] == 3.0f && out[6] == 2.0f && out[7] == -2.0f);
  /* ties at the cut: 1.0 at 2, -1.0 at 4 and 1.0 at 8 tie for two places: 2 and 4 */
  float y[N] = {0.5f, -3.0f, 1.0f, 3.0f, -1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.25f}, q[N] = {0};
  compress_topk_encode(y, q, N, 4, 0, pairs, scratch);
  uint32_t want2[4] = {1, 2, 3, 4};
  for (int j = 0; j < 4; j++) assert_int_equal(pairs[2 * j], want2[j]);
  assert_true(q[8] == 1.0f);
  /* the residual comes back next time: 1.0 at 8 plus nothing new is now the largest */
  float zero[N] = {0};
  compress_topk_encode(zero, q, N, 1, 0, pairs, scratch);
  assert_int_equal(pairs[0], 8);
}

static void test_flags(void** state) {
  (void)state;
  compress_spec_t c;
  sync_spec_t s = {0};
  char text[64], err[160];
  assert_int_equal(compress_parse("topk:0.01", &c), 0);
  compress_format(&c, text, sizeof(text));
  assert_string_equal(text, "topk:0.01");
  assert_int_not_equal(compress_parse("topk:0", &c), 0);
  assert_int_not_equal(compress_parse("topk:1.5", &c), 0);
  assert_int_not_equal(compress_parse("fp4", &c), 0);
  assert_int_equal(sync_parse("ps", &s), 0);
  assert_true(s.kind == SYNC_PS && s.arg == 0);
  assert_int_equal(sync_parse("ps:3", &s), 0);
  assert_int_equal(s.arg, 3);
  assert_int_equal(sync_parse("local:8", &s), 0);
  sync_format(&s, text, sizeof(text));
  assert_string_equal(text, "local:8");
  assert_int_not_equal(sync_parse("local", &s), 0);
  assert_int_not_equal(sync_parse("local:0", &s), 0);
  assert_int_not_equal(sync_parse("stale:9", &s), 0); /* at most SYNC_MAX_STALE */
  assert_int_equal(sync_parse("stale:8", &s), 0);
  assert_int_not_equal(sync_parse("gossip:2", &s), 0);
  assert_int_equal(sync_parse("ps:3", &s), 0);
  assert_int_not_equal(sync_validate(&s, 3, err, sizeof(err)), 0);
  assert_int_equal(sync_validate(&s, 4, err, sizeof(err)), 0);
  assert_int_equal(sync_parse("gossip", &s), 0);
  assert_int_equal(compress_parse("bf16", &s.compress), 0);
  assert_int_not_equal(sync_validate(&s, 4, err, sizeof(err)), 0);
  assert_non_null(strstr(err, "not gossip"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_half_and_bf16),  cmocka_unit_test(test_half_like_the_compiler),
      cmocka_unit_test(test_e4m3),           cmocka_unit_test(test_e4m3_like_the_reference),
      cmocka_unit_test(test_error_feedback), cmocka_unit_test(test_topk),
      cmocka_unit_test(test_flags),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
