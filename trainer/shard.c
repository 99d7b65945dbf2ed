/* Per-epoch permutation (Fisher-Yates on a stream seeded by seed and epoch) and the batch fill.
 * Pixels are normalized with Fashion-MNIST's training-set mean and standard deviation. */
#include "shard.h"

#include <stdlib.h>

#include "rng.h"

#define PIXEL_MEAN 0.2860f
#define PIXEL_STD 0.3530f
#define SHUFFLE_PURPOSE 0x5348554646ull /* "SHUFF": a stream of its own per epoch */

int shard_init(shard_plan_t* p, int nsamples, int global_batch, int rank, int world,
               uint64_t seed) {
  p->nsamples = nsamples;
  p->global_batch = global_batch;
  p->rank = rank;
  p->world = world;
  p->seed = seed;
  p->epoch = -1;
  p->steps_per_epoch = global_batch > 0 ? nsamples / global_batch : 0;
  p->order = p->steps_per_epoch > 0 ? malloc((size_t)nsamples * sizeof(int)) : NULL;
  return p->order ? 0 : -1;
}

void shard_free(shard_plan_t* p) {
  free(p->order);
  p->order = NULL;
}

void shard_begin_epoch(shard_plan_t* p, int epoch) {
  if (p->epoch == epoch) return;
  train_rng_t rng;
  train_rng_seed(&rng, p->seed, SHUFFLE_PURPOSE + (uint64_t)epoch);
  for (int i = 0; i < p->nsamples; i++) p->order[i] = i;
  for (int i = p->nsamples - 1; i > 0; i--) {
    int j = (int)train_rng_below(&rng, (uint64_t)i + 1);
    int t = p->order[i];
    p->order[i] = p->order[j];
    p->order[j] = t;
  }
  p->epoch = epoch;
}

void shard_split(int count, int rank, int world, int* begin, int* end) {
  *begin = (int)((long long)count * rank / world);
  *end = (int)((long long)count * (rank + 1) / world);
}

const int* shard_batch(const shard_plan_t* p, int step, int* count) {
  int begin, end;
  shard_split(p->global_batch, p->rank, p->world, &begin, &end);
  *count = end - begin;
  return p->order + (size_t)step * p->global_batch + begin;
}

int shard_max_local(int global_batch, int world) {
  return (global_batch + world - 1) / world;
}

static void fill_one(const idx_set_t* set, int sample, float* restrict x) {
  const int pixels = set->rows * set->cols;
  const uint8_t* restrict src = set->images + (size_t)sample * pixels;
  const float scale = 1.0f / (255.0f * PIXEL_STD), shift = PIXEL_MEAN / PIXEL_STD;
  for (int k = 0; k < pixels; k++) x[k] = (float)src[k] * scale - shift;
}

void shard_fill(const idx_set_t* set, const int* idx, int n, float* x, uint8_t* y) {
  const size_t pixels = (size_t)set->rows * set->cols;
  for (int i = 0; i < n; i++) {
    fill_one(set, idx[i], x + i * pixels);
    y[i] = set->labels[idx[i]];
  }
}

void shard_fill_range(const idx_set_t* set, int first, int n, float* x, uint8_t* y) {
  const size_t pixels = (size_t)set->rows * set->cols;
  for (int i = 0; i < n; i++) {
    fill_one(set, first + i, x + i * pixels);
    y[i] = set->labels[first + i];
  }
}
