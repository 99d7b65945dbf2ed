/*
 * Internal interface of the CPU kernels: the per-ISA entry points, the test
 * hook that switches ISA, and helpers shared by the portable and SIMD code.
 */
#ifndef BRAID_KERN_DISPATCH_H_
#define BRAID_KERN_DISPATCH_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels.h"

/* Internal operator used by kern_unary: the result is PRE(b), `a` unused. */
#define KERN_OP_COPY 4

/* The flags the kernels understand; other bits are ignored. */
#define KERN_FLAG_MASK (KERN_PRE | KERN_POST)

/* Portable C path over the whole range; op is a kern_op or KERN_OP_COPY. */
void kern_portable(const struct kern_redop* r, int op, unsigned flags, void* dst, const void* a,
                   const void* b, size_t n);

/* SIMD paths: each computes a prefix of the range and returns its length (0
 * for cases it leaves alone); the dispatcher finishes with kern_portable.
 * nt asks for non-temporal stores (large ranges that cannot stay in cache);
 * the path then aligns dst itself and may compute a short head with
 * kern_portable. Results are the same bits either way. */
size_t kern_simd_avx2(const struct kern_redop* r, int op, unsigned flags, int nt, void* dst,
                      const void* a, const void* b, size_t n);
size_t kern_simd_avx512(const struct kern_redop* r, int op, unsigned flags, int nt, void* dst,
                        const void* a, const void* b, size_t n);

/* Test hook: destination sizes (bytes) from which the SIMD paths use
 * non-temporal stores; returns the previous value. */
size_t kern_set_nt_threshold(size_t bytes);

/* Test hook: switch to the path named "portable", "avx2" or "avx512" (NULL:
 * the best this CPU has). Returns 0 and changes nothing if the CPU lacks it.
 * Must not race with kernel calls in other threads. */
int kern_force_isa(const char* name);

/* The premul factor of a type computed in float (float, half, bf16, fp8),
 * widened exactly; 0 for other types. */
float kern_scalar_f32(const struct kern_redop* r);

static inline double kern_scalar_f64(const struct kern_redop* r) {
  double s;
  memcpy(&s, &r->scalar, sizeof s);
  return s;
}

/* A zero divisor would trap for integers; every type treats it as 1. */
static inline uint32_t kern_divisor(const struct kern_redop* r) {
  return r->postdiv ? r->postdiv : 1u;
}

/*
 * Calls done = FN(OP, FL, ...) with OP and FL as literal constants, one call
 * per (op, flags) pair, so that every inlined loop is compiled without
 * run-time tests of the operator or flags inside it.
 */
#define KERN_SPEC4_(done, OP, FN, ...)                \
  case (OP)*4 + 0:                                    \
    done = FN(OP, 0u, __VA_ARGS__);                   \
    break;                                            \
  case (OP)*4 + 1:                                    \
    done = FN(OP, KERN_PRE, __VA_ARGS__);             \
    break;                                            \
  case (OP)*4 + 2:                                    \
    done = FN(OP, KERN_POST, __VA_ARGS__);            \
    break;                                            \
  case (OP)*4 + 3:                                    \
    done = FN(OP, KERN_PRE | KERN_POST, __VA_ARGS__); \
    break;

#define KERN_SPECIALIZE(done, op, flags, FN, ...)    \
  switch ((op)*4 + (int)((flags)&KERN_FLAG_MASK)) {  \
    KERN_SPEC4_(done, KERN_SUM, FN, __VA_ARGS__)     \
    KERN_SPEC4_(done, KERN_PROD, FN, __VA_ARGS__)    \
    KERN_SPEC4_(done, KERN_MAX, FN, __VA_ARGS__)     \
    KERN_SPEC4_(done, KERN_MIN, FN, __VA_ARGS__)     \
    KERN_SPEC4_(done, KERN_OP_COPY, FN, __VA_ARGS__) \
    default:                                         \
      break;                                         \
  }

/* Forces inlining so the constant op/flags above fold away. */
#define KERN_INLINE static inline __attribute__((always_inline))

#endif /* BRAID_KERN_DISPATCH_H_ */
