/* reduce_perf: nccl-tests' reduce_perf for Braid (host or device buffers, --mem). -r picks the root
 * (-1: every rank in turn); the result is checked on the root, the only rank written to. */
#include "common.h"

static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  if (t->rank != t->root) return 0;
  *out = perf_reduced(t, i);
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclReduce(send, recv, t->n.param, t->type->type, t->redop, t->root, t->comm, t->stream);
}

static const perf_coll_t kReduce = {
    .name = "Reduce",
    .has_op = 1,
    .has_root = 1,
    .counts = perf_counts_flat,
    .bus_factor = perf_bus_one,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kReduce);
}
