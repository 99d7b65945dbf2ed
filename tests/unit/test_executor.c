/*
 * The executor on a backend that completes tasks late and in random order
 * (seeded, so every run is the same): every schedule case test_schedule
 * runs, each rank's output bitwise equal to the same case on the CPU
 * backend. A step that sends before its task completed sends stale data,
 * and two racing tasks in flight together leave a wrong result: both fail
 * here. Also: the schedule cache stops building once calls repeat.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fake_transport.h"
#include "common/sched_cases.h"
#include "engine/exec_cpu.h"
#include "kernels.h"

/* ---- The late backend ---- */

#define LATE_MAX 64 /* tasks in flight per rank: more than any window */

struct late_task {
  uint64_t ticket;
  struct kern_task task;
};

/* One rank's backend: posted tasks wait in `pending` and run one at a
 * time, a random one, at a random later post or test. */
struct late_backend {
  uint64_t rng;
  uint64_t next_ticket;
  int npending;
  struct late_task pending[LATE_MAX];
  /* what happened, summed over a test: proof the order really was shuffled */
  uint64_t posted, ran_late, ran_out_of_order;
};

static uint64_t late_rand(struct late_backend* b) {
  b->rng ^= b->rng >> 12;
  b->rng ^= b->rng << 25;
  b->rng ^= b->rng >> 27;
  return b->rng * 0x2545F4914F6CDD1Dull;
}

/* Maybe (one call in two) run a random pending task. */
static void late_maybe_run(struct late_backend* b) {
  if (b->npending == 0 || late_rand(b) % 2) return;
  int i = (int)(late_rand(b) % (uint64_t)b->npending);
  uint64_t oldest = UINT64_MAX;
  for (int k = 0; k < b->npending; k++)
    if (b->pending[k].ticket < oldest) oldest = b->pending[k].ticket;
  b->ran_out_of_order += b->pending[i].ticket != oldest;
  b->ran_late++;
  kern_task_run(&b->pending[i].task);
  b->pending[i] = b->pending[--b->npending];
}

static ncclResult_t late_post(void* state, const struct kern_task* t, uint64_t* ticket, int* done) {
  struct late_backend* b = state;
  late_maybe_run(b); /* an older one, never this one: it is late */
  assert_true(b->npending < LATE_MAX);
  b->pending[b->npending].ticket = b->next_ticket;
  b->pending[b->npending].task = *t;
  b->npending++;
  b->posted++;
  *ticket = b->next_ticket++;
  *done = 0;
  return ncclSuccess;
}

static ncclResult_t late_test(void* state, uint64_t ticket, int* done) {
  struct late_backend* b = state;
  late_maybe_run(b);
  *done = 1;
  for (int k = 0; k < b->npending; k++)
    if (b->pending[k].ticket == ticket) *done = 0;
  return ncclSuccess;
}

static const struct exec_backend late_backend_ops = {"late", late_post, late_test};

/* ---- Every case of test_schedule, late and shuffled ---- */

struct late_suite {
  struct late_backend ranks[FAKE_MAXR];
  uint64_t cases;
  int staged;              /* the buffers labelled device memory: every message through a slot */
  int lending;             /* over a transport that lends receives and takes sends in place */
  uint64_t lent, in_place; /* what the lending transport lent and took in place */
};

static void run_late(const struct sched_case* c, void* arg) {
  struct late_suite* s = arg;
  struct sched_run ref, got;
  void* states[FAKE_MAXR];
  char what[160];
  for (int r = 0; r < c->n; r++) {
    struct late_backend* b = &s->ranks[r];
    b->rng = 0x9E3779B97F4A7C15ull * (s->cases + 1) + (uint64_t)r; /* reproducible per case */
    b->npending = 0;
    states[r] = b;
  }
  s->cases++;
  sched_case_run_reference(c, &ref);
  if (s->staged)
    sched_case_run_staged(c, &late_backend_ops, states, &got);
  else if (s->lending)
    sched_case_run_lending(c, &late_backend_ops, states, &got);
  else
    sched_case_run(c, &late_backend_ops, states, &got);
  sched_case_describe(c, what, sizeof(what));
  s->lent += got.lent;
  s->in_place += got.in_place;
  for (int r = 0; r < c->n; r++) {
    assert_int_equal(s->ranks[r].npending, 0); /* nothing left running after the call */
    if (memcmp(ref.recv[r], got.recv[r], ref.recv_bytes) != 0)
      fail_msg("%s rank %d: output differs from the CPU backend's", what, r);
  }
  sched_run_free(&ref);
  sched_run_free(&got);
}

/* The backend must really have run tasks late and out of order, or the
 * test proves nothing. */
static void late_suite_check(const struct late_suite* s) {
  uint64_t posted = 0, late = 0, shuffled = 0;
  for (int r = 0; r < FAKE_MAXR; r++) {
    posted += s->ranks[r].posted;
    late += s->ranks[r].ran_late;
    shuffled += s->ranks[r].ran_out_of_order;
  }
  print_message("%llu cases, %llu tasks, %llu run out of order\n", (unsigned long long)s->cases,
                (unsigned long long)posted, (unsigned long long)shuffled);
  assert_true(posted > 0 && late == posted);
  assert_true(shuffled > 0);
}

static void test_late_allreduce(void** state) {
  (void)state;
  struct late_suite* s = calloc(1, sizeof(*s));
  sched_cases_allreduce(run_late, s);
  late_suite_check(s);
  free(s);
}

static void test_late_collectives(void** state) {
  (void)state;
  struct late_suite* s = calloc(1, sizeof(*s));
  sched_cases_collectives(run_late, s);
  late_suite_check(s);
  free(s);
}

static void test_late_windows(void** state) {
  (void)state;
  struct late_suite* s = calloc(1, sizeof(*s));
  sched_cases_windows(run_late, s);
  late_suite_check(s);
  free(s);
}

static void test_late_layouts(void** state) {
  (void)state;
  struct late_suite* s = calloc(1, sizeof(*s));
  sched_cases_layouts(run_late, s);
  late_suite_check(s);
  free(s);
}

/* Every all-reduce and collective case, as the suite's flags say, then
 * the check that its backend ran tasks late and out of order. */
static void late_suite_collectives(struct late_suite* s) {
  sched_cases_allreduce(run_late, s);
  sched_cases_collectives(run_late, s);
  late_suite_check(s);
}

/* ---- Lending: reductions read received data where it arrived ---- */

/* Every all-reduce and collective case again over a transport that lends
 * its receives and takes sends in place, poisoning what is given back:
 * with tasks late and out of order, a step must hold what it was lent
 * until its task is done and send in place only what goes next. */
static void test_lending_collectives(void** state) {
  (void)state;
  struct late_suite* s = calloc(1, sizeof(*s));
  s->lending = 1;
  late_suite_collectives(s);
  print_message("%llu messages lent, %llu sends in place\n", (unsigned long long)s->lent,
                (unsigned long long)s->in_place);
  assert_true(s->lent > 0 && s->in_place > 0);
  free(s);
}

/* ---- Staged: device memory, which only the backend touches ---- */

/* Every case again with the buffers labelled device memory: the fake
 * transport refuses any buffer that is not a staging slot, the late
 * backend runs every copy in and out, and the outputs still equal the
 * CPU's on host memory. */
static void test_staged_collectives(void** state) {
  (void)state;
  struct late_suite* s = calloc(1, sizeof(*s));
  s->staged = 1;
  late_suite_collectives(s);
  free(s);
}

static void test_staged_windows_layouts(void** state) {
  (void)state;
  struct late_suite* s = calloc(1, sizeof(*s));
  s->staged = 1;
  sched_cases_windows(run_late, s);
  sched_cases_layouts(run_late, s);
  late_suite_check(s);
  free(s);
}

/* A device call without a device backend is refused at start, clearly. */
static void test_staged_without_backend(void** state) {
  (void)state;
  struct fake_world* w = calloc(1, sizeof(*w));
  float buf[8] = {0};
  struct exec_args args;
  struct transport_tag tag;
  memset(&tag, 0, sizeof(tag));
  fake_world_init(w, 1, 4096, 4, NULL, &exec_backend_cpu, NULL);
  fake_args(&args, 1, COLL_ALLREDUCE, ALGO_RING, 0, buf, buf, 8, ncclFloat, ncclSum, 4096);
  args.mem = MEM_DEVICE;
  assert_int_equal(exec_start(&w->ex[0], &args, &tag), ncclInvalidArgument);
  fake_world_free(w);
  free(w);
}

/* ---- The schedule cache ---- */

/* Three calls that alternate collective and size on one world: the first
 * round builds their schedules, later rounds build none. */
static void test_schedule_cache(void** state) {
  (void)state;
  static const struct {
    int coll;
    size_t count;
  } calls[] = {{COLL_ALLREDUCE, 1000}, {COLL_ALLGATHER, 77}, {COLL_ALLREDUCE, 5}};
  enum { N = 4 };
  struct fake_world* w = calloc(1, sizeof(*w));
  float* mem = calloc((size_t)N * 2 * N * 1000, sizeof(float));
  struct exec_args args[N];
  uint64_t first[N] = {0};
  fake_world_init(w, N, 8192, 4, NULL, &exec_backend_cpu, NULL);
  for (int round = 0; round < 4; round++) {
    for (size_t i = 0; i < sizeof(calls) / sizeof(calls[0]); i++) {
      for (int r = 0; r < N; r++) {
        float* send = mem + (size_t)r * 2 * N * 1000;
        fake_args(&args[r], N, calls[i].coll, ALGO_RING, 0, send, send + N * 1000, calls[i].count,
                  ncclFloat, ncclSum, 4096);
      }
      fake_world_run(w, args);
    }
    for (int r = 0; r < N; r++) {
      if (round == 0) first[r] = w->ex[r].cache.builds;
      assert_int_equal(first[r], 3);
      assert_int_equal(w->ex[r].cache.builds, first[r]);
    }
  }
  fake_world_free(w);
  free(mem);
  free(w);
}

/* ---- Registrations reach the transport ---- */

/* Count rank r's messages by the handle they carried, checking each
 * against where its buffer lies: in the receive buffer, the receive
 * registration's; in the send buffer, the send one's; in a slot, none. */
static void count_regs(struct fake_world* w, int r, const char* send, const char* recv,
                       size_t bytes, void* send_h, void* recv_h, int counts[3]) {
  for (int p = 0; p < w->n; p++)
    for (int dir = 0; dir < 2; dir++) {
      const struct fake_conn* f = dir ? &w->conns[p][r][1] : &w->conns[r][p][0];
      for (uint64_t k = 0; k < f->base.posted; k++) {
        const char* buf = f->bufs[k];
        void* h = f->regs[k];
        if (buf >= recv && buf < recv + bytes) {
          assert_ptr_equal(h, recv_h);
          counts[1]++;
        } else if (buf >= send && buf < send + bytes) {
          assert_ptr_equal(h, send_h);
          counts[0]++;
        } else {
          assert_null(h);
          counts[2]++;
        }
      }
    }
}

/* An all-reduce whose buffers are registered: every message posted from
 * or into them carries the transport's handle of that registration, and
 * messages through the staging slots carry none. */
static void test_registered_buffers(void** state) {
  (void)state;
  enum { N = 2, COUNT = 4096 };
  struct fake_world* w = calloc(1, sizeof(*w));
  float* mem = calloc((size_t)N * 2 * COUNT, sizeof(float));
  struct mem_reg regs[N][2];
  struct exec_args args[N];
  int counts[3] = {0};
  memset(regs, 0, sizeof(regs));
  fake_world_init(w, N, 4096, 4, NULL, &exec_backend_cpu, NULL);
  for (int r = 0; r < N; r++) {
    float* send = mem + (size_t)r * 2 * COUNT;
    for (int i = 0; i < COUNT; i++) send[i] = (float)(r + i);
    fake_args(&args[r], N, COLL_ALLREDUCE, ALGO_RING, 0, send, send + COUNT, COUNT, ncclFloat,
              ncclSum, 4096);
    for (int k = 0; k < 2; k++) {
      regs[r][k].base = send + k * COUNT;
      regs[r][k].size = COUNT * sizeof(float);
      regs[r][k].handles[fake_transport.id] = &regs[r][k]; /* a handle unique to it */
    }
    args[r].sendreg = &regs[r][0];
    args[r].recvreg = &regs[r][1];
  }
  fake_world_run(w, args);
  for (int r = 0; r < N; r++) {
    const char* send = (const char*)(mem + (size_t)r * 2 * COUNT);
    count_regs(w, r, send, send + COUNT * sizeof(float), COUNT * sizeof(float), &regs[r][0],
               &regs[r][1], counts);
    for (int i = 0; i < COUNT; i++)
      assert_true(mem[(size_t)r * 2 * COUNT + COUNT + i] == 1 + 2 * i);
  }
  assert_true(counts[0] > 0 && counts[1] > 0 && counts[2] > 0); /* all three kinds seen */
  fake_world_free(w);
  free(mem);
  free(w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_schedule_cache),         cmocka_unit_test(test_late_allreduce),
      cmocka_unit_test(test_late_collectives),       cmocka_unit_test(test_late_windows),
      cmocka_unit_test(test_late_layouts),           cmocka_unit_test(test_registered_buffers),
      cmocka_unit_test(test_staged_collectives),     cmocka_unit_test(test_staged_windows_layouts),
      cmocka_unit_test(test_staged_without_backend), cmocka_unit_test(test_lending_collectives),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
