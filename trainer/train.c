/* Setting a run up: the communicator first (so that a rank that cannot read its data tells
 * the others instead of leaving them waiting), then data, model, buckets, and either fresh
 * weights from rank 0 or rank 0's checkpoint, broadcast so every rank starts identical. */
#include "train.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "braid.h"
#include "failure.h"

#define INIT_PURPOSE 0x494e4954ull /* "INIT": the weight-init stream */
#define IMAGE_SIDE 28

/* Every rank learns whether all ranks are fine; the failing one has said why. */
static void agree_or_stop(trainer_t* t, int ok, const char* what) {
  int32_t all = ok;
  wire_add_other(&t->sync.wire, ncclInt32, 1);
  train_check_nccl(t, ncclAllReduce(&all, &all, 1, ncclInt32, ncclMin, t->comm, NULL), what);
  if (!all) {
    if (ok)
      fprintf(stderr, "braid-train: rank %d: stopping: another rank failed %s\n", t->rank, what);
    exit(EXIT_FAILURE);
  }
}

static void init_comm(trainer_t* t) {
  char err[TRAIN_ERR_MAX];
  ncclUniqueId id;
  if (launch_unique_id(t->launch, &id, err, sizeof(err)) != ncclSuccess) train_die(t, "%s", err);
  ncclResult_t res = ncclCommInitRank(&t->comm, t->world, id, t->rank);
  if (res != ncclSuccess) {
    train_die(t, "ncclCommInitRank (%d ranks) failed: %s (%s)", t->world, ncclGetErrorString(res),
              ncclGetLastError(NULL));
  }
  /* every rank sets it, before the first call: the ranks must agree on the mode */
  if (t->o->deterministic && (res = braidCommSetDeterministic(t->comm, 1)) != ncclSuccess)
    train_die(t, "braidCommSetDeterministic failed: %s", ncclGetErrorString(res));
}

static int limit(int have, int want) {
  return want > 0 && want < have ? want : have;
}

static int load_data(trainer_t* t, char* err, size_t errlen) {
  const options_t* o = t->o;
  if (idx_load_set(o->data_dir, "train", &t->train, err, errlen) != 0 ||
      idx_load_set(o->data_dir, "t10k", &t->test, err, errlen) != 0) {
    size_t used = strlen(err);
    if (strcmp(o->data_dir, "/usr/share/datasets/fashion-mnist") == 0)
      snprintf(err + used, errlen - used,
               " (install Debian's dataset-fashion-mnist, or give --data DIR)");
    return -1;
  }
  if (t->train.rows != IMAGE_SIDE || t->train.cols != IMAGE_SIDE || t->test.rows != IMAGE_SIDE ||
      t->test.cols != IMAGE_SIDE) {
    snprintf(err, errlen, "%s: images are %dx%d, Fashion-MNIST's are %dx%d", o->data_dir,
             t->train.rows, t->train.cols, IMAGE_SIDE, IMAGE_SIDE);
    return -1;
  }
  t->train.count = limit(t->train.count, o->limit_train);
  t->test.count = limit(t->test.count, o->limit_test);
  if (t->train.count < o->global_batch) {
    snprintf(err, errlen, "%d training images cannot fill one global batch of %d", t->train.count,
             o->global_batch);
    return -1;
  }
  return 0;
}

static int build(trainer_t* t, char* err, size_t errlen) {
  const options_t* o = t->o;
  t->max_local = shard_max_local(o->global_batch, t->world);
  if (model_build(&t->model, &o->model, 1, IMAGE_SIDE, IMAGE_SIDE, IDX_NUM_CLASSES, t->max_local,
                  err, errlen) != 0)
    return -1;
  if (t->cores.sharing) t->model.turn = cores_turn;
  const size_t n = t->model.nparams;
  t->velocity = calloc(n, sizeof(float));
  t->labels = calloc((size_t)t->max_local, 1);
  t->history = calloc((size_t)o->epochs, sizeof(epoch_row_t));
  t->fingerprints = calloc((size_t)t->world, sizeof(uint64_t));
  if (!t->velocity || !t->labels || !t->history || !t->fingerprints ||
      shard_init(&t->plan, t->train.count, o->global_batch, t->rank, t->world, o->seed) != 0) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  t->optim = o->optim;
  t->optim.epochs = o->epochs;
  t->optim.steps_per_epoch = t->plan.steps_per_epoch;
  t->optim.global_batch = o->global_batch;
  if (buckets_init(&t->buckets, t->comm, n, o->first_bucket_mb, o->bucket_mb, o->overlap,
                   sync_streams(&o->sync), err, errlen) != 0)
    return -1;
  t->buckets.fixed_grid = o->deterministic;
  if (sync_init(&t->sync, &o->sync, t->comm, t->rank, t->world, &t->buckets, &t->model, err,
                errlen) != 0)
    return -1;
  size_t states = sync_state_floats(&t->sync) * (size_t)(t->rank == 0 ? t->world : 1);
  if ((t->states = malloc(states * sizeof(float))) == NULL) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- resume */

/* Rank 0 reads the file; its size (0: none, -1: unreadable) and bytes go to every rank. */
static int64_t share_checkpoint(trainer_t* t, ckpt_blob_t* blob) {
  char err[TRAIN_ERR_MAX] = "";
  int64_t size = 0;
  struct stat st;
  if (t->rank == 0 && stat(t->o->checkpoint, &st) == 0) {
    size = ckpt_read(t->o->checkpoint, blob, err, sizeof(err)) == 0 ? (int64_t)blob->bytes : -1;
    if (size < 0) fprintf(stderr, "braid-train: rank 0: %s\n", err);
  }
  wire_add_other(&t->sync.wire, ncclInt64, 1);
  train_check_nccl(t, ncclBroadcast(&size, &size, 1, ncclInt64, 0, t->comm, NULL),
                   "sharing the checkpoint");
  if (size <= 0) return size;
  if (t->rank != 0) {
    blob->bytes = (size_t)size;
    if ((blob->data = malloc(blob->bytes)) == NULL)
      train_die(t, "out of memory for the checkpoint");
  }
  wire_add_other(&t->sync.wire, ncclUint8, blob->bytes);
  train_check_nccl(t,
                   ncclBroadcast(blob->data, blob->data, blob->bytes, ncclUint8, 0, t->comm, NULL),
                   "sharing the checkpoint");
  return size;
}

static int apply_checkpoint(trainer_t* t, const ckpt_blob_t* blob, char* err, size_t errlen) {
  ckpt_meta_t meta;
  if (ckpt_parse(blob, &meta, t->history, t->o->epochs, t->model.params, t->velocity,
                 t->model.nparams, err, errlen) != 0)
    return -1;
  meta.config[CKPT_CONFIG_LEN - 1] = '\0';
  if (strncmp(meta.config, t->config, CKPT_CONFIG_LEN) != 0 || meta.seed != t->o->seed) {
    snprintf(err, errlen,
             "the checkpoint is of another run: it has '%s seed=%llu', this run is "
             "'%s seed=%llu'",
             meta.config, (unsigned long long)meta.seed, t->config, (unsigned long long)t->o->seed);
    return -1;
  }
  int ranks;
  size_t floats;
  const float* states = ckpt_states(blob, &ranks, &floats);
  if (states != NULL && ranks == t->world && floats == sync_state_floats(&t->sync)) {
    sync_state_load(&t->sync, t->velocity, states + floats * (size_t)t->rank);
  } else if (t->o->sync.kind != SYNC_ALLREDUCE || compress_lossy(&t->o->sync.compress)) {
    char scheme[64];
    sync_describe(&t->o->sync, scheme, sizeof(scheme));
    snprintf(err, errlen,
             "the checkpoint holds the states of %d ranks; '%s' needs each of this run's %d "
             "ranks' own",
             ranks, scheme, t->world);
    return -1;
  } else if (t->rank == 0) {
    fprintf(stderr,
            "braid-train: note: the checkpoint was written by %d ranks, this run has %d: "
            "it continues, but not bitwise as the original would have\n",
            meta.world, t->world);
  }
  t->epoch = meta.epoch;
  t->step = meta.step;
  t->global_step = meta.global_step;
  memcpy(t->rng.s, meta.rng, sizeof(t->rng.s));
  /* rank 0 carries the sums of all ranks; everyone keeps rank 0's elapsed time */
  if (t->rank == 0) memcpy(t->partial, meta.partial, sizeof(t->partial));
  t->partial[PART_ELAPSED] = meta.partial[PART_ELAPSED];
  t->nhistory = meta.nhistory;
  return 0;
}

/* 1 when a checkpoint was applied, 0 when there was none to resume from. */
static int resume(trainer_t* t) {
  ckpt_blob_t blob = {0};
  int64_t size = share_checkpoint(t, &blob);
  if (size < 0) {
    if (t->rank != 0)
      fprintf(stderr,
              "braid-train: rank %d: stopping: rank 0 could not read "
              "the checkpoint\n",
              t->rank);
    exit(EXIT_FAILURE);
  }
  if (size == 0) {
    if (t->rank == 0)
      printf("# no checkpoint at %s yet: starting from scratch\n", t->o->checkpoint);
    return 0;
  }
  char err[TRAIN_ERR_MAX] = "";
  int ok = apply_checkpoint(t, &blob, err, sizeof(err)) == 0;
  ckpt_blob_free(&blob);
  if (!ok && t->rank == 0) fprintf(stderr, "braid-train: rank 0: %s: %s\n", t->o->checkpoint, err);
  agree_or_stop(t, ok, "to load the checkpoint");
  if (t->rank == 0)
    printf("# resumed from %s: epoch %d, step %d (%lld updates done)\n", t->o->checkpoint,
           t->epoch + 1, t->step, (long long)t->global_step);
  return 1;
}

/* ---------------------------------------------------------------- setup */

static void fresh_start(trainer_t* t) {
  train_rng_seed(&t->rng, t->o->seed, INIT_PURPOSE);
  model_init_params(&t->model, &t->rng);
  /* Identical by construction; the broadcast makes it so whatever the ranks' libm does. */
  wire_add_other(&t->sync.wire, ncclFloat, t->model.nparams);
  train_check_nccl(t,
                   ncclBroadcast(t->model.params, t->model.params, t->model.nparams, ncclFloat, 0,
                                 t->comm, NULL),
                   "broadcasting the initial weights");
  sync_start(&t->sync);
}

static void print_header(const trainer_t* t) {
  const options_t* o = t->o;
  printf("# braid-train: %s\n", t->model.desc);
  printf(
      "# %d rank%s (%s), global batch %d (%d per rank), %d steps/epoch, %d train / %d test "
      "images from %s\n",
      t->world, t->world > 1 ? "s" : "", t->launch->how, o->global_batch, t->max_local,
      t->plan.steps_per_epoch, t->train.count, t->test.count, o->data_dir);
  printf("# %d gradient bucket%s (first %g MiB, then %g MiB), %s; %d rank%s on %d cores here\n",
         t->buckets.nbuckets, t->buckets.nbuckets > 1 ? "s" : "", o->first_bucket_mb, o->bucket_mb,
         !sync_uses_buckets(&t->sync) ? "kept on each rank (the scheme sends parameters)"
         : o->overlap                 ? "sent overlapped with backward"
                                      : "sent after backward",
         t->launch->local_ranks, t->launch->local_ranks > 1 ? "s" : "", t->launch->cores);
  char sync[32], code[32];
  sync_format(&o->sync, sync, sizeof(sync));
  compress_format(&o->sync.compress, code, sizeof(code));
  printf("# synchronisation: --sync %s --compress %s\n", sync, code);
  const char* spin = getenv("BRAID_SPIN_US");
  if (t->cores.sharing)
    printf("# cores: ranks take turns between layers (rank 0: %s); ", t->cores.note);
  else
    printf("# cores: not shared, no turns; ");
  printf("BRAID_SPIN_US %s\n", spin ? spin : "unset (the library's default)");
  options_print(o, stdout);
}

void trainer_setup(trainer_t* t, const options_t* o, launch_t* launch) {
  memset(t, 0, sizeof(*t));
  t->o = o;
  t->launch = launch;
  t->rank = launch->rank;
  t->world = launch->world;
  openblas_set_num_threads(o->blas_threads);
  options_config_string(o, t->config, sizeof(t->config));
  if (o->global_batch < t->world)
    train_die(t, "--batch %d is smaller than the %d ranks", o->global_batch, t->world);
  cores_plan(&t->cores, launch, o->share_cores); /* before Braid starts its threads */
  init_comm(t);
  char err[TRAIN_ERR_MAX] = "";
  int ok = load_data(t, err, sizeof(err)) == 0 && build(t, err, sizeof(err)) == 0;
  if (!ok) fprintf(stderr, "braid-train: rank %d: %s\n", t->rank, err);
  agree_or_stop(t, ok, "to start");
  snprintf(t->desc, sizeof(t->desc), "%s", t->model.desc);
  if (!(o->resume && resume(t))) fresh_start(t);
  if (t->rank == 0) print_header(t);
}

void trainer_close_comm(trainer_t* t) {
  sync_free(&t->sync);
  buckets_destroy(&t->buckets);
  if (t->comm) ncclCommDestroy(t->comm);
  t->comm = NULL;
}

void trainer_teardown(trainer_t* t) {
  trainer_close_comm(t);
  model_free(&t->model);
  shard_free(&t->plan);
  idx_free(&t->train);
  idx_free(&t->test);
  free(t->velocity);
  free(t->labels);
  free(t->history);
  free(t->fingerprints);
  free(t->states);
}

void trainer_outputs(trainer_t* t) {
  const options_t* o = t->o;
  if (t->rank != 0 || t->nhistory == 0) return;
  char err[TRAIN_ERR_MAX];
  if (o->csv[0]) printf("csv: %s\n", o->csv);
  if (o->csv[0] && o->plot[0]) {
    char title[320];
    snprintf(title, sizeof(title), "braid-train %s, %d rank%s", t->desc, t->world,
             t->world > 1 ? "s" : "");
    if (report_plot(o->csv, o->plot, title, t->history[t->nhistory - 1].epoch, err, sizeof(err)) ==
        0)
      printf("plot: %s\n", o->plot);
    else
      fprintf(stderr, "braid-train: no plot: %s\n", err);
  }
}
