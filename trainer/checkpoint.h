/* Checkpoints: weights, momentum, RNG state, position (epoch, step), the current epoch's
 * running sums and the finished epochs' rows, then every rank's own state (its parameters
 * and momentum, which differ between ranks in some schemes, and what its scheme keeps:
 * residuals, stale gradients, averaging anchors; sync.h), in one file written atomically
 * (temp file, fsync, rename, fsync of the directory) and protected by a checksum. The
 * weights and momentum up front are rank 0's. The layout is this program's structs as they
 * are in memory: resume on the same kind of machine. */
#ifndef TRAIN_CHECKPOINT_H_
#define TRAIN_CHECKPOINT_H_

#include <stddef.h>
#include <stdint.h>

#include "report.h"

#define CKPT_CONFIG_LEN 256
#define CKPT_PARTIALS 8

typedef struct {
  char config[CKPT_CONFIG_LEN]; /* model, data and batch: must match on resume */
  uint64_t seed;
  int32_t world, global_batch;
  int32_t epoch, step; /* the next step to run: `step` of 0-based `epoch` */
  int64_t global_step; /* updates done so far */
  uint64_t rng[4];
  double partial[CKPT_PARTIALS]; /* the current epoch's running sums */
  int32_t nhistory;              /* finished epochs, rows follow the header */
  int32_t pad_;
} ckpt_meta_t;

/* A whole checkpoint in memory (what rank 0 writes, or reads and broadcasts). */
typedef struct {
  void* data;
  size_t bytes;
} ckpt_blob_t;

/* states: state_ranks x state_floats floats, rank after rank (NULL and 0: none). */
int ckpt_build(ckpt_blob_t* blob, const ckpt_meta_t* meta, const epoch_row_t* history,
               const float* params, const float* velocity, size_t nparams, const float* states,
               int state_ranks, size_t state_floats);
int ckpt_write(const char* path, const ckpt_blob_t* blob, char* err, size_t errlen);
int ckpt_read(const char* path, ckpt_blob_t* blob, char* err, size_t errlen);

/* Checks the blob and copies it out. history gets at most max_history rows; params and
 * velocity must hold nparams floats (a different count is an error). */
int ckpt_parse(const ckpt_blob_t* blob, ckpt_meta_t* meta, epoch_row_t* history, int max_history,
               float* params, float* velocity, size_t nparams, char* err, size_t errlen);

/* Parameter count stored in a blob, or 0 when it is not a checkpoint. */
size_t ckpt_nparams(const ckpt_blob_t* blob);

/* The ranks' states of a blob that ckpt_parse accepted: where they start (NULL: none), how
 * many ranks, how many floats each. */
const float* ckpt_states(const ckpt_blob_t* blob, int* ranks, size_t* floats);

void ckpt_blob_free(ckpt_blob_t* blob);

/* FNV-1a over bytes: checkpoint checksum and the parameter fingerprint of --check-sync. */
uint64_t ckpt_fnv1a(const void* data, size_t bytes, uint64_t h);
#define CKPT_FNV_SEED 0xcbf29ce484222325ull

#endif /* TRAIN_CHECKPOINT_H_ */
