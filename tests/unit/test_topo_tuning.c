/*
 * Topology dump then load gives the same tuner decisions: one process
 * detects and writes NCCL_TOPO_DUMP_FILE, a second one reads it back with
 * NCCL_TOPO_FILE; both build a 4-rank comm (ncclCommInitAll, one process,
 * so one topology) and record the algorithm and chunk the tuner picks for
 * every collective over sizes from 8 B to 256 MiB. The tables must match,
 * and a tune file's forced range must win over the model. The device
 * model's direct-or-staged choice has one crossover per collective.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "topo/topo.h"
#include "tune/tuner.h"
#include "tune/tuner_device.h"

#define NSIZES 26 /* 8 B << 0..25 */
#define NRANKS 4

struct decisions {
  int ok;
  int algo[COLL_COUNT][NSIZES];
  size_t chunk[COLL_COUNT][NSIZES];
  uint32_t mem_mbps;
};

/* In a child (a fresh topology cache): build the comm, record choices. */
static int record(struct decisions* d) {
  ncclComm_t comms[NRANKS];
  const struct topo_system* sys;
  if (ncclCommInitAll(comms, NRANKS, NULL) != ncclSuccess) return 1;
  for (int c = 0; c < COLL_COUNT; c++)
    for (int i = 0; i < NSIZES; i++)
      tuner_choose(comms[0], c, (size_t)8 << i, 0, &d->algo[c][i], &d->chunk[c][i]);
  if (topo_system_get(&sys) != ncclSuccess) return 1;
  d->mem_mbps = sys->mem_mbps;
  for (int r = 0; r < NRANKS; r++) ncclCommDestroy(comms[r]);
  d->ok = 1;
  return 0;
}

static void run_child(struct decisions* d, const char* var, const char* path) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    setenv(var, path, 1);
    _exit(record(d));
  }
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  assert_true(d->ok);
}

static void test_dump_then_load(void** state) {
  (void)state;
  char path[64];
  snprintf(path, sizeof(path), "/tmp/braid_topo_tuning.%d.json", (int)getpid());
  struct decisions* d =
      mmap(NULL, 2 * sizeof(*d), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(d != MAP_FAILED);
  memset(d, 0, 2 * sizeof(*d));
  run_child(&d[0], "NCCL_TOPO_DUMP_FILE", path);
  run_child(&d[1], "NCCL_TOPO_FILE", path);
  assert_int_equal(d[0].mem_mbps, d[1].mem_mbps);
  assert_memory_equal(d[0].algo, d[1].algo, sizeof(d[0].algo));
  assert_memory_equal(d[0].chunk, d[1].chunk, sizeof(d[0].chunk));
  unlink(path);
  munmap(d, 2 * sizeof(*d));
}

/* A tune file forces Tree for mid-size all-reduces with a given chunk,
 * and a link line changes the model; a bad line fails init clearly. */
static void test_tune_file(void** state) {
  (void)state;
  char path[64];
  snprintf(path, sizeof(path), "/tmp/braid_tune.%d.txt", (int)getpid());
  FILE* f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "# test\nforce AllReduce 1K 64K Tree 8K\nlink intra all 1.5 0.25\n");
  fclose(f);
  setenv("BRAID_TUNE_FILE", path, 1);
  ncclComm_t comms[2];
  assert_int_equal(ncclCommInitAll(comms, 2, NULL), ncclSuccess);
  int algo;
  size_t chunk;
  tuner_choose(comms[0], COLL_ALLREDUCE, 4096, 0, &algo, &chunk);
  assert_int_equal(algo, ALGO_TREE);
  assert_int_equal(chunk, 8192);
  assert_true(comms[0]->tune.intra.alpha_us[ALGO_RING] == 1.5);
  for (int r = 0; r < 2; r++) ncclCommDestroy(comms[r]);
  f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "force AllReduce 64K 1K Tree\n"); /* empty range */
  fclose(f);
  assert_int_equal(ncclCommInitAll(comms, 2, NULL), ncclInvalidArgument);
  assert_non_null(strstr(ncclGetLastError(NULL), "line 1"));
  unsetenv("BRAID_TUNE_FILE");
  unlink(path);
}

/* Device buffers on one node: staging wins for tiny calls (direct pays
 * more flag hops and messages), direct for large ones (it moves 2kS bytes
 * at device speed, staging crosses the host link twice), with one
 * crossover per collective; ranks sharing a device never make direct more
 * attractive. */
static int direct_model_check(void) {
  ncclComm_t comms[NRANKS];
  int bad = 0;
  if (ncclCommInitAll(comms, NRANKS, NULL) != ncclSuccess) return 1;
  for (int c = 0; c < COLL_COUNT; c++) {
    int prev_shared = 0, prev_apart = 0;
    bad += tuner_prefers_direct(comms[0], c, 8, 1);
    bad += !tuner_prefers_direct(comms[0], c, (size_t)256 << 20, NRANKS);
    for (int i = 0; i < NSIZES; i++) {
      size_t bytes = (size_t)8 << i;
      int shared = tuner_prefers_direct(comms[0], c, bytes, NRANKS);
      int apart = tuner_prefers_direct(comms[0], c, bytes, 1);
      bad += shared < prev_shared || apart < prev_apart; /* once direct, always */
      bad += apart < shared;
      prev_shared = shared, prev_apart = apart;
    }
    if (bad) fprintf(stderr, "collective %d: the direct model misbehaves\n", c);
  }
  for (int r = 0; r < NRANKS; r++) ncclCommDestroy(comms[r]);
  return bad != 0;
}

static void test_direct_model(void** state) {
  (void)state;
  pid_t pid = fork(); /* a fresh process: the tuner's parameters are read once */
  assert_true(pid >= 0);
  if (pid == 0) _exit(direct_model_check());
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dump_then_load),
      cmocka_unit_test(test_direct_model),
      cmocka_unit_test(test_tune_file),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
