/* braid-train's command line: every flag, its default, its check. */
#ifndef TRAIN_OPTIONS_H_
#define TRAIN_OPTIONS_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cores.h"
#include "model.h"
#include "optim.h"
#include "sync.h"

#define OPT_PATH_MAX 4096

typedef enum { PROGRESS_AUTO, PROGRESS_ALWAYS, PROGRESS_NEVER } progress_mode_t;

typedef struct {
  model_spec_t model;
  char data_dir[OPT_PATH_MAX];
  int limit_train, limit_test; /* 0: the whole set */
  int epochs, global_batch;
  optim_config_t optim; /* lr, momentum, weight decay, warmup, schedule */
  uint64_t seed;
  double bucket_mb, first_bucket_mb;
  int overlap;
  int deterministic; /* reductions in Braid's canonical order (braidCommSetDeterministic) */
  sync_spec_t sync;  /* --sync and --compress */
  int blas_threads;
  share_mode_t share_cores;
  int check_sync; /* every N steps; 0: at the end of each epoch only */
  char checkpoint[OPT_PATH_MAX];
  int checkpoint_every; /* steps; 0: at the end of each epoch */
  int resume;
  char csv[OPT_PATH_MAX]; /* "" : none */
  char plot[OPT_PATH_MAX];
  progress_mode_t progress;
  /* testing aids */
  long stop_after_steps; /* 0: never */
  int diverge_rank;      /* -1: none */
  long diverge_step;
} options_t;

/* Returns 0 to run, 1 when --help was printed, -1 on a bad command line (message printed when
 * `speak`). */
int options_parse(int argc, char** argv, options_t* o, int speak);

/* A line that identifies what a checkpoint must match. */
void options_config_string(const options_t* o, char* out, size_t outlen);

/* The flags in effect, for the log. */
void options_print(const options_t* o, FILE* out);

#endif /* TRAIN_OPTIONS_H_ */
