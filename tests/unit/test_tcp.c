/*
 * The TCP transport between two ranks of one process on loopback: the
 * collective channel's duplex link (who dials, both directions at once over
 * the same sockets, closing each socket exactly once, shutdown reaching
 * both directions) and the point-to-point channel's one-way connections.
 * Everything is non-blocking after connect, so one thread drives both.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "core.h"
#include "socket.h"
#include "tcp/tcp.h"
#include "tcp/tcp_connect.h"
#include "transport.h"
#include "transport_table.h"

#define DEADLINE_MS 20000
#define NRANKS 2
#define MAX_MSGS 8

struct rank_side {
  struct transport_ctx ctx;
  struct transport_waits waits;
  _Atomic int aborted;
  struct transport_conn* send;
  struct transport_conn* recv;
};

static struct peer_info g_peers[NRANKS];
static struct rank_side g_side[NRANKS];

static int open_fds(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  while (readdir(d) != NULL) n++;
  closedir(d);
  return n;
}

static int setup(void** state) {
  (void)state;
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_NSOCKS_PERTHREAD", "2", 1);
  memset(g_side, 0, sizeof(g_side));
  memset(g_peers, 0, sizeof(g_peers));
  for (int r = 0; r < NRANKS; r++) {
    struct rank_side* s = &g_side[r];
    union socket_addr addr;
    if (socket_local_addr(&addr, NULL, 0) != ncclSuccess) return -1;
    addr.sin.sin_port = 0;
    if (socket_listen(&addr, &s->ctx.listen_fd) != ncclSuccess) return -1;
    struct tcp_blob* b = transport_blob_put(&g_peers[r], &tcp_transport);
    socket_addr_to_wire(&addr, &b->listen);
    g_peers[r].rank = r;
    s->ctx.rank = r;
    s->ctx.nranks = NRANKS;
    s->ctx.secret = 0x5eed;
    s->ctx.peers = g_peers;
    s->ctx.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    s->ctx.timeout_ms = DEADLINE_MS;
    s->ctx.aborted = &s->aborted;
    s->ctx.waits = &s->waits;
  }
  return 0;
}

static int teardown(void** state) {
  (void)state;
  for (int r = 0; r < NRANKS; r++) {
    struct rank_side* s = &g_side[r];
    if (s->send) s->send->ops->close(s->send);
    if (s->recv) s->recv->ops->close(s->recv);
    transport_accept_free(&s->ctx);
    close(s->ctx.listen_fd);
    close(s->ctx.epoll_fd);
  }
  return 0;
}

/* Both ranks through connect.c's two phases: every send phase, then every
 * receive phase. */
static void connect_duplex_pair(void) {
  for (int phase_send = 1; phase_send >= 0; phase_send--)
    for (int r = 0; r < NRANKS; r++) {
      struct rank_side* s = &g_side[r];
      struct transport_conn *snd = NULL, *rcv = NULL;
      assert_int_equal(tcp_transport.connect_duplex(&s->ctx, 1 - r, 0, phase_send, &snd, &rcv),
                       ncclSuccess);
      /* The lower rank makes both in its send phase, the higher in its
       * receive phase; the other call makes nothing. */
      int turn = (r == 0) == phase_send;
      assert_true(turn ? snd != NULL && rcv != NULL : snd == NULL && rcv == NULL);
      if (turn) {
        assert_int_equal(snd->is_send, 1);
        assert_int_equal(rcv->is_send, 0);
        assert_int_equal(snd->peer, 1 - r);
        s->send = snd, s->recv = rcv;
      }
    }
}

static void fill(unsigned char* b, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

/* Drive every connection until all posted messages completed; a
 * connection error or the deadline fails the test. */
static void drive_all(void) {
  uint64_t deadline = braid_now_ns() + (uint64_t)DEADLINE_MS * 1000000ull;
  for (;;) {
    int busy = 0;
    for (int r = 0; r < NRANKS; r++) {
      struct transport_conn* cs[2] = {g_side[r].send, g_side[r].recv};
      for (int k = 0; k < 2; k++) {
        int progressed = 0;
        if (cs[k] == NULL) continue;
        assert_int_equal(cs[k]->ops->progress(cs[k], &progressed), ncclSuccess);
        busy |= cs[k]->completed < cs[k]->posted;
      }
    }
    if (!busy) return;
    assert_true(braid_now_ns() < deadline);
  }
}

/* One message of `bytes` from rank `from` to the other rank, checked. */
static void send_one(int from, size_t bytes, unsigned seed) {
  struct transport_conn *snd = g_side[from].send, *rcv = g_side[1 - from].recv;
  unsigned char* out = malloc(bytes);
  unsigned char* in = malloc(bytes);
  assert_non_null(out);
  assert_non_null(in);
  fill(out, bytes, seed);
  assert_int_equal(transport_post_host(snd, out, bytes, NULL), ncclSuccess);
  assert_int_equal(transport_post_host(rcv, in, bytes, NULL), ncclSuccess);
  drive_all();
  assert_memory_equal(in, out, bytes);
  free(out);
  free(in);
}

/* Each rank sends `n` messages of the given sizes to the other while it
 * receives the other's: both directions of every socket carry data at
 * once. Small messages rotate over the sockets, large ones are striped. */
static void exchange(const size_t* sizes, int n) {
  unsigned char* out[NRANKS][MAX_MSGS];
  unsigned char* in[NRANKS][MAX_MSGS];
  for (int r = 0; r < NRANKS; r++)
    for (int i = 0; i < n; i++) {
      out[r][i] = malloc(sizes[i] + 1);
      in[r][i] = malloc(sizes[i] + 1);
      assert_non_null(out[r][i]);
      assert_non_null(in[r][i]);
      fill(out[r][i], sizes[i], (unsigned)(r * MAX_MSGS + i));
      memset(in[r][i], 0xEE, sizes[i] + 1);
      assert_int_equal(transport_post_host(g_side[r].send, out[r][i], sizes[i], NULL), ncclSuccess);
      assert_int_equal(transport_post_host(g_side[r].recv, in[r][i], sizes[i], NULL), ncclSuccess);
    }
  drive_all();
  for (int r = 0; r < NRANKS; r++)
    for (int i = 0; i < n; i++) {
      assert_memory_equal(in[r][i], out[1 - r][i], sizes[i]);
      assert_int_equal(in[r][i][sizes[i]], 0xEE); /* nothing past the message */
    }
  for (int r = 0; r < NRANKS; r++)
    for (int i = 0; i < n; i++) free(out[r][i]), free(in[r][i]);
}

static void test_duplex_both_ways_at_once(void** state) {
  (void)state;
  size_t sizes[] = {8, 1, 4096, 300000, 64 * 1024, 3, 2 * 1024 * 1024 + 5, 0};
  connect_duplex_pair();
  exchange(sizes, 8);
  exchange(sizes + 3, 2); /* the streams stay aligned for later messages */
}

/* One set of sockets serves both directions: the pair costs each rank as
 * many descriptors as sockets, and each is closed exactly once. With the
 * 0 -> 1 direction closed on both ranks, 1 -> 0 still moves data. */
static void test_duplex_shares_and_closes_once(void** state) {
  (void)state;
  int before = open_fds();
  connect_duplex_pair();
  int per_rank = (open_fds() - before) / NRANKS;
  assert_int_equal(per_rank, 2); /* NCCL_NSOCKS_PERTHREAD=2 */
  g_side[0].send->ops->close(g_side[0].send);
  g_side[1].recv->ops->close(g_side[1].recv);
  g_side[0].send = g_side[1].recv = NULL;
  assert_int_equal(open_fds() - before, NRANKS * per_rank);
  send_one(1, 3000, 5);
  g_side[1].send->ops->close(g_side[1].send);
  g_side[0].recv->ops->close(g_side[0].recv);
  g_side[1].send = g_side[0].recv = NULL;
  assert_int_equal(open_fds(), before);
}

/* Shutting one direction down ends the link: the peer's receive sees the
 * end of the stream instead of waiting. */
static void test_duplex_shutdown_reaches_peer(void** state) {
  (void)state;
  unsigned char buf[64];
  connect_duplex_pair();
  g_side[0].send->ops->shutdown(g_side[0].send);
  assert_int_equal(transport_post_host(g_side[1].recv, buf, sizeof(buf), NULL), ncclSuccess);
  uint64_t deadline = braid_now_ns() + (uint64_t)DEADLINE_MS * 1000000ull;
  ncclResult_t res = ncclSuccess;
  while (res == ncclSuccess && braid_now_ns() < deadline) {
    int progressed = 0;
    res = g_side[1].recv->ops->progress(g_side[1].recv, &progressed);
  }
  assert_int_equal(res, ncclRemoteError);
}

/* Point-to-point keeps one connection per direction: rank 0 sends to rank
 * 1 without rank 1 ever sending back. */
static void test_p2p_one_way(void** state) {
  (void)state;
  assert_int_equal(tcp_transport.connect_send(&g_side[0].ctx, 1, 1, &g_side[0].send), ncclSuccess);
  assert_int_equal(tcp_transport.connect_recv(&g_side[1].ctx, 0, 1, &g_side[1].recv), ncclSuccess);
  send_one(0, 5000, 9);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_duplex_both_ways_at_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_duplex_shares_and_closes_once, setup, teardown),
      cmocka_unit_test_setup_teardown(test_duplex_shutdown_reaches_peer, setup, teardown),
      cmocka_unit_test_setup_teardown(test_p2p_one_way, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
