/* Multi-process tests: NCCL data-type traits, reference float converters
 * (RNE to half/bf16/fp8) and printable element formatting. */
#ifndef MP_DTYPES_H_
#define MP_DTYPES_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tests/mp assumes a little-endian host"
#endif

typedef struct mp_type_info {
  const char* name;
  size_t size;       /* bytes per element */
  int is_float;      /* 1 for half, bf16, fp8, float, double */
  int is_signed;     /* integers only */
  double exact_ints; /* floats: every integer of magnitude <= this is exact */
} mp_type_info;

/* Traits of `t`; NULL when t is out of range. */
const mp_type_info* mp_type(ncclDataType_t t);

/* Builtin op name ("sum", ...), or "premulsum" for values >= ncclNumOps. */
const char* mp_op_name(ncclRedOp_t op);

/* Bit patterns of v rounded to nearest-even (v finite). */
uint16_t mp_to_half(double v);
uint16_t mp_to_bf16(double v);
uint8_t mp_to_e4m3(double v);
uint8_t mp_to_e5m2(double v);

/* Writes the low bits of v (integer types, truncating like C casts). */
void mp_store_int(ncclDataType_t t, uint64_t v, void* out);
/* Reads an integer element, zero-extended to 64 bits. */
uint64_t mp_load_bits(ncclDataType_t t, const void* p);
/* Writes v rounded to the float type t (RNE). */
void mp_store_real(ncclDataType_t t, double v, void* out);
/* The value of any element as a double (for messages). */
double mp_load_real(ncclDataType_t t, const void* p);

/* "0x3c00 (1)" style text of one element. */
void mp_format(ncclDataType_t t, const void* p, char* buf, size_t n);

#endif /* MP_DTYPES_H_ */
