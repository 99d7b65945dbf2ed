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

/* The loops take a source's pre-multiplication (bit k) and its swap (bit
 * KERN_SWAP_SHIFT + k: source k goes first, read as it is) in one mask.
 * Every shape but the fold passes a mask the compiler sees has no swap
 * bits (a constant, or masked with KERN_PRE_BITS), so its loops are what
 * they were before swaps existed: a swap test per source and vector cost
 * a 3-source reduction in cache a third more. */
#define KERN_SWAP_SHIFT 16
#define KERN_PRE_BITS ((1u << KERN_SWAP_SHIFT) - 1u)

/*
 * One kernel call as every path sees it: kern_reduce, kern_unary and
 * kern_task_run all come here. The result is the chain of kernels.h over
 * the sources. `op` is a kern_op, or KERN_OP_COPY with one source; in `fl`
 * KERN_PRE says some source is pre-multiplied (`pre` says which: bit k for
 * source k) and KERN_POST divides the result; `swap` bit k (k >= 1) puts
 * source k first in its step, read as it is (kern_task.swap).
 */
struct kern_call {
  const struct kern_redop* r;
  int op;
  unsigned fl;
  unsigned pre;
  int ns, nd;
  size_t n;
  size_t es; /* bytes per element */
  const void* const* src;
  void* const* dst;
  unsigned swap;
};

/* The mask the loops take: pre bits, and swap bits above KERN_SWAP_SHIFT. */
static inline unsigned kern_call_pre_swap(const struct kern_call* c) {
  return c->pre | (c->swap << KERN_SWAP_SHIFT);
}

/* The shapes the paths compile separately, so that the two everyday ones
 * (kern_unary and kern_reduce) run loops with the source and destination
 * counts folded in, as fast as loops written for them alone. */
enum kern_shape {
  KERN_SHAPE_UNARY, /* one source, one destination */
  KERN_SHAPE_PAIR,  /* two sources (only the second pre-multiplied), one destination */
  KERN_SHAPE_MULTI, /* anything else without swaps */
  KERN_SHAPE_FOLD   /* some source first in its step (the deterministic mode's chains) */
};

static inline enum kern_shape kern_call_shape(const struct kern_call* c) {
  if (c->nd == 1 && c->ns == 1) return KERN_SHAPE_UNARY;
  if (c->nd == 1 && c->ns == 2 && !(c->pre & 1u) && !c->swap) return KERN_SHAPE_PAIR;
  return c->swap ? KERN_SHAPE_FOLD : KERN_SHAPE_MULTI;
}

/* Portable C path over elements [off, off + n) of the call. */
void kern_portable(const struct kern_call* c, size_t off, size_t n);

/* SIMD paths: each computes a prefix of the call and returns its length (0
 * for cases it leaves alone); the dispatcher finishes with kern_portable.
 * nt asks for non-temporal stores (large ranges that cannot stay in cache);
 * the path then aligns the destinations itself and may compute a short
 * head with kern_portable. Results are the same bits either way. */
size_t kern_simd_avx2(const struct kern_call* c, int nt);
size_t kern_simd_avx512(const struct kern_call* c, int nt);

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
 * run-time tests of the operator or flags inside it. KERN_SPEC_FLAGS fixes
 * the operator, KERN_SPEC_REDUCE takes the four reduction operators and
 * KERN_SPECIALIZE adds KERN_OP_COPY.
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

#define KERN_SPEC_FLAGS(done, OP, flags, FN, ...)   \
  switch ((OP)*4 + (int)((flags)&KERN_FLAG_MASK)) { \
    KERN_SPEC4_(done, OP, FN, __VA_ARGS__)          \
    default:                                        \
      break;                                        \
  }

#define KERN_SPEC_REDUCE(done, op, flags, FN, ...)  \
  switch ((op)*4 + (int)((flags)&KERN_FLAG_MASK)) { \
    KERN_SPEC4_(done, KERN_SUM, FN, __VA_ARGS__)    \
    KERN_SPEC4_(done, KERN_PROD, FN, __VA_ARGS__)   \
    KERN_SPEC4_(done, KERN_MAX, FN, __VA_ARGS__)    \
    KERN_SPEC4_(done, KERN_MIN, FN, __VA_ARGS__)    \
    default:                                        \
      break;                                        \
  }

/* Specializers for the fold shape (KERN_DEF_SHAPES's FOLD_SPEC), rarer
 * than the others: sixteen (op, flags) specializations of it tripled the
 * kernels' build time. KERN_SPEC_OP fixes the operator only (the SIMD
 * loops test the flags once per vector, as fast); KERN_SPEC_OP_PLAIN also
 * fixes "no flags", the everyday fold, which the portable loops need
 * constant to vectorize (with the flags as they come they ran 4.8x). */
#define KERN_SPEC_OP_(done, OP, FN, ...) \
  case OP:                               \
    done = FN(OP, __VA_ARGS__);          \
    break;

#define KERN_SPEC_OP(done, op, flags, FN, ...)                              \
  switch (op) {                                                             \
    KERN_SPEC_OP_(done, KERN_SUM, FN, (flags)&KERN_FLAG_MASK, __VA_ARGS__)  \
    KERN_SPEC_OP_(done, KERN_PROD, FN, (flags)&KERN_FLAG_MASK, __VA_ARGS__) \
    KERN_SPEC_OP_(done, KERN_MAX, FN, (flags)&KERN_FLAG_MASK, __VA_ARGS__)  \
    KERN_SPEC_OP_(done, KERN_MIN, FN, (flags)&KERN_FLAG_MASK, __VA_ARGS__)  \
    default:                                                                \
      break;                                                                \
  }

#define KERN_SPEC_OP_PLAIN(done, op, flags, FN, ...) \
  do {                                               \
    if (((flags)&KERN_FLAG_MASK) == 0)               \
      KERN_SPEC_OP(done, op, 0u, FN, __VA_ARGS__)    \
    else                                             \
      KERN_SPEC_OP(done, op, flags, FN, __VA_ARGS__) \
  } while (0)

#define KERN_SPECIALIZE(done, op, flags, FN, ...)                 \
  do {                                                            \
    if ((op) == KERN_OP_COPY)                                     \
      KERN_SPEC_FLAGS(done, KERN_OP_COPY, flags, FN, __VA_ARGS__) \
    else                                                          \
      KERN_SPEC_REDUCE(done, op, flags, FN, __VA_ARGS__)          \
  } while (0)

/*
 * Defines FN_shapes(c, off, n, s, dv), which runs FN(OP, FL, ns, nd, pre,
 * c->dst, c->src, off, n, s, dv) over the call's shape, each shape
 * specialized on (op, flags): the unary and pair shapes with the counts and
 * the pre-multiplied source constant (the pair's pre mask is bit 1; FN only
 * looks at it under KERN_PRE), the rest with the counts as they come, the
 * fold (swap bits) specialized by FOLD_SPEC (KERN_SPEC_OP or
 * KERN_SPEC_OP_PLAIN).
 * Each shape of each type is a function of its own, kept out of line: gcc's
 * time grows far faster than the code when the loops of every type and
 * shape are inlined into one function (kern_portable and simd_body, when
 * they held them all, were most of the library's build), and one call more
 * per kernel call is nothing next to its loop.
 */
#define KERN_DEF_SHAPES(FN, SC, DV, FOLD_SPEC)                                                     \
  static KERN_NOINLINE size_t FN##_unary(const struct kern_call* c, size_t off, size_t n, SC s,    \
                                         DV dv) {                                                  \
    size_t done = 0;                                                                               \
    KERN_SPEC_FLAGS(done, KERN_OP_COPY, c->fl, FN, 1, 1, 1u, c->dst, c->src, off, n, s, dv)        \
    return done;                                                                                   \
  }                                                                                                \
  static KERN_NOINLINE size_t FN##_pair(const struct kern_call* c, size_t off, size_t n, SC s,     \
                                        DV dv) {                                                   \
    size_t done = 0;                                                                               \
    KERN_SPEC_REDUCE(done, c->op, c->fl, FN, 2, 1, 2u, c->dst, c->src, off, n, s, dv)              \
    return done;                                                                                   \
  }                                                                                                \
  static KERN_NOINLINE size_t FN##_multi(const struct kern_call* c, size_t off, size_t n, SC s,    \
                                         DV dv) {                                                  \
    size_t done = 0;                                                                               \
    KERN_SPECIALIZE(done, c->op, c->fl, FN, c->ns, c->nd, (c->pre & KERN_PRE_BITS), c->dst,        \
                    c->src, off, n, s, dv);                                                        \
    return done;                                                                                   \
  }                                                                                                \
  static KERN_NOINLINE size_t FN##_fold(const struct kern_call* c, size_t off, size_t n, SC s,     \
                                        DV dv) {                                                   \
    size_t done = 0;                                                                               \
    FOLD_SPEC(done, c->op, c->fl, FN, c->ns, c->nd, kern_call_pre_swap(c), c->dst, c->src, off, n, \
              s, dv);                                                                              \
    return done;                                                                                   \
  }                                                                                                \
  static inline size_t FN##_shapes(const struct kern_call* c, size_t off, size_t n, SC s, DV dv) { \
    switch (kern_call_shape(c)) {                                                                  \
      case KERN_SHAPE_UNARY:                                                                       \
        return FN##_unary(c, off, n, s, dv);                                                       \
      case KERN_SHAPE_PAIR:                                                                        \
        return FN##_pair(c, off, n, s, dv);                                                        \
      case KERN_SHAPE_FOLD:                                                                        \
        return FN##_fold(c, off, n, s, dv);                                                        \
      default:                                                                                     \
        return FN##_multi(c, off, n, s, dv);                                                       \
    }                                                                                              \
  }

/* Forces inlining so the constant op/flags above fold away. */
#define KERN_INLINE static inline __attribute__((always_inline))
/* Hides a vector constant's value from the compiler (an empty asm that
 * may have changed it): a loop then keeps it in a register, or reloads it,
 * instead of building it again from an immediate in every iteration. */
#define KERN_OPAQUE(v) __asm__("" : "+v"(v))
/* Keeps a specialized body in a function of its own (KERN_DEF_SHAPES). */
#define KERN_NOINLINE __attribute__((noinline))

#endif /* BRAID_KERN_DISPATCH_H_ */
