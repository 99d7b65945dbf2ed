/*
 * A faulty shared-memory peer (issue 47): whatever it writes into the
 * segment the two ranks share, or however it dies, the other side gets a
 * remote error naming it, or goes on; never a signal, an internal error or
 * seconds lost per call. Both ranks live in this process
 * (tests/common/shm_loop.h), and the test plays the faulty one by writing
 * the segment itself.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include "common/shm_loop.h"
#include "shm/shm.h"

#define DEADLINE_S 60
#define NAP_SLICE_MS 200 /* the sleeper's slice, as work.c's: what a skipped wake-up costs */

static struct shm_conn* side_conn(struct shm_loop* L, int side) {
  return (struct shm_conn*)L->side[side].conn;
}

/* One progress call of `side`'s connection. */
static ncclResult_t step(struct shm_loop* L, int side) {
  int progressed = 0;
  struct transport_conn* c = L->side[side].conn;
  return c->ops->progress(c, &progressed);
}

/* ---- the peer died asleep in epoll, its count raised ---- */

/* The receiver asked for rings on its bell pipe and "died": nobody reads
 * the pipe any more. The sender's rings must neither raise SIGPIPE (which
 * would kill this process) nor fail its sends. */
static void test_dead_sleepers_bell(void** state) {
  struct shm_loop* L = *state;
  struct shm_loop_side* rx = &L->side[SHM_LOOP_RECEIVER];
  char out[3000], in[3000];
  memset(out, 0x71, sizeof(out));
  shm_loop_connect(L);
  shm_loop_block_receiver(L, in, sizeof(in) / 3, 1);
  _Atomic uint32_t* fd_sleepers = rx->waits.futex[0].fd_sleepers;
  assert_non_null(fd_sleepers);
  atomic_fetch_add(fd_sleepers, 1); /* asleep in epoll... */
  close(rx->engine.bell_fd[0]);     /* ...and gone: the pipe has no reader of its own */
  rx->engine.bell_fd[0] = -1;
  for (int i = 0; i < 3; i++) shm_loop_send(L, out, sizeof(out) / 3);
  atomic_fetch_sub(fd_sleepers, 1);
  shm_loop_drain(L);
  assert_memory_equal(in, out, sizeof(out) / 3);
}

/* ---- the ring's counters and slots written wrongly ---- */

/* The sender's view of a tail the receiver moved where it cannot be. */
static void tail_case(struct shm_loop* L, uint64_t (*bad_tail)(uint64_t head), int in_place) {
  char msg[100] = {1};
  char in[100];
  shm_loop_connect(L);
  shm_loop_send(L, msg, sizeof(msg)); /* head 1 */
  shm_loop_recv(L, in, sizeof(in));   /* tail 1 */
  shm_loop_send(L, msg, sizeof(msg)); /* seen by the sender; head 2 */
  struct shm_conn* tx = side_conn(L, SHM_LOOP_SENDER);
  struct transport_conn* c = &tx->base;
  void* space = in_place ? c->ops->send_space(c, sizeof(msg)) : NULL;
  atomic_store(&tx->hdr->tail, bad_tail(tx->head));
  if (in_place) {
    assert_non_null(space);
    struct transport_buf b = {
        .ptr = space, .bytes = sizeof(msg), .mem = TRANSPORT_CAP_HOST_MEM, .in_place = 1};
    assert_int_equal(c->ops->post(c, &b, NULL), ncclSuccess); /* the slot was given before */
  } else {
    assert_int_equal(transport_post_host(c, msg, sizeof(msg), NULL), ncclSuccess);
  }
  assert_int_equal(step(L, SHM_LOOP_SENDER), ncclRemoteError);
}

static uint64_t ahead_of_head(uint64_t head) {
  return head + 5;
}

static uint64_t moved_back(uint64_t head) {
  (void)head;
  return 0;
}

static void test_tail_ahead(void** state) {
  struct shm_loop* L = *state;
  tail_case(L, ahead_of_head, 0);
}

static void test_tail_back(void** state) {
  struct shm_loop* L = *state;
  tail_case(L, moved_back, 0);
}

static void test_tail_in_place(void** state) {
  struct shm_loop* L = *state;
  tail_case(L, ahead_of_head, 1);
}

/* The receiver's view of a head the sender moved where it cannot be:
 * more than a ring ahead, or back. */
static void head_case(struct shm_loop* L, int back) {
  char msg[100] = {2}, in[100];
  shm_loop_connect(L);
  struct shm_conn* rx = side_conn(L, SHM_LOOP_RECEIVER);
  if (back) { /* one message read: the receiver has seen head 1 */
    shm_loop_send(L, msg, sizeof(msg));
    shm_loop_recv(L, in, sizeof(in));
  }
  atomic_store(&rx->hdr->head, back ? 0 : rx->nslots + 1);
  assert_int_equal(transport_post_host(&rx->base, in, sizeof(in), NULL), ncclSuccess);
  assert_int_equal(step(L, SHM_LOOP_RECEIVER), ncclRemoteError);
}

static void test_head_past_ring(void** state) {
  struct shm_loop* L = *state;
  head_case(L, 0);
}

static void test_head_back(void** state) {
  struct shm_loop* L = *state;
  head_case(L, 1);
}

/* A slot whose descriptor the sender garbled. */
static void test_bad_slot(void** state) {
  struct shm_loop* L = *state;
  char msg[100] = {3}, in[100];
  shm_loop_connect(L);
  shm_loop_send(L, msg, sizeof(msg));
  struct shm_conn* rx = side_conn(L, SHM_LOOP_RECEIVER);
  rx->slots[0].kind = 77;
  assert_int_equal(transport_post_host(&rx->base, in, sizeof(in), NULL), ncclSuccess);
  assert_int_equal(step(L, SHM_LOOP_RECEIVER), ncclRemoteError);
}

/* ---- the sleeper counts zeroed under a sleeper ---- */

/* The receiver sleeps; the peer zeroes the count it raised, so the
 * sender's ring skips the wake-up and the sleeper sleeps its slice. It
 * finds the count below its own raise when it lowers it: the connection
 * naps from then on, instead of sleeping a slice per call. */
static void zeroed_case(struct shm_loop* L, int epoll_path) {
  struct shm_loop_side* side = &L->side[SHM_LOOP_RECEIVER];
  char out[64], in[64];
  memset(out, 0x2b, sizeof(out));
  shm_loop_connect(L);
  struct shm_conn* rx = side_conn(L, SHM_LOOP_RECEIVER);
  _Atomic uint32_t* count = epoll_path ? &rx->hdr->fd_sleepers[SHM_RECV] : &rx->hdr->sleepers;
  shm_loop_block_receiver(L, in, sizeof(in), epoll_path);
  assert_int_equal(side->waits.nfutex, 1);
  struct shm_loop_sleeper z;
  shm_loop_sleep(&z, side, NAP_SLICE_MS);
  while (atomic_load(count) == 0 && !atomic_load(&z.done)) sched_yield();
  atomic_store(count, 0); /* the faulty peer */
  shm_loop_send(L, out, sizeof(out));
  shm_loop_wake_join(&z, DEADLINE_S);
  assert_int_equal(atomic_load(count), 0); /* put back, not wrapped around */
  shm_loop_drain(L);
  assert_memory_equal(in, out, sizeof(out));
  shm_loop_block_receiver(L, in, sizeof(in), epoll_path);
  assert_int_equal(side->waits.nfutex, 0); /* no sleep on a count the peer plays with */
  assert_int_equal(side->waits.npoll, 1);
}

static void test_zeroed_sleepers(void** state) {
  struct shm_loop* L = *state;
  zeroed_case(L, 0);
}

static void test_zeroed_fd_sleepers(void** state) {
  struct shm_loop* L = *state;
  zeroed_case(L, 1);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, shm_loop_fixture_setup, shm_loop_fixture_teardown)
  const struct CMUnitTest tests[] = {
      T(test_dead_sleepers_bell), T(test_tail_ahead),      T(test_tail_back),
      T(test_tail_in_place),      T(test_head_past_ring),  T(test_head_back),
      T(test_bad_slot),           T(test_zeroed_sleepers), T(test_zeroed_fd_sleepers),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
