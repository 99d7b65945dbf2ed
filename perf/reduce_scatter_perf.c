/* reduce_scatter_perf: nccl-tests' reduce_scatter_perf for Braid (host or device buffers, --mem).
 * Rank r receives the reduction of block r of every input; the size column is the sent bytes. */
#include "common.h"

static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  *out = perf_reduced(t, (size_t)t->rank * t->n.param + i);
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclReduceScatter(send, recv, t->n.param, t->type->type, t->redop, t->comm, t->stream);
}

static const perf_coll_t kReduceScatter = {
    .name = "ReduceScatter",
    .has_op = 1,
    .counts = perf_counts_scattered,
    .bus_factor = perf_bus_ring,
    .alg_bytes = perf_alg_bytes_nranks,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kReduceScatter);
}
