/*
 * Host reduction kernels: every NCCL type x op on plain memory, vectorized
 * with run-time ISA dispatch. Kernels know nothing of comms or transports.
 */
#ifndef BRAID_KERNELS_H_
#define BRAID_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* The element-wise operator. ncclAvg is KERN_SUM + KERN_POST, a PreMulSum is
 * KERN_SUM + KERN_PRE. */
enum kern_op { KERN_SUM = 0, KERN_PROD = 1, KERN_MAX = 2, KERN_MIN = 3 };

/* Flags of one kernel call. */
#define KERN_PRE 1u  /* multiply the local operand (b, or src) by `scalar` first */
#define KERN_POST 2u /* divide the result by `postdiv` last */

/* A reduction as the kernels see it. `scalar` holds the premul factor in the
 * type's own encoding (int8 in byte 0, half in bytes 0-1, ...). */
struct kern_redop {
  ncclDataType_t type;
  enum kern_op op;
  uint64_t scalar;
  uint32_t postdiv;
};

/*
 * dst[i] = POST( a[i] OP PRE(b[i]) ) for i < n.
 * dst may equal a or b (exactly, not partially overlapping).
 * Semantics per type (identical in every ISA path, so any rank may compute
 * any element):
 *  - integers: sum/prod/premul wrap modulo 2^bits; max/min compare signed or
 *    unsigned as the type is; POST is C division (truncates toward zero).
 *  - float, double: native IEEE arithmetic, no fused multiply-add;
 *    max = a > b ? a : b, min = a < b ? a : b.
 *  - half, bfloat16, fp8 e4m3/e5m2: operands widened to float exactly, the
 *    whole expression evaluated in float, one rounding back to the type
 *    (round-to-nearest-even; fp8 saturates to +-max finite, NaN stays NaN).
 */
void kern_reduce(const struct kern_redop* r, unsigned flags, void* dst, const void* a,
                 const void* b, size_t n);

/* dst[i] = POST( PRE(src[i]) ): the one-operand form (a single rank, or a
 * premultiplied first send). dst may equal src. */
void kern_unary(const struct kern_redop* r, unsigned flags, void* dst, const void* src, size_t n);

/* A fused reduce-copy: up to KERN_TASK_MAX_SRCS sources combined, the
 * result written to up to KERN_TASK_MAX_DSTS destinations, in one pass over
 * memory (each source read once, each destination written once). */
#define KERN_TASK_MAX_SRCS 8
#define KERN_TASK_MAX_DSTS 8

struct kern_task {
  struct kern_redop redop;
  unsigned pre;   /* bit k: source k is read pre-multiplied (KERN_PRE on it) */
  unsigned flags; /* KERN_POST: the result is divided; other bits are ignored */
  int nsrcs;      /* 1 .. KERN_TASK_MAX_SRCS */
  int ndsts;      /* 1 .. KERN_TASK_MAX_DSTS */
  size_t n;       /* elements */
  const void* srcs[KERN_TASK_MAX_SRCS];
  void* dsts[KERN_TASK_MAX_DSTS];
  unsigned swap; /* bit k >= 1: step k puts source k first (host kernels only; 0 on a device) */
};

/*
 * Every destination gets, bit for bit, what this chain of pairwise calls
 * leaves in a buffer t of the type (so half, bf16 and fp8 round after
 * every step, as a chain of ranks does):
 *   t = s0, or kern_unary(PRE if pre bit 0 | POST if nsrcs == 1, t, s0)
 *   t = kern_reduce(PRE if pre bit k | POST if k == nsrcs - 1, t, t, sk)
 *       for k = 1 .. nsrcs - 1,
 *   or, where swap bit k is set, t = kern_reduce(POST if last, t, sk, t):
 *       sk first (which NaN payload or signed zero survives follows the
 *       order), sk then read as it is, whatever pre bit k says
 * One source without flags is a plain copy. A destination may equal a
 * source (exactly, not partially overlapping). An invalid task (counts out
 * of range, bad type, or with two or more sources a bad op) does nothing.
 */
void kern_task_run(const struct kern_task* t);

/* Bytes per element, 0 for an invalid type. */
size_t kern_type_size(ncclDataType_t type);

/* Name of the ISA path chosen at run time ("avx512", "avx2", "portable"). */
const char* kern_isa_name(void);

/* Scalar conversions, exported for tests and for building premul scalars. */
float kern_half_to_float(uint16_t h);
uint16_t kern_float_to_half(float f);
float kern_bf16_to_float(uint16_t h);
uint16_t kern_float_to_bf16(float f);
float kern_e4m3_to_float(uint8_t v);
uint8_t kern_float_to_e4m3(float f);
float kern_e5m2_to_float(uint8_t v);
uint8_t kern_float_to_e5m2(float f);

#endif /* BRAID_KERNELS_H_ */
