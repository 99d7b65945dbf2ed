/* The training run: setup (communicator, data, model, buckets, resume), the epoch and step
 * loop, evaluation, the per-epoch report, checkpoints and the parameter-sync check. */
#ifndef TRAIN_TRAIN_H_
#define TRAIN_TRAIN_H_

#include <stdint.h>

#include "buckets.h"
#include "checkpoint.h"
#include "idx.h"
#include "launch.h"
#include "model.h"
#include "optim.h"
#include "options.h"
#include "report.h"
#include "rng.h"
#include "shard.h"
#include "sync.h"

/* The current epoch's running sums of this rank. A checkpoint holds their sums over all ranks
 * (rank 0 takes them back on resume, the others start from zero) and rank 0's elapsed time. */
enum {
  PART_LOSS,
  PART_CORRECT,
  PART_SEEN,
  PART_BUSY,
  PART_WAIT,
  PART_HIDDEN,
  PART_SENT, /* training bytes handed to Braid */
  PART_ELAPSED
};

typedef struct {
  const options_t* o;
  launch_t* launch;
  int rank, world;
  ncclComm_t comm;
  idx_set_t train, test;
  shard_plan_t plan;
  int max_local; /* largest per-rank batch */
  model_t model;
  float* velocity;
  uint8_t* labels;
  buckets_t buckets;
  sync_t sync;
  double wire_seen; /* training bytes already in partial[PART_SENT] */
  cores_t cores;
  optim_config_t optim;
  train_rng_t rng;
  char config[CKPT_CONFIG_LEN];
  char desc[256]; /* the model, for the plot's title (outlives the model) */
  /* where the run is */
  int epoch, step; /* next step to run */
  int64_t global_step;
  double partial[CKPT_PARTIALS];
  epoch_row_t* history;
  int nhistory;
  uint64_t* fingerprints; /* one per rank, for --check-sync */
  float* states;          /* rank 0: every rank's checkpoint state; the others: their own */
} trainer_t;

/* Everything before the first step; exits with a message on failure. */
void trainer_setup(trainer_t* t, const options_t* o, launch_t* launch);

/* The epochs; exits with a message on failure. */
void trainer_run(trainer_t* t);

/* Ends communication (buckets, stream, communicator). */
void trainer_close_comm(trainer_t* t);

/* Rank 0: says where the CSV is and makes the plot. */
void trainer_outputs(trainer_t* t);

/* Frees everything (closing communication if still open). */
void trainer_teardown(trainer_t* t);

#endif /* TRAIN_TRAIN_H_ */
