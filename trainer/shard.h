/* Which samples a rank trains on: one seeded permutation per epoch, the same on every rank
 * (a function of seed and epoch only), cut into global batches, each split into contiguous
 * per-rank shards. Also turns a shard's bytes into the model's float input. */
#ifndef TRAIN_SHARD_H_
#define TRAIN_SHARD_H_

#include <stdint.h>

#include "idx.h"

typedef struct {
  int nsamples, global_batch, rank, world;
  int steps_per_epoch; /* full global batches; the remainder of an epoch is dropped */
  uint64_t seed;
  int epoch; /* the epoch `order` was drawn for, -1 before the first */
  int* order;
} shard_plan_t;

/* Returns 0, or -1 when the data cannot fill one global batch or allocation fails. */
int shard_init(shard_plan_t* p, int nsamples, int global_batch, int rank, int world, uint64_t seed);
void shard_free(shard_plan_t* p);

/* Draws the permutation of `epoch` (idempotent). */
void shard_begin_epoch(shard_plan_t* p, int epoch);

/* [*begin, *end) of `count` items that rank `rank` of `world` owns: contiguous, sizes differ by
 * at most one, in rank order. Used for global batches and for the test set alike. */
void shard_split(int count, int rank, int world, int* begin, int* end);

/* Sample indices of this rank's shard of global batch `step`; *count gets their number. */
const int* shard_batch(const shard_plan_t* p, int step, int* count);

/* Largest shard any rank gets: the per-rank batch buffers are sized for it. */
int shard_max_local(int global_batch, int world);

/* Pixels of samples idx[0..n) as normalized floats (n x rows*cols) and their labels. */
void shard_fill(const idx_set_t* set, const int* idx, int n, float* x, uint8_t* y);

/* Samples [first, first + n) of a set, in order (evaluation). */
void shard_fill_range(const idx_set_t* set, int first, int n, float* x, uint8_t* y);

#endif /* TRAIN_SHARD_H_ */
