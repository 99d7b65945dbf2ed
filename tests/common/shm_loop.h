/*
 * Both ends of one shared-memory connection in this process, each rank
 * with its own progress engine (the transport needs only a pid and the
 * peer table): the bell and fault tests drive the two sides by hand, and
 * a helper thread plays a rank asleep in progress_wait.
 */
#ifndef TESTS_SHM_LOOP_H_
#define TESTS_SHM_LOOP_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "engine/progress.h"
#include "transport.h"

enum { SHM_LOOP_SENDER = 0, SHM_LOOP_RECEIVER = 1 };

struct shm_loop_side {
  struct progress engine;
  struct transport_ctx ctx;
  struct transport_waits waits;
  _Atomic int aborted;
  struct transport_conn* conn;
};

struct shm_loop {
  struct peer_info peers[2];
  struct shm_loop_side side[2];
};

/* A rank asleep in progress_wait on its side's waits (shm_loop_sleep). */
struct shm_loop_sleeper {
  struct shm_loop_side* side;
  int timeout_ms;
  ncclResult_t res;
  _Atomic int done;
  pthread_t thread;
};

/* Engines, peer table and contexts (timeout_ms is BRAID_TIMEOUT_MS's part);
 * 0 on success. */
int shm_loop_setup(struct shm_loop* l, int64_t timeout_ms);
/* Closes the connections (receiver first: a sender's close waits for what
 * it sent to be taken) and the engines. */
void shm_loop_teardown(struct shm_loop* l);
/* The same as cmocka fixtures: *state is a fresh loop (SHM_LOOP_TIMEOUT_MS). */
#define SHM_LOOP_TIMEOUT_MS 60000
int shm_loop_fixture_setup(void** state);
int shm_loop_fixture_teardown(void** state);
/* connect_send, then connect_recv, on channel 0 (cmocka asserts). */
void shm_loop_connect(struct shm_loop* l);

/* The receiver posts `bytes` into buf with nothing sent, and progresses
 * until its connection says it is blocked; with `socket_too`, a socket
 * counts as blocked as well, so that a wait takes the epoll path. */
void shm_loop_block_receiver(struct shm_loop* l, char* buf, size_t bytes, int socket_too);
/* The sender posts `bytes` and progresses until they are in the ring. */
void shm_loop_send(struct shm_loop* l, const char* buf, size_t bytes);
/* The receiver progresses until every receive it posted is complete. */
void shm_loop_drain(struct shm_loop* l);
/* The receiver posts `bytes` into buf and progresses until they are in. */
void shm_loop_recv(struct shm_loop* l, char* buf, size_t bytes);

/* Starts a thread that sleeps in progress_wait as `side` (after a
 * shm_loop_block_receiver) for at most timeout_ms. */
void shm_loop_sleep(struct shm_loop_sleeper* z, struct shm_loop_side* side, int timeout_ms);
/* Joins it within deadline_s (a lost wake-up fails the test instead of
 * hanging it) and asserts its wait returned ncclSuccess. */
void shm_loop_wake_join(struct shm_loop_sleeper* z, int deadline_s);

#endif /* TESTS_SHM_LOOP_H_ */
