/* Both ends of a shared-memory connection in one process (shm_loop.h). */
#include "shm_loop.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <cmocka.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shm/shm_names.h"
#include "transport_table.h"

int shm_loop_setup(struct shm_loop* l, int64_t timeout_ms) {
  memset(l, 0, sizeof(*l));
  for (int r = 0; r < 2; r++) {
    struct shm_loop_side* s = &l->side[r];
    if (progress_init(&s->engine) != ncclSuccess) return -1;
    l->peers[r] = (struct peer_info){.rank = r,
                                     .pid = (int32_t)getpid(),
                                     .host_hash = 1,
                                     .bell_fd = s->engine.bell_fd[0],
                                     .bell_ino = s->engine.bell_ino};
    *(struct shm_blob*)transport_blob_put(&l->peers[r], &shm_transport) =
        (struct shm_blob){.domain = 1, .tag = 0xb0b0 + (uint64_t)r};
    s->ctx = (struct transport_ctx){.rank = r,
                                    .nranks = 2,
                                    .secret = 0xbe11,
                                    .peers = l->peers,
                                    .listen_fd = -1,
                                    .epoll_fd = s->engine.epoll_fd,
                                    .timeout_ms = timeout_ms,
                                    .aborted = &s->aborted,
                                    .waits = &s->waits};
  }
  return 0;
}

void shm_loop_teardown(struct shm_loop* l) {
  for (int r = 1; r >= 0; r--) {
    if (l->side[r].conn) l->side[r].conn->ops->close(l->side[r].conn);
    l->side[r].conn = NULL;
    progress_destroy(&l->side[r].engine);
  }
}

int shm_loop_fixture_setup(void** state) {
  struct shm_loop* l = calloc(1, sizeof(*l));
  if (l == NULL || shm_loop_setup(l, SHM_LOOP_TIMEOUT_MS) != 0) {
    free(l);
    return -1;
  }
  *state = l;
  return 0;
}

int shm_loop_fixture_teardown(void** state) {
  shm_loop_teardown(*state);
  free(*state);
  return 0;
}

void shm_loop_connect(struct shm_loop* l) {
  struct shm_loop_side *s = &l->side[SHM_LOOP_SENDER], *r = &l->side[SHM_LOOP_RECEIVER];
  assert_int_equal(shm_transport.connect_send(&s->ctx, SHM_LOOP_RECEIVER, 0, &s->conn),
                   ncclSuccess);
  assert_int_equal(shm_transport.connect_recv(&r->ctx, SHM_LOOP_SENDER, 0, &r->conn), ncclSuccess);
}

void shm_loop_block_receiver(struct shm_loop* l, char* buf, size_t bytes, int socket_too) {
  struct shm_loop_side* s = &l->side[SHM_LOOP_RECEIVER];
  assert_int_equal(transport_post_host(s->conn, buf, bytes, NULL), ncclSuccess);
  progress_pass_begin(&s->engine, &s->waits); /* counts reset for the loop's first test */
  for (int i = 0; i < 8 && s->waits.nfutex == 0 && s->waits.npoll == 0; i++) {
    int progressed = 0;
    progress_pass_begin(&s->engine, &s->waits);
    assert_int_equal(s->conn->ops->progress(s->conn, &progressed), ncclSuccess);
  }
  assert_int_equal(s->waits.nfutex + s->waits.npoll, 1);
  if (socket_too) s->waits.nfd = 1;
}

void shm_loop_send(struct shm_loop* l, const char* buf, size_t bytes) {
  struct transport_conn* c = l->side[SHM_LOOP_SENDER].conn;
  assert_int_equal(transport_post_host(c, (void*)buf, bytes, NULL), ncclSuccess);
  while (c->completed < c->posted) {
    int progressed = 0;
    assert_int_equal(c->ops->progress(c, &progressed), ncclSuccess);
  }
}

void shm_loop_drain(struct shm_loop* l) {
  struct transport_conn* c = l->side[SHM_LOOP_RECEIVER].conn;
  while (c->completed < c->posted) {
    int progressed = 0;
    assert_int_equal(c->ops->progress(c, &progressed), ncclSuccess);
  }
}

void shm_loop_recv(struct shm_loop* l, char* buf, size_t bytes) {
  struct transport_conn* c = l->side[SHM_LOOP_RECEIVER].conn;
  assert_int_equal(transport_post_host(c, buf, bytes, NULL), ncclSuccess);
  shm_loop_drain(l);
}

static void* sleeper_main(void* arg) {
  struct shm_loop_sleeper* z = arg;
  struct progress* engines[1] = {&z->side->engine};
  struct transport_waits* waits[1] = {&z->side->waits};
  z->res = progress_wait(engines, waits, 1, z->timeout_ms);
  atomic_store(&z->done, 1);
  return NULL;
}

void shm_loop_sleep(struct shm_loop_sleeper* z, struct shm_loop_side* side, int timeout_ms) {
  memset(z, 0, sizeof(*z));
  z->side = side;
  z->timeout_ms = timeout_ms;
  assert_int_equal(pthread_create(&z->thread, NULL, sleeper_main, z), 0);
}

void shm_loop_wake_join(struct shm_loop_sleeper* z, int deadline_s) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += deadline_s;
  int rc = pthread_timedjoin_np(z->thread, NULL, &until);
  if (rc != 0) { /* never woken: a lost wake-up */
    pthread_cancel(z->thread);
    pthread_join(z->thread, NULL);
  }
  assert_int_equal(rc, 0);
  assert_int_equal(z->res, ncclSuccess);
}
