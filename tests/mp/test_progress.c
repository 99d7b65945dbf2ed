/* The progress engine sleeps when there is nothing to do: a rank waiting in
 * an all-reduce for a late peer uses little CPU, and still completes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>
#include <time.h>

#include "launcher.h"

#define LATE_MS 1500
#define COUNT 1000

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Rank 0 enters at once and waits; rank 1 arrives LATE_MS later. The waiter
 * must not busy-poll for the whole wait: its CPU time stays under a third of
 * the wall time it waited (a spinning rank would use all of it). */
static int late_peer_body(const mp_env* env) {
  ncclComm_t comm;
  float buf[COUNT];
  int bad = 0;
  if (mp_comm_init(env, &comm)) return 1;
  for (int i = 0; i < COUNT; i++) buf[i] = (float)env->rank;
  if (env->rank == 1) mp_sleep_ms(LATE_MS);
  double wall0 = mp_now(), cpu0 = cpu_seconds();
  bad += mp_expect_rc(env, comm, ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, NULL),
                      ncclSuccess, "all-reduce with a late peer");
  double wall = mp_now() - wall0, cpu = cpu_seconds() - cpu0;
  for (int i = 0; i < COUNT && !bad; i++)
    if (buf[i] != 1.0f) mp_fail(env, "element %d = %g, expected 1", i, buf[i]), bad++;
  if (env->rank == 0) {
    mp_log(env, "waited %.3f s wall, %.3f s CPU", wall, cpu);
    if (wall < LATE_MS / 2000.0) mp_fail(env, "did not wait for the late peer?"), bad++;
    if (cpu > wall / 3) mp_fail(env, "busy-waited: %.3f s CPU in %.3f s", cpu, wall), bad++;
  }
  ncclCommDestroy(comm);
  return bad;
}

static void test_waiting_rank_sleeps(void** state) {
  (void)state;
  mp_opts o = MP_OPTS_INIT;
  assert_int_equal(mp_launch(2, late_peer_body, NULL, &o), 0);
}

int main(void) {
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_waiting_rank_sleeps)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
