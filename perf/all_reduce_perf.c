/* all_reduce_perf: nccl-tests' all_reduce_perf for Braid (host or device buffers, --mem).
 * Only the AllReduce descriptor lives here; the driver is perf/bench.c. */
#include "common.h"

static double bus_factor(int nranks) {
  return 2.0 * (nranks - 1) / nranks;
}

static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  *out = perf_reduced(t, i);
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclAllReduce(send, recv, t->n.param, t->type->type, t->redop, t->comm, t->stream);
}

static const perf_coll_t kAllReduce = {
    .name = "AllReduce",
    .has_op = 1,
    .counts = perf_counts_flat,
    .bus_factor = bus_factor,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kAllReduce);
}
