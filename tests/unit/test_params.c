/*
 * Parsers of the environment knobs: sizes with suffixes, NCCL_DEBUG levels
 * and subsystem masks, NCCL_SOCKET_IFNAME rules, NCCL_COMM_ID addresses,
 * NCCL_ALGO lists and BRAID_TUNE_FILE lines; the parameter table against
 * docs/environment.md's, and its getters (read once, logged once).
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
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "debug.h"
#include "param.h"
#include "socket.h"
#include "tune/tuner.h"
#include "tune/tuner_file.h"

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
  /* the parse keeps Pairwise in an exclusion; the tuner drops it unless named */
  assert_int_equal(tuner_parse_algos("^Ring,RecDoubling"),
                   (1u << ALGO_TREE) | (1u << ALGO_HIER) | (1u << ALGO_PAIRWISE));
  assert_int_equal(tuner_parse_algos("pairwise"), 1u << ALGO_PAIRWISE);
  assert_int_equal(tuner_parse_algos("hier"), 1u << ALGO_HIER);
  assert_int_equal(tuner_parse_algos("CollnetDirect"), 0);
  assert_int_equal(tuner_parse_algos("Tre"), 0);
}

/* Direct is not a schedule: NCCL_ALGO allows it unless it excludes it or
 * names others only, and forces it (off the gates) only by naming it. */
static void test_algo_direct(void** state) {
  (void)state;
  static const struct {
    const char* value;
    int allows, forces;
  } cases[] = {{NULL, 1, 0},      {"Direct", 1, 1}, {"ring,DIRECT", 1, 1}, {"Ring", 0, 0},
               {"^Direct", 0, 0}, {"^Ring", 1, 0},  {"Directly", 0, 0}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    if (cases[i].value)
      setenv("NCCL_ALGO", cases[i].value, 1);
    else
      unsetenv("NCCL_ALGO");
    param_cache_reset();
    assert_int_equal(tuner_allows_direct(), cases[i].allows);
    assert_int_equal(tuner_forces_direct(), cases[i].forces);
  }
  unsetenv("NCCL_ALGO");
  param_cache_reset();
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
                              "link net Ring 1 0x\n",   "force AllReduce 2K 1K Ring\n",
                              "reduce -0.1\n",          "reduce\n",
                              "reduce 0.1 0.2\n",       "reduce nan\n"};
  assert_int_equal(
      tune_text("link intra Ring 1.5 0.02 # ok\nlink net all 0 1e-3\nreduce 0.137\n", &m),
      ncclSuccess);
  assert_true(m.intra.alpha_us[ALGO_RING] == 1.5 && m.net.beta_us_per_kb[ALGO_HIER] == 1e-3);
  assert_true(m.reduce_us_per_kb == 0.137);
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

/* ---- the parameter table and docs/environment.md ---- */

/* The page that documents every variable of the table. */
#define ENV_DOC "docs/environment.md"

/* ENV_DOC from the source tree: __FILE__ is this file's path as the
 * Makefile passed it, relative to the directory make ran in. */
static void env_doc_path(char* buf, size_t len) {
  const char* me = __FILE__;
  const char* tail = strstr(me, "tests/unit/test_params.c");
  snprintf(buf, len, "%.*s" ENV_DOC, tail ? (int)(tail - me) : 0, me);
}

struct doc_row {
  char name[64];
  char dflt[128];
  int line;
};

/* Copy a table cell without its backticks and surrounding blanks. */
static void cell_copy(char* out, size_t len, const char* cell, size_t n) {
  size_t o = 0;
  while (n > 0 && (*cell == ' ')) cell++, n--;
  while (n > 0 && cell[n - 1] == ' ') n--;
  for (size_t i = 0; i < n && o + 1 < len; i++)
    if (cell[i] != '`') out[o++] = cell[i];
  out[o] = '\0';
}

/* The rows of ENV_DOC's tables (the page is about the environment alone) whose
 * first cell names an NCCL_ or BRAID_ variable. Returns how many. */
static int env_doc_rows(struct doc_row* rows, int max) {
  char path[512], line[1024];
  env_doc_path(path, sizeof(path));
  FILE* f = fopen(path, "r");
  if (f == NULL) fail_msg("cannot open %s (run from the source tree)", path);
  int n = 0, lineno = 0;
  while (fgets(line, sizeof(line), f)) {
    lineno++;
    if (line[0] != '|') continue;
    const char* c1 = line + 1;
    const char* c2 = strchr(c1, '|');
    const char* c3 = c2 ? strchr(c2 + 1, '|') : NULL;
    if (c3 == NULL) continue;
    struct doc_row r = {.line = lineno};
    cell_copy(r.name, sizeof(r.name), c1, (size_t)(c2 - c1));
    cell_copy(r.dflt, sizeof(r.dflt), c2 + 1, (size_t)(c3 - c2 - 1));
    if (strncmp(r.name, "NCCL_", 5) != 0 && strncmp(r.name, "BRAID_", 6) != 0) continue;
    assert_true(n < max);
    rows[n++] = r;
  }
  fclose(f);
  return n;
}

/* What ENV_DOC's default column must say for a row. */
static int row_default_matches(const struct param_row* p, const char* text) {
  if (p->type == PARAM_INT) {
    int64_t v;
    return param_parse_int(text, &v) == 0 && v == p->dflt;
  }
  return strcmp(text, p->dflt_str ? p->dflt_str : p->shown) == 0;
}

/* Both ways: every row is in ENV_DOC with its default, and every variable
 * ENV_DOC lists is a row. All disagreements are printed before failing. */
static void test_table_matches_env_doc(void** state) {
  (void)state;
  struct doc_row doc[128];
  int ndoc = env_doc_rows(doc, 128), nrows, bad = 0;
  const struct param_row* rows = param_rows(&nrows);
  assert_true(ndoc > 0);
  for (int i = 0; i < nrows; i++) {
    int found = 0;
    for (int j = 0; j < ndoc; j++) {
      if (strcmp(doc[j].name, rows[i].name) != 0) continue;
      found++;
      if (!row_default_matches(&rows[i], doc[j].dflt)) {
        if (rows[i].type == PARAM_INT)
          print_error(ENV_DOC ":%d: %s default \"%s\", the table's is %lld\n", doc[j].line,
                      rows[i].name, doc[j].dflt, (long long)rows[i].dflt);
        else
          print_error(ENV_DOC ":%d: %s default \"%s\", the table's is \"%s\"\n", doc[j].line,
                      rows[i].name, doc[j].dflt,
                      rows[i].dflt_str ? rows[i].dflt_str : rows[i].shown);
        bad++;
      }
    }
    if (found != 1) {
      print_error(ENV_DOC ": %s is listed %d times, once expected\n", rows[i].name, found);
      bad++;
    }
  }
  for (int j = 0; j < ndoc; j++) {
    int found = 0;
    for (int i = 0; i < nrows && !found; i++) found = strcmp(doc[j].name, rows[i].name) == 0;
    if (!found) {
      print_error(ENV_DOC ":%d: %s is not a row of common/param_table.h\n", doc[j].line,
                  doc[j].name);
      bad++;
    }
  }
  assert_int_equal(bad, 0);
}

/* Rows are well formed: defaults inside their ranges, shown text for every
 * string without a default value, and the logger's default mask the same
 * whether it comes from the row or from the parser's own fallback. */
static void test_table_rows(void** state) {
  (void)state;
  int n;
  const struct param_row* rows = param_rows(&n);
  for (int i = 0; i < n; i++) {
    const struct param_row* r = &rows[i];
    assert_true(strncmp(r->name, "NCCL_", 5) == 0 || strncmp(r->name, "BRAID_", 6) == 0);
    assert_non_null(r->doc);
    if (r->type == PARAM_INT) {
      assert_true(r->lo <= r->hi);
      assert_true((r->dflt >= r->lo && r->dflt <= r->hi) ||
                  (r->dflt == 0 && (r->flags & PARAM_ZERO_OFF)));
    } else {
      assert_true(r->dflt_str != NULL || r->shown != NULL);
    }
    for (int j = 0; j < i; j++) assert_string_not_equal(r->name, rows[j].name);
    if (strcmp(r->name, "NCCL_DEBUG_SUBSYS") == 0)
      assert_int_equal(debug_parse_subsys(r->dflt_str), debug_parse_subsys(NULL));
  }
}

/* A getter reads its variable once: later changes are not seen until the
 * cache is reset (as in a fresh process). Clamping and the ZERO_OFF rule
 * apply to rows as they did to the old getters. */
static void test_getters_cached(void** state) {
  (void)state;
  setenv("BRAID_NSTEPS", "8", 1);
  setenv("NCCL_ALGO", "Ring", 1);
  param_cache_reset();
  assert_int_equal(param_nsteps(), 8);
  assert_string_equal(param_algo(), "Ring");
  setenv("BRAID_NSTEPS", "12", 1);
  setenv("NCCL_ALGO", "Tree", 1);
  assert_int_equal(param_nsteps(), 8);
  assert_string_equal(param_algo(), "Ring");
  param_cache_reset();
  assert_int_equal(param_nsteps(), 12);
  assert_string_equal(param_algo(), "Tree");
  setenv("BRAID_NSTEPS", "1000", 1);  /* clamped to 32 */
  setenv("BRAID_SOCKET_BUF", "0", 1); /* 0 stays off */
  unsetenv("NCCL_ALGO");
  setenv("NCCL_DEBUG_SUBSYS", "", 1); /* empty reads as unset: the default */
  param_cache_reset();
  assert_int_equal(param_nsteps(), 32);
  assert_int_equal(param_sock_buf(), 0);
  assert_null(param_algo());
  assert_string_equal(param_debug_subsys(), "INIT,BOOTSTRAP,ENV");
  setenv("BRAID_SOCKET_BUF", "1", 1); /* 1 byte: clamped up to 64K */
  param_cache_reset();
  assert_int_equal(param_sock_buf(), 64 * 1024);
  unsetenv("BRAID_NSTEPS");
  unsetenv("BRAID_SOCKET_BUF");
  unsetenv("NCCL_DEBUG_SUBSYS");
  param_cache_reset();
}

#define LOG_CHILD_ARG "--log-child"

/* In a fresh process (exec'ed, so logging is set up from this environment):
 * read two knobs twice each; the log must say each was set, once. */
static int log_child(void) {
  int bad = 0;
  for (int i = 0; i < 2; i++) {
    const char* ifname = param_socket_ifname();
    bad += ifname == NULL || strcmp(ifname, "lo") != 0;
    bad += param_chunk_size() != 128 * 1024;
  }
  return bad;
}

static int count_lines(const char* path, const char* needle) {
  char line[1024];
  int n = 0;
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  while (fgets(line, sizeof(line), f))
    if (strstr(line, needle)) n++;
  fclose(f);
  return n;
}

/* Runs log_child in a fresh process that logs to NCCL_DEBUG_FILE=path. */
static void run_log_child(const char* path) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv("NCCL_DEBUG", "INFO", 1);
    setenv("NCCL_DEBUG_SUBSYS", "ENV", 1);
    setenv("NCCL_DEBUG_FILE", path, 1);
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    setenv("BRAID_CHUNK_SIZE", "128K", 1);
    execl("/proc/self/exe", "test_params", LOG_CHILD_ARG, (char*)NULL);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
}

/* What a file holds, up to cap - 1 bytes ("" when it cannot be read). */
static void file_text(const char* path, char* out, size_t cap) {
  FILE* f = fopen(path, "r");
  size_t n = f ? fread(out, 1, cap - 1, f) : 0;
  out[n] = '\0';
  if (f) fclose(f);
}

/* NCCL_DEBUG_FILE names a path a stranger could predict (/tmp/nccl.%p): a
 * link another user planted there, or a file of another user's, is never
 * written through; the log stays on stdout. /dev/stderr (root's link to a
 * pipe or terminal) still works. */
static void test_debug_file_not_followed(void** state) {
  (void)state;
  char target[128], link[128], theirs[128], got[64];
  snprintf(target, sizeof(target), "/tmp/braid_test_params.%d.target", (int)getpid());
  snprintf(link, sizeof(link), "/tmp/braid_test_params.%d.link", (int)getpid());
  snprintf(theirs, sizeof(theirs), "/tmp/braid_test_params.%d.theirs", (int)getpid());
  FILE* f = fopen(target, "w");
  assert_non_null(f);
  fputs("keep", f);
  fclose(f);
  assert_int_equal(symlink(target, link), 0);
  assert_int_equal(lchown(link, 65534, 65534), 0); /* the tests run as root: nobody's link */
  run_log_child(link);
  file_text(target, got, sizeof(got));
  assert_string_equal(got, "keep");
  assert_int_equal(rename(target, theirs), 0);
  assert_int_equal(chown(theirs, 65534, 65534), 0);
  run_log_child(theirs);
  file_text(theirs, got, sizeof(got));
  assert_string_equal(got, "keep");
  unlink(link);
  unlink(theirs);
}

static void test_logged_once(void** state) {
  (void)state;
  char path[128], want[256];
  snprintf(path, sizeof(path), "/tmp/braid_test_params.%d.log", (int)getpid());
  run_log_child(path);
  assert_int_equal(count_lines(path, "NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo"), 1);
  assert_int_equal(count_lines(path, "NCCL INFO BRAID_CHUNK_SIZE set by environment to 128K"), 1);
  /* the logger's own settings, read before logging existed, are logged too */
  assert_int_equal(count_lines(path, "NCCL INFO NCCL_DEBUG set by environment to INFO"), 1);
  snprintf(want, sizeof(want), "NCCL INFO NCCL_DEBUG_FILE set by environment to %s", path);
  assert_int_equal(count_lines(path, want), 1);
  unlink(path);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], LOG_CHILD_ARG) == 0) return log_child();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse_int),         cmocka_unit_test(test_read_int_falls_back),
      cmocka_unit_test(test_read_range_clamps), cmocka_unit_test(test_debug_level),
      cmocka_unit_test(test_debug_subsys),      cmocka_unit_test(test_ifname_rules),
      cmocka_unit_test(test_hostport),          cmocka_unit_test(test_wire_roundtrip),
      cmocka_unit_test(test_algo_list),         cmocka_unit_test(test_algo_direct),
      cmocka_unit_test(test_tune_file_lines),   cmocka_unit_test(test_table_matches_env_doc),
      cmocka_unit_test(test_table_rows),        cmocka_unit_test(test_getters_cached),
      cmocka_unit_test(test_logged_once),       cmocka_unit_test(test_debug_file_not_followed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
