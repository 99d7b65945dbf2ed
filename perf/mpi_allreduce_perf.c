/* mpi_allreduce_perf: the all_reduce_perf measurement done with MPI_Allreduce (one rank per MPI
 * process), same table and checks, for side-by-side comparison with Braid. */
#include <limits.h>
#include <stdio.h>

#include "common.h"

#if PERF_HAVE_MPI
#include <mpi.h>

static double bus_factor(int nranks) {
  return 2.0 * (nranks - 1) / nranks;
}

static MPI_Datatype mpi_type(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
      return MPI_INT8_T;
    case ncclUint8:
      return MPI_UINT8_T;
    case ncclInt32:
      return MPI_INT32_T;
    case ncclUint32:
      return MPI_UINT32_T;
    case ncclInt64:
      return MPI_INT64_T;
    case ncclUint64:
      return MPI_UINT64_T;
    case ncclFloat32:
      return MPI_FLOAT;
    case ncclFloat64:
      return MPI_DOUBLE;
    default:
      return MPI_DATATYPE_NULL;
  }
}

static MPI_Op mpi_op(int op) {
  switch (op) {
    case PERF_OP_SUM:
      return MPI_SUM;
    case PERF_OP_PROD:
      return MPI_PROD;
    case PERF_OP_MAX:
      return MPI_MAX;
    case PERF_OP_MIN:
      return MPI_MIN;
    default:
      return MPI_OP_NULL;
  }
}

static int supports(const perf_type_t* type, int op) {
  return mpi_type(type->type) != MPI_DATATYPE_NULL && op <= PERF_OP_MIN;
}

static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  *out = perf_reduced(t, i);
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  const void* src = send == recv ? MPI_IN_PLACE : send;
  if (t->n.param > INT_MAX) return ncclInvalidArgument; /* MPI counts are int */
  int rc = MPI_Allreduce(src, recv, (int)t->n.param, mpi_type(t->type->type), mpi_op(t->op->index),
                         MPI_COMM_WORLD);
  return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
}

static const perf_coll_t kMpiAllReduce = {
    .name = "MPI_Allreduce",
    .has_op = 1,
    .mpi_native = 1,
    .counts = perf_counts_flat,
    .bus_factor = bus_factor,
    .supports = supports,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kMpiAllReduce);
}

#else /* built without MPI: nothing to measure */

int main(void) {
  fprintf(stderr, "mpi_allreduce_perf: built without MPI (PERF_HAVE_MPI)\n");
  return 1;
}

#endif
