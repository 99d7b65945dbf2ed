/* Multi-process tests: one all-reduce call with generated inputs and an exact
 * reference result, checked element by element on every rank. */
#ifndef MP_ARCHECK_H_
#define MP_ARCHECK_H_

#include <stddef.h>
#include <stdint.h>

#include "launcher.h"
#include "nccl.h"

/* The operation families; AR_PREMUL is a ncclRedOpCreatePreMulSum op whose
 * scalar is 3 for integer types and 0.5 for floating types. */
enum ar_kind { AR_SUM, AR_PROD, AR_MAX, AR_MIN, AR_AVG, AR_PREMUL, AR_NKINDS };

#define AR_GUARD 64 /* bytes checked untouched after each buffer's count */

/* One all-reduce. Fill type/kind/count/inplace/salt/op; buffers either come
 * from ar_alloc (owned) or are set by the caller (capacity in bytes must be
 * >= count * size + AR_GUARD). */
typedef struct ar_call {
  ncclDataType_t type;
  int kind;
  size_t count;
  int inplace;
  uint64_t salt;
  ncclRedOp_t op;
  unsigned char* send;
  unsigned char* recv;
  int owns;
  struct ar_tables* tab;
} ar_call;

const char* ar_kind_name(int kind);

/* The op to pass for (type, kind): a builtin, or a new premulsum. 0 on success. */
int ar_op_create(const mp_env* env, ncclComm_t comm, ncclDataType_t type, int kind,
                 ncclRedOp_t* op);
int ar_op_destroy(const mp_env* env, ncclComm_t comm, int kind, ncclRedOp_t op);

/* Allocates owned buffers sized for c->count. 0 on success. */
int ar_alloc(ar_call* c);
/* Generates tables and fills the input (and poisons the output). 0 on success. */
int ar_prepare(ar_call* c, const mp_env* env);
/* Issues ncclAllReduce with c's buffers. */
ncclResult_t ar_issue(const ar_call* c, ncclComm_t comm);
/* Checks output, input (out-of-place) and guards; prints the first few
 * mismatches. Returns 0 when all is exact, 1 otherwise. */
int ar_verify(const ar_call* c, const mp_env* env);
/* Frees tables and owned buffers. */
void ar_release(ar_call* c);

/* prepare + issue + verify + release. Returns 0 exact, 1 wrong data, -1 when
 * the call itself failed (the comm should then be abandoned). */
int ar_run(ar_call* c, const mp_env* env, ncclComm_t comm);

/* Reference tables only, for callers that lay out their own buffers (other
 * collectives): c->type/kind/count/salt set; count is the length of the
 * reduced vector. Freed by ar_release (buffers are left alone unless owned).
 * 0 on success. */
int ar_tables_init(ar_call* c, const mp_env* env);
/* Writes elements [first, first + len) of this rank's input (output 0) or of
 * the exact reduction result (output 1) to out. Needs the tables. */
void ar_expect_fill(const ar_call* c, int output, size_t first, size_t len, unsigned char* out);

/* "type=half op=avg count=7 in-place" for messages. */
void ar_describe(const ar_call* c, char* buf, size_t n);

#endif /* MP_ARCHECK_H_ */
