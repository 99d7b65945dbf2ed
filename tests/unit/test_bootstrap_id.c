/*
 * Unique ids: encode/decode round trip, refusal of garbage, and that
 * ncclGetUniqueId yields distinct keys and a usable root address.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include "bootstrap/bootstrap.h"
#include "nccl.h"

static void test_roundtrip(void** state) {
  (void)state;
  struct bootstrap_id in = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION, 0x1122334455667788ull, {0}};
  struct bootstrap_id out;
  ncclUniqueId uid;
  in.root.family = AF_INET;
  in.root.port = htons(4242);
  in.root.addr[0] = 127;
  in.root.addr[3] = 1;
  bootstrap_id_encode(&in, &uid);
  for (size_t i = sizeof(in); i < sizeof(uid); i++) assert_int_equal(uid.internal[i], 0);
  assert_int_equal(bootstrap_id_decode(&uid, &out), ncclSuccess);
  assert_memory_equal(&in, &out, sizeof(in));
}

static void test_garbage_refused(void** state) {
  (void)state;
  struct bootstrap_id out;
  ncclUniqueId uid;
  srand(7);
  for (int t = 0; t < 1000; t++) {
    for (size_t i = 0; i < sizeof(uid); i++) uid.internal[i] = (char)rand();
    assert_int_equal(bootstrap_id_decode(&uid, &out), ncclInvalidArgument);
  }
  memset(&uid, 0, sizeof(uid));
  assert_int_equal(bootstrap_id_decode(&uid, &out), ncclInvalidArgument);
  struct bootstrap_id bad = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION + 1, 1, {AF_INET, 1, 0, {0}}};
  bootstrap_id_encode(&bad, &uid);
  assert_int_equal(bootstrap_id_decode(&uid, &out), ncclInvalidArgument);
  bad.version = BOOTSTRAP_VERSION;
  bad.root.family = 12345;
  bootstrap_id_encode(&bad, &uid);
  assert_int_equal(bootstrap_id_decode(&uid, &out), ncclInvalidArgument);
}

static void test_get_unique_id(void** state) {
  (void)state;
  ncclUniqueId a, b;
  struct bootstrap_id ia, ib;
  unsetenv("NCCL_COMM_ID");
  assert_int_equal(ncclGetUniqueId(&a), ncclSuccess);
  assert_int_equal(ncclGetUniqueId(&b), ncclSuccess);
  assert_int_equal(bootstrap_id_decode(&a, &ia), ncclSuccess);
  assert_int_equal(bootstrap_id_decode(&b, &ib), ncclSuccess);
  assert_true(ia.key != ib.key);
  assert_true(ia.root.port != 0 && ia.root.port != ib.root.port);
  assert_int_equal(ncclGetUniqueId(NULL), ncclInvalidArgument);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_garbage_refused),
      cmocka_unit_test(test_get_unique_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
