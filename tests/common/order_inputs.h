/*
 * Inputs whose reductions depend on the order of combining, shared by the
 * deterministic mode's tests (tests/unit/test_pairwise.c,
 * tests/mp/test_deterministic.c). Rank r's input for element e is a
 * function of (r, e) alone, e being the element's index in a notional
 * endless buffer: an element has the same inputs wherever a call puts it.
 * Header-only: the unit tests and the multi-process tests link different
 * support code.
 */
#ifndef BRAID_TESTS_ORDER_INPUTS_H_
#define BRAID_TESTS_ORDER_INPUTS_H_

#include <stdint.h>
#include <string.h>

#include "nccl.h"

static inline uint64_t order_mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

static inline size_t order_type_size(ncclDataType_t t) {
  static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return sizes[t];
}

/* Floats get mixed signs and exponents over a wide range (sums depend on
 * the order, and half and bf16 stay clear of overflow under a product of 8);
 * with `specials`, now and then a zero of either sign, an infinity or a NaN
 * whose payload names the rank. fp8 never gets a NaN (its arithmetic
 * saturates); integers get any bits. */
static inline void order_input(ncclDataType_t t, int specials, int r, uint64_t e, void* out) {
  uint64_t h = order_mix(e * 1000003u + (uint64_t)r * 7919u + 17u);
  unsigned sp = specials ? (unsigned)(h >> 56) : 255u;
  switch (t) {
    case ncclFloat32: {
      uint32_t b = (uint32_t)(h & 0x807fffffu) | (uint32_t)(100 + (h >> 40) % 56) << 23;
      if (sp == 1) b = 0x7fc00000u | (uint32_t)r;
      if (sp == 2) b = (h & 1) ? 0x80000000u : 0;
      if (sp == 3) b = 0x7f800000u | (uint32_t)(h & 0x80000000u);
      memcpy(out, &b, 4);
      return;
    }
    case ncclFloat64: {
      uint64_t b = (h & 0x800fffffffffffffull) | (uint64_t)(1000 + (h >> 40) % 48) << 52;
      if (sp == 1) b = 0x7ff8000000000000ull | (uint64_t)r;
      memcpy(out, &b, 8);
      return;
    }
    case ncclFloat16:
    case ncclBfloat16: {
      uint16_t b = t == ncclFloat16 ? (uint16_t)((h & 0x83ff) | (10 + (h >> 40) % 10) << 10)
                                    : (uint16_t)((h & 0x807f) | (120 + (h >> 40) % 14) << 7);
      if (sp == 1) b = t == ncclFloat16 ? (uint16_t)(0x7e00 | r) : (uint16_t)(0x7fc0 | r);
      memcpy(out, &b, 2);
      return;
    }
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      *(uint8_t*)out = (uint8_t)(h & 0xf7); /* clear of 0x7f / 0x7c..0x7f */
      return;
    default:
      memcpy(out, &h, order_type_size(t));
  }
}

#endif /* BRAID_TESTS_ORDER_INPUTS_H_ */
