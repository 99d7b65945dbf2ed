/*
 * The progress engine's bell: a thread blocked on shared memory and on
 * sockets at once sleeps in epoll, and its shared-memory peer wakes it
 * through the engine's bell pipe instead of leaving it to a nap. Both ranks
 * live in this process (the transport only needs a pid and the peer table);
 * a helper thread plays the sleeper.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "progress.h"
#include "shm/shm_names.h"
#include "transport.h"

/* A wake that never comes fails the test after this long instead of
 * hanging it; the sleeper itself would sleep far longer. */
#define DEADLINE_S 60
#define SLEEP_MS (10 * 60 * 1000)

enum { SENDER = 0, RECEIVER = 1 };

struct rank_side {
  struct progress engine;
  struct transport_ctx ctx;
  struct transport_waits waits;
  _Atomic int aborted;
  struct transport_conn* conn;
};

static struct peer_info g_peers[2];
static struct rank_side g_side[2];

struct sleeper {
  struct rank_side* side;
  ncclResult_t res;
  _Atomic int done;
};

static int setup(void** state) {
  (void)state;
  memset(g_side, 0, sizeof(g_side));
  memset(g_peers, 0, sizeof(g_peers));
  for (int r = 0; r < 2; r++) {
    struct rank_side* s = &g_side[r];
    if (progress_init(&s->engine) != ncclSuccess) return -1;
    g_peers[r] = (struct peer_info){.rank = r,
                                    .pid = (int32_t)getpid(),
                                    .host_hash = 1,
                                    .bell_fd = s->engine.bell_fd[0],
                                    .bell_ino = s->engine.bell_ino};
    *(struct shm_blob*)transport_blob_in(&g_peers[r], TRANSPORT_SHM) =
        (struct shm_blob){.domain = 1, .tag = 0xb0b0 + (uint64_t)r};
    s->ctx = (struct transport_ctx){.rank = r,
                                    .nranks = 2,
                                    .secret = 0xbe11,
                                    .peers = g_peers,
                                    .listen_fd = -1,
                                    .epoll_fd = s->engine.epoll_fd,
                                    .timeout_ms = DEADLINE_S * 1000,
                                    .aborted = &s->aborted,
                                    .waits = &s->waits};
  }
  return 0;
}

static int teardown(void** state) {
  (void)state;
  /* the receiver first: a sender's close waits for what it sent to be
   * taken, or for the receiver to close */
  for (int r = 1; r >= 0; r--) {
    if (g_side[r].conn) g_side[r].conn->ops->close(g_side[r].conn);
    progress_destroy(&g_side[r].engine);
  }
  return 0;
}

static void connect_pair(void) {
  assert_int_equal(
      shm_transport.connect_send(&g_side[SENDER].ctx, RECEIVER, 0, &g_side[SENDER].conn),
      ncclSuccess);
  assert_int_equal(
      shm_transport.connect_recv(&g_side[RECEIVER].ctx, SENDER, 0, &g_side[RECEIVER].conn),
      ncclSuccess);
}

/* Receive posted, nothing sent: progress until the connection says it is
 * blocked, as the engine's pass does; then count a socket as blocked too,
 * so that the wait takes the epoll path. */
static void receiver_block(char* buf, size_t bytes) {
  struct rank_side* s = &g_side[RECEIVER];
  assert_int_equal(transport_post_host(s->conn, buf, bytes, NULL), ncclSuccess);
  for (int i = 0; i < 8 && s->waits.nfutex == 0; i++) {
    int progressed = 0;
    progress_pass_begin(&s->engine, &s->waits);
    assert_int_equal(s->conn->ops->progress(s->conn, &progressed), ncclSuccess);
  }
  assert_int_equal(s->waits.nfutex, 1);
  s->waits.nfd = 1;
}

static void* sleeper_main(void* arg) {
  struct sleeper* z = arg;
  struct progress* engines[1] = {&z->side->engine};
  struct transport_waits* waits[1] = {&z->side->waits};
  z->res = progress_wait(engines, waits, 1, SLEEP_MS);
  atomic_store(&z->done, 1);
  return NULL;
}

static void sender_send(const char* buf, size_t bytes) {
  struct rank_side* s = &g_side[SENDER];
  assert_int_equal(transport_post_host(s->conn, (void*)buf, bytes, NULL), ncclSuccess);
  while (s->conn->completed < s->conn->posted) {
    int progressed = 0;
    assert_int_equal(s->conn->ops->progress(s->conn, &progressed), ncclSuccess);
  }
}

static void sleeper_join(pthread_t t, struct sleeper* z) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += DEADLINE_S;
  int rc = pthread_timedjoin_np(t, NULL, &until);
  if (rc != 0) { /* never woken: a lost wake-up */
    pthread_cancel(t);
    pthread_join(t, NULL);
  }
  assert_int_equal(rc, 0);
  assert_int_equal(z->res, ncclSuccess);
}

/* The sleeper asks the sender to ring (fd_sleepers goes up), the sender's
 * next move writes to the pipe, the sleeper wakes long before its timeout,
 * drains the pipe and lowers its count again. */
static void test_peer_rings_epoll_sleeper(void** state) {
  (void)state;
  char out[4000], in[4000];
  memset(out, 0x5a, sizeof(out));
  connect_pair();
  receiver_block(in, sizeof(in));
  _Atomic uint32_t* fd_sleepers = g_side[RECEIVER].waits.futex[0].fd_sleepers;
  assert_non_null(fd_sleepers); /* the sender opened our bell */
  struct sleeper z = {.side = &g_side[RECEIVER]};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, sleeper_main, &z), 0);
  while (atomic_load(fd_sleepers) == 0 && !atomic_load(&z.done)) sched_yield();
  sender_send(out, sizeof(out));
  sleeper_join(t, &z);
  assert_int_equal(atomic_load(fd_sleepers), 0);
  char b;
  assert_int_equal(read(g_side[RECEIVER].engine.bell_fd[0], &b, 1), -1); /* drained */
  assert_int_equal(errno, EAGAIN);
  int progressed = 0;
  while (g_side[RECEIVER].conn->completed < g_side[RECEIVER].conn->posted)
    assert_int_equal(g_side[RECEIVER].conn->ops->progress(g_side[RECEIVER].conn, &progressed),
                     ncclSuccess);
  assert_memory_equal(in, out, sizeof(out));
}

/* A bell the sender cannot open (the inode names another pipe): the
 * receiver's wait says so, and the sleeper naps and looks again instead
 * of sleeping through the sender's move. */
static void test_unopenable_bell_naps(void** state) {
  (void)state;
  char out[100], in[100];
  memset(out, 0x3c, sizeof(out));
  g_peers[RECEIVER].bell_ino++;
  connect_pair();
  receiver_block(in, sizeof(in));
  assert_null(g_side[RECEIVER].waits.futex[0].fd_sleepers);
  sender_send(out, sizeof(out));
  struct sleeper z = {.side = &g_side[RECEIVER]};
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, sleeper_main, &z), 0);
  sleeper_join(t, &z);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_peer_rings_epoll_sleeper, setup, teardown),
      cmocka_unit_test_setup_teardown(test_unopenable_bell_naps, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
