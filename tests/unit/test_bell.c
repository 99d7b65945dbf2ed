/*
 * The progress engine's bell: a thread blocked on shared memory and on
 * sockets at once sleeps in epoll, and its shared-memory peer wakes it
 * through the engine's bell pipe instead of leaving it to a nap. Both ranks
 * live in this process (tests/common/shm_loop.h); a helper thread plays
 * the sleeper.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "common/shm_loop.h"

/* A wake that never comes fails the test after this long instead of
 * hanging it; the sleeper itself would sleep far longer. */
#define DEADLINE_S 60
#define SLEEP_MS (10 * 60 * 1000)

/* The sleeper asks the sender to ring (fd_sleepers goes up), the sender's
 * next move writes to the pipe, the sleeper wakes long before its timeout,
 * drains the pipe and lowers its count again. */
static void test_peer_rings_epoll_sleeper(void** state) {
  struct shm_loop* L = *state;
  struct shm_loop_side* rx = &L->side[SHM_LOOP_RECEIVER];
  char out[4000], in[4000];
  memset(out, 0x5a, sizeof(out));
  shm_loop_connect(L);
  shm_loop_block_receiver(L, in, sizeof(in), 1);
  _Atomic uint32_t* fd_sleepers = rx->waits.futex[0].fd_sleepers;
  assert_non_null(fd_sleepers); /* the sender opened our bell */
  struct shm_loop_sleeper z;
  shm_loop_sleep(&z, rx, SLEEP_MS);
  while (atomic_load(fd_sleepers) == 0 && !atomic_load(&z.done)) sched_yield();
  shm_loop_send(L, out, sizeof(out));
  shm_loop_wake_join(&z, DEADLINE_S);
  assert_int_equal(atomic_load(fd_sleepers), 0);
  char b;
  assert_int_equal(read(rx->engine.bell_fd[0], &b, 1), -1); /* drained */
  assert_int_equal(errno, EAGAIN);
  shm_loop_drain(L);
  assert_memory_equal(in, out, sizeof(out));
}

/* A bell the sender cannot open (the inode names another pipe): the
 * receiver's wait says so, and the sleeper naps and looks again instead
 * of sleeping through the sender's move. */
static void test_unopenable_bell_naps(void** state) {
  struct shm_loop* L = *state;
  char out[100], in[100];
  memset(out, 0x3c, sizeof(out));
  L->peers[SHM_LOOP_RECEIVER].bell_ino++;
  shm_loop_connect(L);
  shm_loop_block_receiver(L, in, sizeof(in), 1);
  assert_null(L->side[SHM_LOOP_RECEIVER].waits.futex[0].fd_sleepers);
  shm_loop_send(L, out, sizeof(out));
  struct shm_loop_sleeper z;
  shm_loop_sleep(&z, &L->side[SHM_LOOP_RECEIVER], SLEEP_MS);
  shm_loop_wake_join(&z, DEADLINE_S);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_peer_rings_epoll_sleeper, shm_loop_fixture_setup,
                                      shm_loop_fixture_teardown),
      cmocka_unit_test_setup_teardown(test_unopenable_bell_naps, shm_loop_fixture_setup,
                                      shm_loop_fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
