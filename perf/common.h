/* Shared interface of the Braid perf tools: nccl-tests' command line and output, timing and
 * exact result checking. A tool describes its collective with a perf_coll_t and calls perf_main. */
#ifndef BRAID_PERF_COMMON_H_
#define BRAID_PERF_COMMON_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* ---- element types ---- */
typedef enum { PERF_SINT, PERF_UINT, PERF_FLOAT } perf_kind_t;

typedef struct {
  const char* name;  /* nccl-tests spelling, printed in the table */
  const char* alias; /* also accepted by -d, or NULL */
  ncclDataType_t type;
  size_t size;      /* bytes per element */
  perf_kind_t kind; /* integer signedness or floating point */
  int ebits, mbits; /* float formats: exponent and stored mantissa bits */
  double budget;    /* largest |partial sum| the type holds exactly */
} perf_type_t;

/* ---- reduction operators, nccl-tests' order; PERF_OP_PREMULSUM uses a created op ---- */
enum { PERF_OP_SUM, PERF_OP_PROD, PERF_OP_MAX, PERF_OP_MIN, PERF_OP_AVG, PERF_OP_PREMULSUM };
#define PERF_NUM_OPS 6
#define PERF_NUM_TYPES 12
#define PERF_PREMUL_SCALAR 2 /* scalar given to ncclRedOpCreatePreMulSum */

typedef struct {
  const char* name;  /* printed in the table */
  const char* alias; /* also accepted by -o, or NULL */
  int index;         /* PERF_OP_* */
} perf_op_t;

/* One element value: integer kinds use i, float kinds use f. */
typedef struct {
  int64_t i;
  double f;
} perf_val_t;

/* Element counts of one operation, as in nccl-tests' getCollByteCount. In-place runs use one
 * buffer: the input at recvbuff + send_inplace * rank, the output at recvbuff + recv_inplace * rank
 * (AllGather: send_inplace = sendcount; ReduceScatter: recv_inplace = recvcount). */
typedef struct {
  size_t send, recv, param;          /* per-rank send/recv elements; count passed to the op */
  size_t send_inplace, recv_inplace; /* in-place offsets (elements) multiplied by the rank */
} perf_counts_t;

typedef struct perf_test perf_test_t;

/* ---- the collective descriptor each *_perf tool supplies ---- */
typedef struct perf_coll {
  const char* name; /* e.g. "AllReduce" */
  int has_op;       /* loops over reduction ops; otherwise the redop column says "none" */
  int has_root;     /* the root column shows -r (-1: every rank in turn); otherwise -1 */
  int mpi_native;   /* runs on MPI_COMM_WORLD, no NCCL communicator (mpi_*_perf) */
  int moves_only; /* no arithmetic on the data: inputs span the type's exact range, any op unused */
  int inplace_unchecked; /* in-place results are undefined (send == recv): #wrong shows N/A */
  /* counts for `count` elements of elt_size bytes (the -b..-e size over the type size) */
  void (*counts)(size_t count, size_t elt_size, int nranks, perf_counts_t* out);
  double (*bus_factor)(int nranks);                 /* busbw = algbw * factor */
  double (*alg_bytes)(const perf_test_t* t);        /* bytes for algbw; NULL: param * size */
  int (*supports)(const perf_type_t* type, int op); /* NULL: every type and op */
  void (*init)(const perf_test_t* t, void* send);   /* fill this rank's input */
  /* expected value of receive element i on this rank; returns 0 if it is not checked */
  int (*expect)(const perf_test_t* t, size_t i, perf_val_t* out);
  ncclResult_t (*run)(const perf_test_t* t, const void* send, void* recv);
} perf_coll_t;

/* Everything a descriptor needs to know about the operation being run. */
struct perf_test {
  const perf_coll_t* coll;
  const perf_type_t* type;
  const perf_op_t* op;
  ncclRedOp_t redop; /* handle given to NCCL (a created one for premulsum) */
  ncclComm_t comm;   /* NULL for mpi_native tools */
  int rank, nranks, root;
  perf_counts_t n;
  uint64_t seed;       /* changes whenever inputs are re-initialized */
  cudaStream_t stream; /* NULL on host buffers; the rank's CUDA stream on device buffers */
};

/* Runs the whole benchmark (argument parsing, bootstrap, sweep, report); returns exit status. */
int perf_main(int argc, char** argv, const perf_coll_t* coll);

/* ---- building blocks for descriptors (colls.c) ---- */
/* send = recv = param = count, no in-place offsets (AllReduce, Broadcast, Reduce, SendRecv). */
void perf_counts_flat(size_t count, size_t elt_size, int nranks, perf_counts_t* out);
/* Per-rank blocks of whole 16 bytes. Gathered (AllGather, Gather): each rank sends one block
 * and nranks blocks arrive, in place rank r's input is block r of recvbuff. Scattered
 * (ReduceScatter, Scatter): nranks blocks go out and one arrives, in place rank r's output is
 * block r of the send buffer. */
void perf_counts_gathered(size_t count, size_t elt_size, int nranks, perf_counts_t* out);
void perf_counts_scattered(size_t count, size_t elt_size, int nranks, perf_counts_t* out);
/* Elements per rank block of a count split over nranks, rounded down to whole 16 bytes. */
size_t perf_block_count(size_t count, size_t elt_size, int nranks);
double perf_bus_one(int nranks);                      /* busbw factor 1 */
double perf_bus_ring(int nranks);                     /* busbw factor (nranks - 1) / nranks */
double perf_alg_bytes_nranks(const perf_test_t* t);   /* algbw bytes param * size * nranks */
void perf_init_own(const perf_test_t* t, void* send); /* send[i] = perf_input(t, t->rank, i) */

/* ---- data helpers for descriptors (data.c) ---- */
const perf_type_t* perf_type_at(int i); /* nccl-tests' order, i < PERF_NUM_TYPES */
const perf_op_t* perf_op_at(int i);     /* i < PERF_NUM_OPS */
const perf_type_t* perf_type_find(const char* name);
const perf_op_t* perf_op_find(const char* name);

/* Input value of `rank` at element i: small integers, chosen so that any reduction order is
 * exact for t->type and t->op (moves_only collectives: any integer the type holds exactly). */
int64_t perf_input(const perf_test_t* t, int rank, size_t i);
/* Writes perf_input(t, rank, first + j) into buf[j] for j < count. */
void perf_fill(const perf_test_t* t, void* buf, size_t count, int rank, size_t first);
/* Expected t->op reduction over all ranks of element i, rounded to t->type. */
perf_val_t perf_reduced(const perf_test_t* t, size_t i);
/* An input value as an expected value (for data-movement collectives). */
perf_val_t perf_val_of(const perf_type_t* type, int64_t v);
/* Element i of buf, read as a value. */
perf_val_t perf_load(const perf_type_t* type, const void* buf, size_t i);
void perf_store(const perf_type_t* type, void* buf, size_t i, perf_val_t v);
int perf_val_equal(const perf_type_t* type, perf_val_t a, perf_val_t b);
/* Number of receive elements (t->n.recv of them) that differ from coll->expect. */
size_t perf_count_wrong(const perf_test_t* t, const void* recv);

/* Round-to-nearest-even conversions for narrow float formats (ebits/mbits as perf_type_t;
 * has_inf 0 is the e4m3 "fn" encoding: no infinities, S.1111.111 is NaN). */
uint32_t perf_float_encode(double x, int ebits, int mbits, int has_inf);
double perf_float_decode(uint32_t bits, int ebits, int mbits, int has_inf);
uint16_t perf_to_half(double x);
double perf_from_half(uint16_t h);
uint16_t perf_to_bf16(double x);
double perf_from_bf16(uint16_t h);
uint8_t perf_to_e4m3(double x);
double perf_from_e4m3(uint8_t v);
uint8_t perf_to_e5m2(double x);
double perf_from_e5m2(uint8_t v);

#endif /* BRAID_PERF_COMMON_H_ */
