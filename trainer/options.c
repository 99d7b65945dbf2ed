/* Flag parsing with getopt_long. Defaults live in one function, and --help prints them from
 * there, so the two cannot drift apart. */
#include "options.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

static void set_defaults(options_t* o) {
  memset(o, 0, sizeof(*o));
  o->model.kind = MODEL_MLP;
  o->model.hidden[0] = 512;
  o->model.hidden[1] = 256;
  o->model.nhidden = 2;
  o->model.channels[0] = 16;
  o->model.channels[1] = 32;
  o->model.nchannels = 2;
  o->model.kernel = 5;
  snprintf(o->data_dir, sizeof(o->data_dir), "%s", DEFAULT_DATA);
  o->epochs = 10;
  o->global_batch = 512;
  o->optim.lr = 0.1;
  o->optim.momentum = 0.9;
  o->optim.weight_decay = 5e-4;
  o->optim.warmup_epochs = 1;
  o->optim.schedule = SCHEDULE_COSINE;
  o->optim.step_epochs = 5;
  o->optim.gamma = 0.1;
  o->seed = 1;
  o->bucket_mb = 1.0;
  o->first_bucket_mb = 0.25;
  o->overlap = 1;
  o->sync.kind = SYNC_ALLREDUCE;
  o->sync.compress.kind = COMPRESS_NONE;
  o->blas_threads = 1;
  snprintf(o->csv, sizeof(o->csv), "braid-train.csv");
  snprintf(o->plot, sizeof(o->plot), "braid-train.png");
  o->diverge_rank = -1;
}

static void usage(FILE* out) {
  options_t d;
  set_defaults(&d);
  fprintf(
      out,
      "usage: braid-train [flags]          (one rank)\n"
      "       mpirun -np N braid-train [flags]\n"
      "       NCCL_COMM_ID=host:port RANK=r WORLD_SIZE=N braid-train [flags]   (each rank)\n"
      "       NCCL_COMM_ID=host:port srun -n N braid-train [flags]   (or MPICH's mpiexec)\n"
      "\n"
      "Distributed SGD on Fashion-MNIST over Braid, one scheme of the distributed-training\n"
      "taxonomy at a time (--sync, --compress); it reports accuracy, time and bytes sent.\n"
      "\n"
      "model\n"
      "  --model mlp|cnn          network (default mlp)\n"
      "  --hidden LIST            hidden dense widths, comma list or 'none' (default 512,256\n"
      "                           for mlp, 128 for cnn)\n"
      "  --channels LIST          cnn: output channels of each conv+relu+maxpool stage\n"
      "                           (default 16,32)\n"
      "  --kernel K               cnn: odd kernel size, padded to keep the size (default %d)\n"
      "data\n"
      "  --data DIR               IDX files, .gz or plain (default %s)\n"
      "  --limit-train N          use the first N training images (default 0: all 60000)\n"
      "  --limit-test N           use the first N test images (default 0: all 10000)\n"
      "training\n"
      "  --epochs N               epochs (default %d)\n"
      "  --batch N                global batch, split across ranks (default %d)\n"
      "  --lr X                   learning rate for a global batch of %d, scaled linearly\n"
      "                           with --batch (default %g)\n"
      "  --momentum X             SGD momentum (default %g)\n"
      "  --weight-decay X         L2 on weights, not biases (default %g)\n"
      "  --warmup-epochs X        linear warmup, may be fractional (default %g)\n"
      "  --schedule cosine|step   decay after warmup (default cosine)\n"
      "  --step-epochs N          step: multiply the rate by --gamma every N epochs (default %d)\n"
      "  --gamma X                step: the factor (default %g)\n"
      "  --seed N                 weights and shuffles; same seed, same run (default %llu)\n"
      "synchronisation (the taxonomy: how workers agree, and how much they send)\n"
      "  --sync SCHEME            how the ranks' models stay together (default allreduce):\n"
      "                             allreduce  synchronous data parallelism: gradients\n"
      "                                        all-reduced every step, overlapped with backward\n"
      "                             ps[:R]     centralised parameter server on rank R (default\n"
      "                                        0): gradients reduced to R, R steps the optimizer,\n"
      "                                        new weights broadcast; workers hold no optimizer\n"
      "                                        state\n"
      "                             local:K    local SGD / periodic model averaging: each rank\n"
      "                                        steps alone, parameters averaged every K steps\n"
      "                                        (momentum stays local)\n"
      "                             gossip     decentralised averaging (D-PSGD): each step a rank\n"
      "                                        averages with its two ring neighbours; one final\n"
      "                                        all-reduce averages the model\n"
      "                             stale:S    bounded staleness (S <= %d): each step's "
      "all-reduce\n"
      "                                        runs behind S steps of compute, its mean applied S\n"
      "                                        steps late (delayed gradient averaging: a rank's\n"
      "                                        own gradient at once, the mean's correction later)\n"
      "  --compress CODE          what allreduce, ps and local send (default none):\n"
      "                             none       full precision (float32)\n"
      "                             fp16|bf16  low precision: all-reduced in that type\n"
      "                             fp8        low precision: e4m3 with a per-bucket scale the\n"
      "                                        ranks agree on\n"
      "                             topk:F     sparsification: the largest fraction F of each\n"
      "                                        bucket as (index, value) pairs, all-gathered\n"
      "                           lossy codes keep an error-feedback residual per rank\n"
      "communication\n"
      "  --bucket-mb X            gradient bucket size in MiB (default %g)\n"
      "  --first-bucket-mb X      the first bucket, small so it leaves early (default %g)\n"
      "  --no-overlap             all-reduce only after backward (for comparison)\n"
      "  --deterministic          every reduction in Braid's canonical order: the final\n"
      "                           weights do not depend on bucket sizes, NCCL_ALGO or the\n"
      "                           node layout (docs/determinism.md)\n"
      "  --check-sync N           verify every N steps that all ranks hold bitwise the same\n"
      "                           parameters; 0: at the end of each epoch (default 0)\n"
      "compute\n"
      "  --blas-threads N         OpenBLAS threads per rank (default %d)\n"
      "  --share-cores auto|on|off   where ranks outnumber this host's cores, pin each rank\n"
      "                           to one and take turns on it between layers (default auto:\n"
      "                           when they do; on: always)\n"
      "checkpoints\n"
      "  --checkpoint PATH        write checkpoints to PATH (default: none)\n"
      "  --checkpoint-every K     every K steps; 0: at the end of each epoch (default 0)\n"
      "  --resume                 continue from --checkpoint if it exists\n"
      "output (rank 0)\n"
      "  --csv PATH               per-epoch results, 'none' for no file (default %s)\n"
      "  --plot PATH              PNG of loss and accuracy made with gnuplot at the end,\n"
      "                           'none' for no plot (default %s)\n"
      "  --progress auto|always|never   progress bar on stderr (default auto: a terminal)\n"
      "testing aids\n"
      "  --stop-after-steps N     exit (status 3) after N steps in total, without saving,\n"
      "                           as if killed (default 0: never)\n"
      "  --inject-divergence R:S  rank R perturbs one weight after step S (default none)\n"
      "  --help                   this text\n"
      "\n"
      "Launch: under mpirun rank 0 makes the Braid id and MPI broadcasts it; without MPI\n"
      "set NCCL_COMM_ID=host:port on every rank, and RANK/WORLD_SIZE unless the launcher\n"
      "sets its own (Open MPI's OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/PMI_SIZE of MPICH's\n"
      "mpiexec, Slurm's SLURM_PROCID/SLURM_NTASKS). NCCL_* and BRAID_* variables tune the\n"
      "library (docs/environment.md).\n",
      d.model.kernel, d.data_dir, d.epochs, d.global_batch, OPTIM_REFERENCE_BATCH, d.optim.lr,
      d.optim.momentum, d.optim.weight_decay, d.optim.warmup_epochs, d.optim.step_epochs,
      d.optim.gamma, (unsigned long long)d.seed, SYNC_MAX_STALE, d.bucket_mb, d.first_bucket_mb,
      d.blas_threads, d.csv, d.plot);
}

static int bad(int speak, const char* flag, const char* value, const char* want) {
  if (speak) fprintf(stderr, "braid-train: %s '%s': expected %s (see --help)\n", flag, value, want);
  return -1;
}

static int parse_long(const char* flag, const char* s, long lo, long hi, long* out, int speak) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi) {
    char want[96];
    snprintf(want, sizeof(want), "an integer in %ld..%ld", lo, hi);
    return bad(speak, flag, s, want);
  }
  *out = v;
  return 0;
}

static int parse_int(const char* flag, const char* s, long lo, long hi, int* out, int speak) {
  long v;
  if (parse_long(flag, s, lo, hi, &v, speak)) return -1;
  *out = (int)v;
  return 0;
}

static int parse_double(const char* flag, const char* s, double lo, double hi, double* out,
                        int speak) {
  char* end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi) {
    char want[96];
    snprintf(want, sizeof(want), "a number in %g..%g", lo, hi);
    return bad(speak, flag, s, want);
  }
  *out = v;
  return 0;
}

static int parse_path(const char* flag, const char* s, char* out, int speak) {
  if (strlen(s) >= OPT_PATH_MAX) return bad(speak, flag, s, "a shorter path");
  snprintf(out, OPT_PATH_MAX, "%s", strcmp(s, "none") == 0 ? "" : s);
  return 0;
}

static int parse_divergence(const char* s, options_t* o, int speak) {
  int rank;
  long step;
  char tail;
  if (sscanf(s, "%d:%ld%c", &rank, &step, &tail) != 2 || rank < 0 || step < 1)
    return bad(speak, "--inject-divergence", s, "RANK:STEP with STEP >= 1");
  o->diverge_rank = rank;
  o->diverge_step = step;
  return 0;
}

enum {
  OPT_MODEL = 256,
  OPT_HIDDEN,
  OPT_CHANNELS,
  OPT_KERNEL,
  OPT_DATA,
  OPT_LIMIT_TRAIN,
  OPT_LIMIT_TEST,
  OPT_EPOCHS,
  OPT_BATCH,
  OPT_LR,
  OPT_MOMENTUM,
  OPT_WD,
  OPT_WARMUP,
  OPT_SCHEDULE,
  OPT_STEP_EPOCHS,
  OPT_GAMMA,
  OPT_SEED,
  OPT_BUCKET,
  OPT_FIRST_BUCKET,
  OPT_NO_OVERLAP,
  OPT_DETERMINISTIC,
  OPT_SYNC,
  OPT_COMPRESS,
  OPT_CHECK_SYNC,
  OPT_BLAS,
  OPT_SHARE_CORES,
  OPT_CKPT,
  OPT_CKPT_EVERY,
  OPT_RESUME,
  OPT_CSV,
  OPT_PLOT,
  OPT_PROGRESS,
  OPT_STOP_AFTER,
  OPT_DIVERGE,
  OPT_HELP
};

static const struct option kLong[] = {
    {"model", 1, 0, OPT_MODEL},
    {"hidden", 1, 0, OPT_HIDDEN},
    {"channels", 1, 0, OPT_CHANNELS},
    {"kernel", 1, 0, OPT_KERNEL},
    {"data", 1, 0, OPT_DATA},
    {"limit-train", 1, 0, OPT_LIMIT_TRAIN},
    {"limit-test", 1, 0, OPT_LIMIT_TEST},
    {"epochs", 1, 0, OPT_EPOCHS},
    {"batch", 1, 0, OPT_BATCH},
    {"lr", 1, 0, OPT_LR},
    {"momentum", 1, 0, OPT_MOMENTUM},
    {"weight-decay", 1, 0, OPT_WD},
    {"warmup-epochs", 1, 0, OPT_WARMUP},
    {"schedule", 1, 0, OPT_SCHEDULE},
    {"step-epochs", 1, 0, OPT_STEP_EPOCHS},
    {"gamma", 1, 0, OPT_GAMMA},
    {"seed", 1, 0, OPT_SEED},
    {"bucket-mb", 1, 0, OPT_BUCKET},
    {"first-bucket-mb", 1, 0, OPT_FIRST_BUCKET},
    {"no-overlap", 0, 0, OPT_NO_OVERLAP},
    {"deterministic", 0, 0, OPT_DETERMINISTIC},
    {"sync", 1, 0, OPT_SYNC},
    {"compress", 1, 0, OPT_COMPRESS},
    {"check-sync", 1, 0, OPT_CHECK_SYNC},
    {"blas-threads", 1, 0, OPT_BLAS},
    {"share-cores", 1, 0, OPT_SHARE_CORES},
    {"checkpoint", 1, 0, OPT_CKPT},
    {"checkpoint-every", 1, 0, OPT_CKPT_EVERY},
    {"resume", 0, 0, OPT_RESUME},
    {"csv", 1, 0, OPT_CSV},
    {"plot", 1, 0, OPT_PLOT},
    {"progress", 1, 0, OPT_PROGRESS},
    {"stop-after-steps", 1, 0, OPT_STOP_AFTER},
    {"inject-divergence", 1, 0, OPT_DIVERGE},
    {"help", 0, 0, OPT_HELP},
    {0, 0, 0, 0},
};

static int parse_widths(const char* flag, const char* s, int* out, int* n, int allow_none,
                        int speak) {
  if (model_widths_parse(s, out, n) != 0 || (*n == 0 && !allow_none)) {
    char want[96];
    snprintf(want, sizeof(want), "up to %d positive integers separated by commas%s",
             MODEL_MAX_WIDTHS, allow_none ? ", or 'none'" : "");
    return bad(speak, flag, s, want);
  }
  return 0;
}

static int parse_choice(const char* flag, const char* s, const char* const* names, int n, int* out,
                        const char* want, int speak) {
  for (int i = 0; i < n; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = i;
      return 0;
    }
  return bad(speak, flag, s, want);
}

static const char* const kShare[] = {"auto", "on", "off"}; /* share_mode_t order */

/* One flag; `hidden_given` tracks whether --hidden overrode the per-model default. */
static int apply(options_t* o, int opt, const char* v, int* hidden_given, int speak) {
  static const char* const kSchedules[] = {"cosine", "step"};
  static const char* const kProgress[] = {"auto", "always", "never"};
  static const char* const kModels[] = {"mlp", "cnn"};
  long l;
  int choice = 0, rc = 0;
  switch (opt) {
    case OPT_MODEL:
      rc = parse_choice("--model", v, kModels, 2, &choice, "mlp or cnn", speak);
      o->model.kind = choice ? MODEL_CNN : MODEL_MLP;
      return rc;
    case OPT_HIDDEN:
      *hidden_given = 1;
      return parse_widths("--hidden", v, o->model.hidden, &o->model.nhidden, 1, speak);
    case OPT_CHANNELS:
      return parse_widths("--channels", v, o->model.channels, &o->model.nchannels, 0, speak);
    case OPT_KERNEL:
      return parse_int("--kernel", v, 1, 27, &o->model.kernel, speak);
    case OPT_DATA:
      return parse_path("--data", v, o->data_dir, speak);
    case OPT_LIMIT_TRAIN:
      return parse_int("--limit-train", v, 0, 1 << 30, &o->limit_train, speak);
    case OPT_LIMIT_TEST:
      return parse_int("--limit-test", v, 0, 1 << 30, &o->limit_test, speak);
    case OPT_EPOCHS:
      return parse_int("--epochs", v, 1, 100000, &o->epochs, speak);
    case OPT_BATCH:
      return parse_int("--batch", v, 1, 1 << 20, &o->global_batch, speak);
    case OPT_LR:
      return parse_double("--lr", v, 0, 1e3, &o->optim.lr, speak);
    case OPT_MOMENTUM:
      return parse_double("--momentum", v, 0, 0.9999, &o->optim.momentum, speak);
    case OPT_WD:
      return parse_double("--weight-decay", v, 0, 1, &o->optim.weight_decay, speak);
    case OPT_WARMUP:
      return parse_double("--warmup-epochs", v, 0, 1e5, &o->optim.warmup_epochs, speak);
    case OPT_SCHEDULE:
      rc = parse_choice("--schedule", v, kSchedules, 2, &choice, "cosine or step", speak);
      o->optim.schedule = choice ? SCHEDULE_STEP : SCHEDULE_COSINE;
      return rc;
    case OPT_STEP_EPOCHS:
      return parse_int("--step-epochs", v, 1, 100000, &o->optim.step_epochs, speak);
    case OPT_GAMMA:
      return parse_double("--gamma", v, 0, 1, &o->optim.gamma, speak);
    case OPT_SEED:
      rc = parse_long("--seed", v, 0, __LONG_MAX__, &l, speak);
      o->seed = (uint64_t)l;
      return rc;
    case OPT_BUCKET:
      return parse_double("--bucket-mb", v, 1e-4, 1024, &o->bucket_mb, speak);
    case OPT_FIRST_BUCKET:
      return parse_double("--first-bucket-mb", v, 1e-4, 1024, &o->first_bucket_mb, speak);
    case OPT_NO_OVERLAP:
      o->overlap = 0;
      return 0;
    case OPT_DETERMINISTIC:
      o->deterministic = 1;
      return 0;
    case OPT_SYNC:
      if (sync_parse(v, &o->sync) == 0) return 0;
      return bad(speak, "--sync", v, "allreduce, ps[:R], local:K, gossip or stale:S (see --help)");
    case OPT_COMPRESS:
      if (compress_parse(v, &o->sync.compress) == 0) return 0;
      return bad(speak, "--compress", v, "none, fp16, bf16, fp8 or topk:F with F in (0, 1]");
    case OPT_CHECK_SYNC:
      return parse_int("--check-sync", v, 0, 1 << 30, &o->check_sync, speak);
    case OPT_BLAS:
      return parse_int("--blas-threads", v, 1, 1024, &o->blas_threads, speak);
    case OPT_SHARE_CORES:
      rc = parse_choice("--share-cores", v, kShare, 3, &choice, "auto, on or off", speak);
      o->share_cores = (share_mode_t)choice;
      return rc;
    case OPT_CKPT:
      return parse_path("--checkpoint", v, o->checkpoint, speak);
    case OPT_CKPT_EVERY:
      return parse_int("--checkpoint-every", v, 0, 1 << 30, &o->checkpoint_every, speak);
    case OPT_RESUME:
      o->resume = 1;
      return 0;
    case OPT_CSV:
      return parse_path("--csv", v, o->csv, speak);
    case OPT_PLOT:
      return parse_path("--plot", v, o->plot, speak);
    case OPT_PROGRESS:
      rc = parse_choice("--progress", v, kProgress, 3, &choice, "auto, always or never", speak);
      o->progress = (progress_mode_t)choice;
      return rc;
    case OPT_STOP_AFTER:
      return parse_long("--stop-after-steps", v, 0, __LONG_MAX__, &o->stop_after_steps, speak);
    case OPT_DIVERGE:
      return parse_divergence(v, o, speak);
    default:
      return -1;
  }
}

int options_parse(int argc, char** argv, options_t* o, int speak) {
  set_defaults(o);
  int hidden_given = 0, opt;
  opterr = 0;
  optind = 1;
  while ((opt = getopt_long(argc, argv, "", kLong, NULL)) != -1) {
    if (opt == OPT_HELP) {
      if (speak) usage(stdout);
      return 1;
    }
    if (opt == '?') {
      if (speak)
        fprintf(stderr, "braid-train: unknown flag or missing value: %s (see --help)\n",
                argv[optind - 1]);
      return -1;
    }
    if (apply(o, opt, optarg, &hidden_given, speak) != 0) return -1;
  }
  if (optind < argc) {
    if (speak)
      fprintf(stderr, "braid-train: unexpected argument '%s' (see --help)\n", argv[optind]);
    return -1;
  }
  if (o->model.kind == MODEL_CNN && !hidden_given) {
    o->model.hidden[0] = 128;
    o->model.nhidden = 1;
  }
  if (o->model.kind == MODEL_CNN && o->model.kernel % 2 == 0)
    return bad(speak, "--kernel", "even", "an odd size");
  char why[160];
  if (sync_validate(&o->sync, o->sync.kind == SYNC_PS ? o->sync.arg + 1 : 1, why, sizeof(why))) {
    if (speak) fprintf(stderr, "braid-train: %s\n", why);
    return -1;
  }
  if (o->resume && o->checkpoint[0] == '\0') {
    if (speak) fprintf(stderr, "braid-train: --resume needs --checkpoint PATH\n");
    return -1;
  }
  return 0;
}

void options_config_string(const options_t* o, char* out, size_t outlen) {
  char hidden[72], channels[72], sync[32], code[32], scheme[80]; /* 8 widths of 7 digits */
  sync_format(&o->sync, sync, sizeof(sync));
  compress_format(&o->sync.compress, code, sizeof(code));
  snprintf(scheme, sizeof(scheme), "%s compress=%s", sync, code);
  model_widths_format(o->model.hidden, o->model.nhidden, hidden, sizeof(hidden));
  model_widths_format(o->model.channels, o->model.nchannels, channels, sizeof(channels));
  if (o->model.kind == MODEL_CNN)
    snprintf(out, outlen, "model=cnn channels=%s kernel=%d hidden=%s batch=%d train=%d sync=%s",
             channels, o->model.kernel, hidden, o->global_batch, o->limit_train, scheme);
  else
    snprintf(out, outlen, "model=mlp hidden=%s batch=%d train=%d sync=%s", hidden, o->global_batch,
             o->limit_train, scheme);
}

void options_print(const options_t* o, FILE* out) {
  char config[256];
  options_config_string(o, config, sizeof(config));
  fprintf(out,
          "# %s epochs=%d lr=%g momentum=%g weight-decay=%g warmup-epochs=%g schedule=%s "
          "seed=%llu blas-threads=%d share-cores=%s%s\n",
          config, o->epochs, o->optim.lr, o->optim.momentum, o->optim.weight_decay,
          o->optim.warmup_epochs, o->optim.schedule == SCHEDULE_STEP ? "step" : "cosine",
          (unsigned long long)o->seed, o->blas_threads, kShare[o->share_cores],
          o->deterministic ? " deterministic" : "");
}
