/* gather_perf: nccl-tests' gather_perf for Braid (host or device buffers, --mem). -r picks the root
 * (-1: every rank in turn); rank r's block lands at r * sendcount of the root's receive buffer,
 * the only one written (and checked). The size column is the gathered bytes. */
#include "common.h"

static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  size_t base = t->n.param;
  if (t->rank != t->root) return 0;
  *out = perf_val_of(t->type, perf_input(t, (int)(i / base), i % base));
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclGather(send, recv, t->n.param, t->type->type, t->root, t->comm, t->stream);
}

static const perf_coll_t kGather = {
    .name = "Gather",
    .has_root = 1,
    .moves_only = 1,
    .counts = perf_counts_gathered,
    .bus_factor = perf_bus_ring,
    .alg_bytes = perf_alg_bytes_nranks,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kGather);
}
