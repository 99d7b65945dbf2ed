/* Seeded random numbers for braid-train: xoshiro256** seeded through splitmix64. The whole
 * state is four words, so a checkpoint can save it and a resumed run draws the same numbers. */
#ifndef TRAIN_RNG_H_
#define TRAIN_RNG_H_

#include <math.h>
#include <stdint.h>

typedef struct {
  uint64_t s[4];
} train_rng_t;

static inline uint64_t train_splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Distinct streams for distinct (seed, purpose) pairs: the purpose keeps the weight init and
 * each epoch's shuffle independent of one another. */
static inline void train_rng_seed(train_rng_t* r, uint64_t seed, uint64_t purpose) {
  uint64_t x = seed ^ (purpose * 0xd1342543de82ef95ull);
  for (int i = 0; i < 4; i++) r->s[i] = train_splitmix64(&x);
}

static inline uint64_t train_rng_rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

static inline uint64_t train_rng_next(train_rng_t* r) {
  uint64_t* s = r->s;
  uint64_t result = train_rng_rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = train_rng_rotl(s[3], 45);
  return result;
}

/* Uniform in [0, n) without modulo bias worth worrying about for n < 2^32. */
static inline uint64_t train_rng_below(train_rng_t* r, uint64_t n) {
  return (uint64_t)(((unsigned __int128)train_rng_next(r) * n) >> 64);
}

/* Uniform in (0, 1]: never 0, so log() below is finite. */
static inline double train_rng_unit(train_rng_t* r) {
  return ((double)(train_rng_next(r) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller (one draw per call keeps the state simple to save). */
static inline double train_rng_normal(train_rng_t* r) {
  double u1 = train_rng_unit(r), u2 = train_rng_unit(r);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* TRAIN_RNG_H_ */
