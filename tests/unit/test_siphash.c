/* SipHash-2-4 against the reference vectors of its paper (key 00..0f,
 * message 00..len-1), and its use as a keyed function: another key or one
 * more byte gives another value. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "siphash.h"

static const uint64_t kK0 = 0x0706050403020100ull, kK1 = 0x0f0e0d0c0b0a0908ull;

static void test_vectors(void** state) {
  (void)state;
  static const struct {
    size_t len;
    uint64_t want;
  } v[] = {{0, 0x726fdb47dd0e0e31ull}, {1, 0x74f839c593dc67fdull},  {7, 0xab0200f58b01d137ull},
           {8, 0x93f5f5799a932462ull}, {15, 0xa129ca6149be45e5ull}, {16, 0x3f2acc7f57c29bdbull}};
  unsigned char msg[64];
  for (int i = 0; i < 64; i++) msg[i] = (unsigned char)i;
  for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
    assert_int_equal(siphash24(kK0, kK1, msg, v[i].len), v[i].want);
}

static void test_keyed(void** state) {
  (void)state;
  const char m[] = "braid";
  uint64_t h = siphash24(kK0, kK1, m, 5);
  assert_int_not_equal(h, siphash24(kK0 ^ 1, kK1, m, 5));
  assert_int_not_equal(h, siphash24(kK0, kK1 ^ ((uint64_t)1 << 63), m, 5));
  assert_int_not_equal(h, siphash24(kK0, kK1, m, 6));
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_vectors), cmocka_unit_test(test_keyed)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
