/*
 * Parsers of the environment knobs: sizes with suffixes, NCCL_DEBUG levels
 * and subsystem masks, NCCL_SOCKET_IFNAME rules, NCCL_COMM_ID addresses,
 * NCCL_ALGO lists and BRAID_TUNE_FILE lines.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "debug.h"
#include "param.h"
#include "socket.h"
#include "tuner.h"

static void test_parse_int(void** state) {
  (void)state;
  int64_t v = 0;
  assert_int_equal(param_parse_int("123", &v), 0);
  assert_int_equal(v, 123);
  assert_int_equal(param_parse_int("64K", &v), 0);
  assert_int_equal(v, 64 * 1024);
  assert_int_equal(param_parse_int("8m", &v), 0);
  assert_int_equal(v, 8 << 20);
  assert_int_equal(param_parse_int("2G", &v), 0);
  assert_int_equal(v, 2LL << 30);
  assert_int_equal(param_parse_int("0x10", &v), 0);
  assert_int_equal(v, 16);
  assert_int_equal(param_parse_int("-5", &v), 0);
  assert_int_equal(v, -5);
  assert_int_not_equal(param_parse_int("", &v), 0);
  assert_int_not_equal(param_parse_int("12Q", &v), 0);
  assert_int_not_equal(param_parse_int("K", &v), 0);
  assert_int_not_equal(param_parse_int("99999999999999999999", &v), 0);
  assert_int_not_equal(param_parse_int("9000000000G", &v), 0);
  assert_int_not_equal(param_parse_int(NULL, &v), 0);
}

static void test_read_int_falls_back(void** state) {
  (void)state;
  setenv("BRAID_TEST_KNOB", "bogus", 1);
  assert_int_equal(param_read_int("BRAID_TEST_KNOB", 42), 42);
  setenv("BRAID_TEST_KNOB", "4k", 1);
  assert_int_equal(param_read_int("BRAID_TEST_KNOB", 42), 4096);
  unsetenv("BRAID_TEST_KNOB");
  assert_int_equal(param_read_int("BRAID_TEST_KNOB", 42), 42);
}

/* Out-of-range knobs are clamped to the nearer bound, never used as given. */
static void test_read_range_clamps(void** state) {
  (void)state;
  static const struct {
    const char* value;
    int64_t want;
  } cases[] = {{"0", 16}, {"-5", 16}, {"1G", 128}, {"100", 100}, {"16", 16}, {"bogus", 64}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    setenv("BRAID_TEST_KNOB", cases[i].value, 1);
    assert_int_equal(param_read_range("BRAID_TEST_KNOB", 64, 16, 128), cases[i].want);
  }
  unsetenv("BRAID_TEST_KNOB");
  assert_int_equal(param_read_range("BRAID_TEST_KNOB", 64, 16, 128), 64);
  assert_int_equal(param_clamp("BRAID_TEST_KNOB", INT64_MIN, 0, 1), 0);
}

static void test_debug_level(void** state) {
  (void)state;
  assert_int_equal(debug_parse_level("WARN"), DEBUG_WARN);
  assert_int_equal(debug_parse_level("info"), DEBUG_INFO);
  assert_int_equal(debug_parse_level("TRACE"), DEBUG_TRACE);
  assert_int_equal(debug_parse_level("VERSION"), DEBUG_VERSION);
  assert_int_equal(debug_parse_level("nonsense"), DEBUG_NONE);
  assert_int_equal(debug_parse_level(NULL), DEBUG_NONE);
}

static void test_debug_subsys(void** state) {
  (void)state;
  assert_int_equal(debug_parse_subsys("INIT,NET"), SUB_INIT | SUB_NET);
  assert_int_equal(debug_parse_subsys("coll"), SUB_COLL);
  assert_int_equal(debug_parse_subsys("ALL"), SUB_ALL);
  assert_int_equal(debug_parse_subsys("^COLL,P2P"), ~(uint32_t)(SUB_COLL | SUB_P2P));
  assert_int_equal(debug_parse_subsys("BOGUS"), 0);
  assert_true(debug_parse_subsys(NULL) & SUB_INIT);
}

static void test_ifname_rules(void** state) {
  (void)state;
  assert_true(socket_ifname_match("eth", "eth0"));
  assert_true(socket_ifname_match("ib,eth", "eth1"));
  assert_false(socket_ifname_match("ib", "eth0"));
  assert_false(socket_ifname_match("^docker,lo", "lo"));
  assert_false(socket_ifname_match("^docker,lo", "docker0"));
  assert_true(socket_ifname_match("^docker,lo", "eth0"));
  assert_true(socket_ifname_match("=eth0", "eth0"));
  assert_false(socket_ifname_match("=eth0", "eth01"));
  assert_false(socket_ifname_match("^=eth0", "eth0"));
  assert_true(socket_ifname_match("^=eth0", "eth01"));
  assert_true(socket_ifname_match("", "anything") == 0);
}

static void test_hostport(void** state) {
  (void)state;
  union socket_addr a;
  char buf[SOCKET_ADDR_STRLEN];
  assert_int_equal(socket_parse_hostport("127.0.0.1:5000", &a), ncclSuccess);
  assert_int_equal(a.sa.sa_family, AF_INET);
  assert_int_equal(ntohs(a.sin.sin_port), 5000);
  assert_string_equal(socket_addr_str(&a, buf, sizeof(buf)), "127.0.0.1<5000>");
  assert_int_equal(socket_parse_hostport("[::1]:6000", &a), ncclSuccess);
  assert_int_equal(a.sa.sa_family, AF_INET6);
  assert_int_equal(ntohs(a.sin6.sin6_port), 6000);
  assert_int_equal(socket_parse_hostport("::1:6001", &a), ncclSuccess);
  assert_int_equal(ntohs(a.sin6.sin6_port), 6001);
  assert_int_equal(socket_parse_hostport("localhost:7000", &a), ncclSuccess);
  assert_int_equal(socket_parse_hostport("127.0.0.1", &a), ncclInvalidArgument);
  assert_int_equal(socket_parse_hostport("127.0.0.1:", &a), ncclInvalidArgument);
  assert_int_equal(socket_parse_hostport("127.0.0.1:70000", &a), ncclInvalidArgument);
  assert_int_equal(socket_parse_hostport("127.0.0.1:12x", &a), ncclInvalidArgument);
  assert_int_equal(socket_parse_hostport(":80", &a), ncclInvalidArgument);
  assert_int_equal(socket_parse_hostport("no.such.host.invalid:80", &a), ncclInvalidArgument);
}

static void test_wire_roundtrip(void** state) {
  (void)state;
  union socket_addr a, b;
  struct socket_wire_addr w;
  assert_int_equal(socket_parse_hostport("[fe80::1]:1234", &a), ncclSuccess);
  a.sin6.sin6_scope_id = 3;
  socket_addr_to_wire(&a, &w);
  assert_int_equal(socket_addr_from_wire(&w, &b), 0);
  assert_memory_equal(&a.sin6, &b.sin6, sizeof(a.sin6));
  w.family = 99;
  assert_int_equal(socket_addr_from_wire(&w, &b), -1);
  socket_addr_to_wire(&a, &w);
  w.port = 0;
  assert_int_equal(socket_addr_from_wire(&w, &b), -1);
}

static void test_algo_list(void** state) {
  (void)state;
  unsigned all = (1u << ALGO_COUNT) - 1;
  assert_int_equal(tuner_parse_algos(NULL), all);
  assert_int_equal(tuner_parse_algos(""), all);
  assert_int_equal(tuner_parse_algos("Ring"), 1u << ALGO_RING);
  assert_int_equal(tuner_parse_algos("tree,RING"), (1u << ALGO_TREE) | (1u << ALGO_RING));
  assert_int_equal(tuner_parse_algos("^Tree"), all & ~(1u << ALGO_TREE));
  assert_int_equal(tuner_parse_algos("^Ring,RecDoubling"), (1u << ALGO_TREE) | (1u << ALGO_HIER));
  assert_int_equal(tuner_parse_algos("hier"), 1u << ALGO_HIER);
  assert_int_equal(tuner_parse_algos("CollnetDirect"), 0);
  assert_int_equal(tuner_parse_algos("Tre"), 0);
}

/* text as a tune file, into a zeroed model. */
static ncclResult_t tune_text(const char* text, struct tuner_model* m) {
  FILE* f = fmemopen((void*)text, strlen(text), "r");
  assert_non_null(f);
  memset(m, 0, sizeof(*m));
  ncclResult_t r = tuner_file_parse(f, "test", m);
  fclose(f);
  return r;
}

static void test_tune_file_lines(void** state) {
  (void)state;
  struct tuner_model m;
  static const char* bad[] = {"link net Ring nan 1\n",  "link net Ring inf 1\n",
                              "link net all 1 1e999\n", "link net Ring -1 1\n",
                              "link net Ring 1 0x\n",   "force AllReduce 2K 1K Ring\n"};
  assert_int_equal(tune_text("link intra Ring 1.5 0.02 # ok\nlink net all 0 1e-3\n", &m),
                   ncclSuccess);
  assert_true(m.intra.alpha_us[ALGO_RING] == 1.5 && m.net.beta_us_per_kb[ALGO_HIER] == 1e-3);
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(tune_text(bad[i], &m), ncclInvalidArgument);
  /* a line longer than any fixed buffer is one line */
  char text[1024];
  snprintf(text, sizeof(text), "# %0700d\nforce AllReduce 0 1K Tree\n", 7);
  assert_int_equal(tune_text(text, &m), ncclSuccess);
  assert_int_equal(m.nforced, 1);
  snprintf(text, sizeof(text), "force AllReduce 0 1K Tree %700s\n", "4K");
  assert_int_equal(tune_text(text, &m), ncclSuccess);
  assert_true(m.nforced == 1 && m.forced[0].chunk == 4096);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_int),         cmocka_unit_test(test_read_int_falls_back),
      cmocka_unit_test(test_read_range_clamps), cmocka_unit_test(test_debug_level),
      cmocka_unit_test(test_debug_subsys),      cmocka_unit_test(test_ifname_rules),
      cmocka_unit_test(test_hostport),          cmocka_unit_test(test_wire_roundtrip),
      cmocka_unit_test(test_algo_list),         cmocka_unit_test(test_tune_file_lines),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
