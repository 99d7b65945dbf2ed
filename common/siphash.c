/*
 * SipHash-2-4 (siphash.h), written from the paper: two compression rounds
 * per 8-byte word, four finalization rounds, the message length in the
 * last word's top byte, words read little-endian.
 */
#include "siphash.h"

#include <string.h>

static uint64_t rotl64(uint64_t x, int b) {
  return (x << b) | (x >> (64 - b));
}

static void sip_round(uint64_t v[4]) {
  v[0] += v[1];
  v[1] = rotl64(v[1], 13);
  v[1] ^= v[0];
  v[0] = rotl64(v[0], 32);
  v[2] += v[3];
  v[3] = rotl64(v[3], 16);
  v[3] ^= v[2];
  v[0] += v[3];
  v[3] = rotl64(v[3], 21);
  v[3] ^= v[0];
  v[2] += v[1];
  v[1] = rotl64(v[1], 17);
  v[1] ^= v[2];
  v[2] = rotl64(v[2], 32);
}

/* Little-endian load of n (<= 8) bytes. */
static uint64_t load_le(const unsigned char* p, size_t n) {
  uint64_t w = 0;
  for (size_t i = 0; i < n; i++) w |= (uint64_t)p[i] << (8 * i);
  return w;
}

static void sip_absorb(uint64_t v[4], uint64_t m) {
  v[3] ^= m;
  sip_round(v);
  sip_round(v);
  v[0] ^= m;
}

uint64_t siphash24(uint64_t k0, uint64_t k1, const void* msg, size_t len) {
  const unsigned char* p = msg;
  uint64_t v[4] = {k0 ^ 0x736f6d6570736575ull, k1 ^ 0x646f72616e646f6dull,
                   k0 ^ 0x6c7967656e657261ull, k1 ^ 0x7465646279746573ull};
  size_t full = len & ~(size_t)7;
  for (size_t i = 0; i < full; i += 8) sip_absorb(v, load_le(p + i, 8));
  sip_absorb(v, load_le(p + full, len - full) | ((uint64_t)(len & 0xff) << 56));
  v[2] ^= 0xff;
  for (int r = 0; r < 4; r++) sip_round(v);
  return v[0] ^ v[1] ^ v[2] ^ v[3];
}
