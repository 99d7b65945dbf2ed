/* The epoch and step loop. A step: fill this rank's shard, forward, backward with buckets
 * leaving as they finish, wait for the last, one SGD update; every rank does the same
 * arithmetic on the same summed gradients, so parameters stay bitwise identical. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "failure.h"
#include "train.h"

#define DIVERGENCE 1e-3f /* what --inject-divergence adds to one weight */

static int64_t total_steps(const trainer_t* t) {
  return (int64_t)t->o->epochs * t->plan.steps_per_epoch;
}

/* The update that ends step t->step of this epoch. */
static sync_step_t step_args(trainer_t* t, int local_n, double lr) {
  sync_step_t st = {&t->model, t->velocity,        &t->optim,      lr,
                    local_n,   t->o->global_batch, t->global_step, total_steps(t)};
  return st;
}

static void count_sent(trainer_t* t) {
  double now = wire_total(&t->sync.wire);
  t->partial[PART_SENT] += now - t->wire_seen;
  t->wire_seen = now;
}

static void train_step(trainer_t* t) {
  int n;
  const int* idx = shard_batch(&t->plan, t->step, &n);
  sync_step_t st = step_args(t, n, optim_lr(&t->optim, t->epoch, t->step));
  shard_fill(&t->train, idx, n, model_input(&t->model), t->labels);
  train_check_nccl(t, sync_step_begin(&t->sync, &st), "the parameter exchange");
  model_forward(&t->model, n);
  grad_sink_t sink = buckets_sink(&t->buckets);
  int correct = 0;
  double loss =
      model_backward(&t->model, t->labels, n, sync_uses_buckets(&t->sync) ? &sink : NULL, &correct);
  train_check_nccl(t, sync_step_end(&t->sync, &st), "the gradient exchange");
  count_sent(t);
  t->partial[PART_LOSS] += loss;
  t->partial[PART_CORRECT] += correct;
  t->partial[PART_SEEN] += n;
  t->step++;
  t->global_step++;
  if (t->rank == t->o->diverge_rank && t->global_step == t->o->diverge_step)
    t->model.params[0] += DIVERGENCE;
}

/* All ranks compare fingerprints of their parameters; any difference stops the run. */
static void check_sync(trainer_t* t) {
  uint64_t mine = ckpt_fnv1a(t->model.params, t->model.nparams * sizeof(float), CKPT_FNV_SEED);
  wire_add_other(&t->sync.wire, ncclUint64, 1);
  train_check_nccl(t, ncclAllGather(&mine, t->fingerprints, 1, ncclUint64, t->comm, NULL),
                   "parameter sync check");
  for (int r = 1; r < t->world; r++) {
    if (t->fingerprints[r] == t->fingerprints[0]) continue;
    train_die(t,
              "parameters differ between ranks after step %lld: rank %d has fingerprint "
              "%016llx, rank 0 has %016llx (this rank: %016llx); the ranks no longer train the "
              "same model, stopping",
              (long long)t->global_step, r, (unsigned long long)t->fingerprints[r],
              (unsigned long long)t->fingerprints[0], (unsigned long long)mine);
  }
}

static void take_comm_times(trainer_t* t) {
  double busy, wait;
  buckets_take_times(&t->buckets, &busy, &wait);
  t->partial[PART_BUSY] += busy;
  t->partial[PART_WAIT] += wait;
  t->partial[PART_HIDDEN] += busy > wait ? busy - wait : 0.0;
}

/* Rank 0 writes; the model state is the same on every rank, so its copy speaks for all. The
 * running sums are summed over ranks first. */
/* Every rank's own state to rank 0 (nothing of the scheme left in flight first). */
static void gather_states(trainer_t* t) {
  size_t floats = sync_state_floats(&t->sync);
  float* mine = t->states; /* rank 0: its part comes first */
  train_check_nccl(t, sync_quiesce(&t->sync), "finishing the exchange before a checkpoint");
  sync_state_save(&t->sync, t->velocity, mine);
  wire_add_other(&t->sync.wire, ncclFloat, floats);
  train_check_nccl(t, ncclGather(mine, t->states, floats, ncclFloat, 0, t->comm, NULL),
                   "gathering the ranks' states");
}

static void save_checkpoint(trainer_t* t, double epoch_start) {
  if (t->o->checkpoint[0] == '\0') return;
  take_comm_times(t);
  gather_states(t);
  ckpt_meta_t meta;
  memset(&meta, 0, sizeof(meta));
  memcpy(meta.partial, t->partial, sizeof(meta.partial));
  wire_add_other(&t->sync.wire, ncclDouble, PART_ELAPSED);
  train_check_nccl(
      t,
      ncclAllReduce(meta.partial, meta.partial, PART_ELAPSED, ncclDouble, ncclSum, t->comm, NULL),
      "checkpoint statistics");
  if (t->rank != 0) return;
  snprintf(meta.config, sizeof(meta.config), "%s", t->config);
  meta.seed = t->o->seed;
  meta.world = t->world;
  meta.global_batch = t->o->global_batch;
  meta.epoch = t->epoch;
  meta.step = t->step;
  meta.global_step = t->global_step;
  memcpy(meta.rng, t->rng.s, sizeof(meta.rng));
  meta.partial[PART_ELAPSED] = t->partial[PART_ELAPSED] + buckets_now() - epoch_start;
  meta.nhistory = t->nhistory;
  ckpt_blob_t blob;
  char err[TRAIN_ERR_MAX];
  if (ckpt_build(&blob, &meta, t->history, t->model.params, t->velocity, t->model.nparams,
                 t->states, t->world, sync_state_floats(&t->sync)) != 0)
    train_die(t, "out of memory writing a checkpoint");
  if (ckpt_write(t->o->checkpoint, &blob, err, sizeof(err)) != 0) train_die(t, "%s", err);
  ckpt_blob_free(&blob);
}

/* Correct predictions on this rank's part of the test set. */
static int evaluate(trainer_t* t, int* seen) {
  int begin, end, correct = 0;
  shard_split(t->test.count, t->rank, t->world, &begin, &end);
  for (int i = begin; i < end; i += t->max_local) {
    int n = end - i < t->max_local ? end - i : t->max_local;
    shard_fill_range(&t->test, i, n, model_input(&t->model), t->labels);
    correct += loss_count_correct(model_forward(&t->model, n), t->labels, n, t->model.classes);
  }
  *seen = end - begin;
  return correct;
}

enum { SUM_TEST_OK = PART_ELAPSED, SUM_TEST_N, SUM_COUNT };

/* Where the ranks' models drift apart (local, gossip): the RMS over parameters of their
 * standard deviation across ranks. -1 for schemes that keep replicas. */
static double measure_spread(trainer_t* t) {
  const size_t n = t->model.nparams;
  if (t->o->sync.kind != SYNC_LOCAL && t->o->sync.kind != SYNC_GOSSIP &&
      t->o->sync.kind != SYNC_STALE)
    return -1;
  double* m = malloc(2 * n * sizeof(double)); /* once an epoch, not per step */
  if (m == NULL) train_die(t, "out of memory measuring the spread of the parameters");
  for (size_t i = 0; i < n; i++) {
    m[i] = t->model.params[i];
    m[n + i] = m[i] * m[i];
  }
  wire_add_other(&t->sync.wire, ncclDouble, 2 * n);
  train_check_nccl(t, ncclAllReduce(m, m, 2 * n, ncclDouble, ncclSum, t->comm, NULL),
                   "measuring the spread of the parameters");
  double var = 0;
  for (size_t i = 0; i < n; i++) {
    double mean = m[i] / t->world, v = m[n + i] / t->world - mean * mean;
    var += v > 0 ? v : 0;
  }
  free(m);
  return sqrt(var / (double)n);
}

static void end_epoch(trainer_t* t, double elapsed, double lr, double spread) {
  int test_seen;
  int test_ok = evaluate(t, &test_seen);
  double sums[SUM_COUNT];
  memcpy(sums, t->partial, sizeof(double) * PART_ELAPSED);
  sums[SUM_TEST_OK] = test_ok;
  sums[SUM_TEST_N] = test_seen;
  wire_add_other(&t->sync.wire, ncclDouble, SUM_COUNT);
  train_check_nccl(t, ncclAllReduce(sums, sums, SUM_COUNT, ncclDouble, ncclSum, t->comm, NULL),
                   "epoch statistics");
  epoch_row_t* r = &t->history[t->nhistory++];
  r->epoch = t->epoch + 1;
  r->train_loss = sums[PART_LOSS] / sums[PART_SEEN];
  r->train_acc = sums[PART_CORRECT] / sums[PART_SEEN];
  r->test_acc = sums[SUM_TEST_N] > 0 ? sums[SUM_TEST_OK] / sums[SUM_TEST_N] : 0.0;
  r->epoch_s = elapsed;
  r->samples_per_s = elapsed > 0 ? sums[PART_SEEN] / elapsed : 0.0;
  r->comm_s = sums[PART_BUSY] / t->world;
  r->hidden_s = sums[PART_HIDDEN] / t->world;
  r->lr = lr;
  r->sent_mb = sums[PART_SENT] / t->world / 1e6;
  r->total_mb = r->sent_mb + (t->nhistory > 1 ? t->history[t->nhistory - 2].total_mb : 0.0);
  r->spread = spread;
  if (t->rank != 0) return;
  report_epoch_line(stdout, r, t->o->epochs);
  char err[TRAIN_ERR_MAX], scheme[64];
  sync_describe(&t->o->sync, scheme, sizeof(scheme));
  if (t->o->csv[0] &&
      report_write_csv(t->o->csv, t->history, t->nhistory, scheme, err, sizeof(err)) != 0)
    fprintf(stderr, "braid-train: %s\n", err);
}

static int progress_wanted(const trainer_t* t) {
  if (t->rank != 0 || t->o->progress == PROGRESS_NEVER) return 0;
  return t->o->progress == PROGRESS_ALWAYS || isatty(STDERR_FILENO);
}

static void maybe_stop_for_test(trainer_t* t) {
  if (t->o->stop_after_steps == 0 || t->global_step != t->o->stop_after_steps) return;
  fflush(stdout);
  fprintf(stderr, "braid-train: rank %d: stopping after step %lld as asked (--stop-after-steps)\n",
          t->rank, (long long)t->global_step);
  _exit(3);
}

static void run_epoch(trainer_t* t) {
  const options_t* o = t->o;
  const int steps = t->plan.steps_per_epoch;
  progress_t bar;
  progress_begin(&bar, progress_wanted(t), t->epoch + 1, o->epochs, steps);
  shard_begin_epoch(&t->plan, t->epoch);
  double start = buckets_now(), lr = optim_lr(&t->optim, t->epoch, t->step ? t->step - 1 : 0);
  while (t->step < steps) {
    lr = optim_lr(&t->optim, t->epoch, t->step);
    train_step(t);
    progress_update(&bar, t->step, t->partial[PART_LOSS] / t->partial[PART_SEEN]);
    if (o->check_sync > 0 && t->global_step % o->check_sync == 0 &&
        sync_replicas_after(&t->sync, t->global_step - 1, total_steps(t)))
      check_sync(t);
    if (o->checkpoint_every > 0 && t->global_step % o->checkpoint_every == 0)
      save_checkpoint(t, start);
    maybe_stop_for_test(t);
  }
  progress_end(&bar);
  double spread = measure_spread(t);
  int last = t->epoch == o->epochs - 1;
  if (last) {       /* every rank ends with the same model, whatever the scheme */
    int first, end; /* this rank's share of a global batch, as in every step */
    shard_split(t->o->global_batch, t->rank, t->world, &first, &end);
    sync_step_t st = step_args(t, end - first, lr);
    st.step = t->global_step - 1;
    train_check_nccl(t, sync_end_training(&t->sync, &st), "the final exchange");
    count_sent(t);
  }
  take_comm_times(t);
  double elapsed = t->partial[PART_ELAPSED] + buckets_now() - start;
  end_epoch(t, elapsed, lr, spread);
  if (last || sync_replicas_after(&t->sync, t->global_step - 1, total_steps(t))) check_sync(t);
  t->epoch++;
  t->step = 0;
  memset(t->partial, 0, sizeof(t->partial));
  if (o->checkpoint_every == 0 || t->epoch == o->epochs) save_checkpoint(t, buckets_now());
}

/* What the ranks handed to Braid over the run (this process's part of it, for a resumed
 * run), by collective and type, as a mean per rank. */
static void report_bytes(trainer_t* t) {
  wire_t sum = t->sync.wire;
  const size_t words = sizeof(sum) / sizeof(double);
  train_check_nccl(t, ncclAllReduce(&sum, &sum, words, ncclDouble, ncclSum, t->comm, NULL),
                   "byte counts");
  if (t->rank != 0) return;
  char line[1024];
  wire_describe(&sum, 1.0 / t->world, line, sizeof(line));
  printf("# sent per rank (mean): %s; bookkeeping %.1f MB\n", line, sum.other / t->world / 1e6);
}

void trainer_run(trainer_t* t) {
  if (t->epoch >= t->o->epochs && t->rank == 0)
    printf("# the checkpoint is at the end of epoch %d: nothing left to train for --epochs %d\n",
           t->epoch, t->o->epochs);
  while (t->epoch < t->o->epochs) run_epoch(t);
  report_bytes(t);
  if (t->rank == 0) {
    uint64_t fp = ckpt_fnv1a(t->model.params, t->model.nparams * sizeof(float), CKPT_FNV_SEED);
    printf("final parameters: %zu floats, fingerprint %016llx\n", t->model.nparams,
           (unsigned long long)fp);
  }
}
