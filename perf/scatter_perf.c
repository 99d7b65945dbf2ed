/* scatter_perf: nccl-tests' scatter_perf for Braid (host or device buffers, --mem). -r picks the
 * root
 * (-1: every rank in turn); rank r receives block r of the root's input. The size column is the
 * scattered bytes. */
#include "common.h"

/* Only the root has an input; other ranks' send buffers are not read. */
static void init(const perf_test_t* t, void* send) {
  if (t->rank == t->root) perf_init_own(t, send);
}

static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  *out = perf_val_of(t->type, perf_input(t, t->root, (size_t)t->rank * t->n.param + i));
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclScatter(send, recv, t->n.param, t->type->type, t->root, t->comm, t->stream);
}

static const perf_coll_t kScatter = {
    .name = "Scatter",
    .has_root = 1,
    .moves_only = 1,
    .counts = perf_counts_scattered,
    .bus_factor = perf_bus_ring,
    .alg_bytes = perf_alg_bytes_nranks,
    .init = init,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kScatter);
}
