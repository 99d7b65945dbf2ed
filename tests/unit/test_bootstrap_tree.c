/*
 * The bootstrap at scale (src/bootstrap/bootstrap_relay.h): blocks of ranks per
 * root, the relay tree, whole exchanges of hundreds of ranks as threads
 * against one or several real roots with what each side sent counted, and
 * the relay against strangers, a forged table and a parent that never
 * comes.
 *
 * `test_bootstrap_tree --sweep [fanout]` prints the message and byte
 * counts per rank as N grows (perf/bootstrap_scale.sh).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_relay.h"
#include "bootstrap/bootstrap_root.h"
#include "core.h"
#include "param.h"
#include "socket.h"

#define MAX_ROOTS 8

/* ---- blocks and the tree ---- */

static void test_blocks(void** state) {
  (void)state;
  for (int n = 1; n <= 300; n++)
    for (int roots = 1; roots <= n && roots <= 17; roots++) {
      int next = 0;
      for (int b = 0; b < roots; b++) {
        int first = bootstrap_block_first(b, n, roots), size = bootstrap_block_size(b, n, roots);
        assert_int_equal(first, next); /* contiguous, in order */
        assert_true(size == n / roots || size == n / roots + 1);
        for (int r = first; r < first + size; r++)
          assert_int_equal(bootstrap_block_of(r, n, roots), b);
        next = first + size;
      }
      assert_int_equal(next, n);
    }
}

/* Every position has one parent, the parent lists it as a child, and the
 * depth is the logarithm's. */
static void test_tree(void** state) {
  (void)state;
  for (int fanout = 1; fanout <= 9; fanout++)
    for (int size = 1; size <= 400; size++) {
      int depth_max = 0;
      for (int j = 0; j < size; j++) {
        int depth = 0;
        for (int k = j; k >= 0; k = relay_parent(k, fanout)) {
          int p = relay_parent(k, fanout);
          if (p >= 0) {
            int c = relay_first_child(p, fanout);
            assert_true(k >= c && k < c + fanout && p < k);
          } else {
            assert_true(k < fanout);
          }
          depth++;
        }
        depth_max = depth > depth_max ? depth : depth_max;
      }
      long reach = 0, level = 1; /* positions within depth_max - 1 levels */
      for (int d = 0; d < depth_max - 1; d++) level *= fanout, reach += level;
      assert_true(fanout == 1 || reach < size); /* the tree is as shallow as it can be */
    }
}

/* ---- whole exchanges, ranks as threads ---- */

struct job {
  int nranks, nroots;
  struct bootstrap_ids ids[MAX_ROOTS]; /* per block */
  struct bootstrap_root* roots[MAX_ROOTS];
  struct bootstrap_counts root_counts[MAX_ROOTS];
};

struct rank_arg {
  struct job* job;
  int rank, ctrl_fd;
  struct peer_info* all;
  uint64_t secret;
  struct bootstrap_counts counts;
  ncclResult_t res;
};

static void loopback(union socket_addr* a) {
  memset(a, 0, sizeof(*a));
  a->sin.sin_family = AF_INET;
  a->sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
}

static void* rank_main(void* p) {
  struct rank_arg* a = p;
  const struct job* job = a->job;
  union socket_addr ctrl;
  struct peer_info mine = {.rank = a->rank, .pid = 1000 + a->rank};
  loopback(&ctrl);
  a->res = socket_listen(&ctrl, &a->ctrl_fd);
  if (a->res != ncclSuccess) return NULL;
  socket_addr_to_wire(&ctrl, &mine.ctrl);
  int block = bootstrap_block_of(a->rank, job->nranks, job->nroots);
  a->res = bootstrap_exchange(&job->ids[block], a->rank, job->nranks, &mine, a->all, &a->secret,
                              a->ctrl_fd, socket_deadline(60000), NULL, &a->counts);
  return NULL;
}

static void job_start_roots(struct job* job) {
  for (int b = 0; b < job->nroots; b++) {
    union socket_addr addr;
    struct bootstrap_id id = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION, 0x5eed0000ull + (uint64_t)b, {0}};
    loopback(&addr);
    assert_int_equal(bootstrap_root_start(&addr, id.key, 0, &job->roots[b], NULL), ncclSuccess);
    socket_addr_to_wire(&addr, &id.root);
    job->ids[b].mine = id;
    job->ids[b].nroots = job->nroots;
  }
  for (int b = 0; b < job->nroots; b++) job->ids[b].first = job->ids[0].mine;
}

/* Run the job: every rank must end with every entry and one secret. */
static struct rank_arg* job_run(struct job* job) {
  int n = job->nranks;
  struct rank_arg* a = calloc((size_t)n, sizeof(*a));
  pthread_t* t = calloc((size_t)n, sizeof(*t));
  assert_non_null(a);
  assert_non_null(t);
  job_start_roots(job);
  for (int r = 0; r < n; r++) {
    a[r] = (struct rank_arg){.job = job, .rank = r, .ctrl_fd = -1};
    a[r].all = calloc((size_t)n, sizeof(struct peer_info));
    assert_int_equal(pthread_create(&t[r], NULL, rank_main, &a[r]), 0);
  }
  for (int r = 0; r < n; r++) pthread_join(t[r], NULL);
  for (int b = 0; b < job->nroots; b++) bootstrap_root_wait(job->roots[b], &job->root_counts[b]);
  for (int r = 0; r < n; r++) {
    assert_int_equal(a[r].res, ncclSuccess);
    assert_true(a[r].secret == a[0].secret);
    for (int i = 0; i < n; i++) assert_int_equal(a[r].all[i].pid, 1000 + i);
  }
  free(t);
  return a;
}

static void job_free(struct job* job, struct rank_arg* a) {
  for (int r = 0; r < job->nranks; r++) {
    if (a[r].ctrl_fd >= 0) close(a[r].ctrl_fd);
    free(a[r].all);
  }
  free(a);
}

static void set_fanout(int fanout) {
  char buf[16];
  snprintf(buf, sizeof(buf), "%d", fanout);
  setenv("BRAID_BOOTSTRAP_FANOUT", buf, 1);
  param_cache_reset();
}

/* No rank sends the table more than fanout times; no root more than
 * fanout times, plus once per other root for root 0. */
static void check_counts(const struct job* job, const struct rank_arg* a, int fanout) {
  size_t table = sizeof(struct peer_info) * (size_t)job->nranks;
  for (int r = 0; r < job->nranks; r++) {
    assert_true(a[r].counts.msgs_out <= 1 + (uint64_t)fanout);
    assert_true(a[r].counts.bytes_out <=
                sizeof(struct root_hello) +
                    (uint64_t)fanout * (sizeof(struct relay_header) + table));
    int block = bootstrap_block_of(r, job->nranks, job->nroots);
    int j = r - bootstrap_block_first(block, job->nranks, job->nroots);
    assert_int_equal(a[r].counts.msgs_in, j < fanout ? 1 : 2); /* the reply; a relay */
  }
  for (int b = 0; b < job->nroots; b++) {
    uint64_t tables = (uint64_t)fanout + (b == 0 ? (uint64_t)job->nroots - 1 : 1);
    int size = bootstrap_block_size(b, job->nranks, job->nroots);
    assert_true(job->root_counts[b].bytes_out <=
                tables * table + (uint64_t)(size + job->nroots) * sizeof(struct root_reply) +
                    sizeof(struct root_hello));
  }
}

static void run_job(int nranks, int nroots, int fanout) {
  struct job job = {.nranks = nranks, .nroots = nroots};
  set_fanout(fanout);
  struct rank_arg* a = job_run(&job);
  check_counts(&job, a, fanout);
  job_free(&job, a);
}

static void test_exchange(void** state) {
  (void)state;
  run_job(1, 1, 8);
  run_job(5, 1, 1); /* a chain */
  run_job(33, 1, 2);
  run_job(200, 1, 8);
  run_job(7, 3, 2);
  run_job(129, 4, 4);
  unsetenv("BRAID_BOOTSTRAP_FANOUT");
  param_cache_reset();
}

/* ---- the relay against what a stranger or a broken parent does ---- */

/* Rank 0 relays to rank 3 (fanout 3 in a block of 4: its one child). */
#define RELAY_FANOUT 3
#define RELAY_SECRET 0xfeedface12345678ull

struct relay_case {
  int child_fd; /* rank 3's listener */
  int mitm_fd;  /* a listener in the middle, or -1 */
  struct peer_info all[4];
};

static int listen_loopback(struct socket_wire_addr* wire) {
  union socket_addr a;
  int fd = -1;
  loopback(&a);
  assert_int_equal(socket_listen(&a, &fd), ncclSuccess);
  socket_addr_to_wire(&a, wire);
  return fd;
}

static int connect_wire(const struct socket_wire_addr* wire) {
  union socket_addr a;
  int fd = -1;
  if (socket_addr_from_wire(wire, &a) != 0) return -1;
  if (socket_connect(&a, socket_deadline(5000), NULL, &fd) != ncclSuccess) return -1;
  return fd;
}

static void relay_case_init(struct relay_case* c, int mitm) {
  struct socket_wire_addr child;
  memset(c, 0, sizeof(*c));
  for (int r = 0; r < 4; r++) c->all[r] = (struct peer_info){.rank = r, .pid = 77 + r};
  c->child_fd = listen_loopback(&child);
  c->mitm_fd = mitm ? listen_loopback(&c->all[3].ctrl) : -1;
  if (!mitm) c->all[3].ctrl = child;
}

static void send_junk(int fd, const void* bytes, size_t len) {
  if (fd >= 0 && send(fd, bytes, len, MSG_NOSIGNAL) < 0) { /* refused: what we expect */
  }
}

/* Strangers first - one silent, one with garbage, one with a header that
 * lacks the proof - then rank 0's genuine relay. */
static void* relay_strangers(void* p) {
  struct relay_case* c = p;
  struct socket_wire_addr* to = &c->all[3].ctrl;
  int silent = connect_wire(to), junk = connect_wire(to), liar = connect_wire(to);
  char garbage[sizeof(struct relay_header)];
  struct relay_header forged = {RELAY_MAGIC, BOOTSTRAP_VERSION, 0, 3, 4, 0, 0, 0x1234};
  memset(garbage, 0x5a, sizeof(garbage));
  send_junk(junk, garbage, sizeof(garbage));
  send_junk(liar, &forged, sizeof(forged));
  struct bootstrap_counts counts = {0};
  bootstrap_relay_send(0, 4, c->all, RELAY_SECRET, 0, 4, RELAY_FANOUT, socket_deadline(5000), NULL,
                       &counts);
  usleep(200 * 1000); /* the strangers stay connected while the child reads */
  close(silent), close(junk), close(liar);
  return NULL;
}

/* In the middle: rank 0's relay arrives, one byte of the table is
 * changed, and it goes on to rank 3 under rank 0's header. */
static void* relay_tampered(void* p) {
  struct relay_case* c = p;
  struct bootstrap_counts counts = {0};
  struct relay_header h;
  struct peer_info table[4];
  bootstrap_relay_send(0, 4, c->all, RELAY_SECRET, 0, 4, RELAY_FANOUT, socket_deadline(5000), NULL,
                       &counts);
  int in = accept(c->mitm_fd, NULL, NULL);
  if (in < 0 || socket_recv_all(in, &h, sizeof(h), socket_deadline(5000), NULL) != ncclSuccess ||
      socket_recv_all(in, table, sizeof(table), socket_deadline(5000), NULL) != ncclSuccess)
    return NULL;
  table[2].pid ^= 1;
  union socket_addr a;
  socklen_t len = sizeof(a);
  getsockname(c->child_fd, &a.sa, &len);
  int out = -1;
  if (socket_connect(&a, socket_deadline(5000), NULL, &out) == ncclSuccess) {
    send_junk(out, &h, sizeof(h));
    send_junk(out, table, sizeof(table));
    close(out);
  }
  close(in);
  return NULL;
}

static ncclResult_t relay_run(struct relay_case* c, void* (*sender)(void*), int64_t wait_ms,
                              struct peer_info* got) {
  pthread_t t;
  struct bootstrap_counts counts = {0};
  if (sender) assert_int_equal(pthread_create(&t, NULL, sender, c), 0);
  ncclResult_t res = bootstrap_relay_recv(c->child_fd, 0, 3, 4, RELAY_SECRET, got,
                                          socket_deadline(wait_ms), NULL, &counts);
  if (sender) pthread_join(t, NULL);
  close(c->child_fd);
  if (c->mitm_fd >= 0) close(c->mitm_fd);
  return res;
}

static void test_relay_strangers(void** state) {
  (void)state;
  struct relay_case c;
  struct peer_info got[4];
  relay_case_init(&c, 0);
  assert_int_equal(relay_run(&c, relay_strangers, 10000, got), ncclSuccess);
  assert_memory_equal(got, c.all, sizeof(got));
}

static void test_relay_tampered(void** state) {
  (void)state;
  struct relay_case c;
  struct peer_info got[4];
  relay_case_init(&c, 1);
  assert_int_equal(relay_run(&c, relay_tampered, 10000, got), ncclRemoteError);
}

/* A parent that died before relaying: the child fails at its deadline. */
static void test_relay_parent_never_comes(void** state) {
  (void)state;
  struct relay_case c;
  struct peer_info got[4];
  relay_case_init(&c, 0);
  uint64_t t0 = braid_now_ns();
  assert_int_equal(relay_run(&c, NULL, 300, got), ncclSystemError);
  assert_true(braid_now_ns() - t0 < 5000000000ull);
}

/* ---- the sweep: what a rank and a root send as N grows ---- */

static void sweep_row(int nranks, int nroots, int fanout) {
  struct job job = {.nranks = nranks, .nroots = nroots};
  set_fanout(fanout);
  uint64_t t0 = braid_now_ns();
  struct rank_arg* a = job_run(&job);
  double ms = (double)(braid_now_ns() - t0) / 1e6;
  uint64_t msgs = 0, bytes = 0;
  for (int r = 0; r < nranks; r++) {
    msgs = MAX(msgs, a[r].counts.msgs_out + a[r].counts.msgs_in);
    bytes = MAX(bytes, a[r].counts.bytes_out);
  }
  const struct bootstrap_counts* root = &job.root_counts[0];
  printf("%6d %5d %6d %9llu %12llu %9llu %12llu %9.1f\n", nranks, nroots,
         (int)param_bootstrap_fanout(), /* the knob's, within its bounds */
         (unsigned long long)msgs, (unsigned long long)bytes,
         (unsigned long long)(root->msgs_in + root->msgs_out), (unsigned long long)root->bytes_out,
         ms);
  fflush(stdout);
  job_free(&job, a);
}

static int sweep(int fanout, int nroots) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) rl.rlim_cur = rl.rlim_max, setrlimit(RLIMIT_NOFILE, &rl);
  printf(
      "# per rank: the most messages (in + out) and bytes out of any rank but a root's\n"
      "# root 0: messages (in + out) and bytes out; ms: the whole exchange, threads on loopback\n");
  printf("%6s %5s %6s %9s %12s %9s %12s %9s\n", "ranks", "roots", "fanout", "rank_msgs",
         "rank_bytes", "root_msgs", "root_bytes", "ms");
  for (int n = 8; n <= 2048; n *= 2) sweep_row(n, MIN(nroots, n), fanout >= 0 ? fanout : n);
  return 0;
}

int main(int argc, char** argv) {
  if (argc >= 2 && strcmp(argv[1], "--sweep") == 0)
    return sweep(argc >= 3 ? atoi(argv[2]) : 8, argc >= 4 ? atoi(argv[3]) : 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_blocks),         cmocka_unit_test(test_tree),
      cmocka_unit_test(test_exchange),       cmocka_unit_test(test_relay_strangers),
      cmocka_unit_test(test_relay_tampered), cmocka_unit_test(test_relay_parent_never_comes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
