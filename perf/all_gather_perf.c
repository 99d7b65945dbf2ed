/* all_gather_perf: nccl-tests' all_gather_perf for Braid (host or device buffers, --mem). Rank r's
 * block lands at r * sendcount of every receive buffer; the size column is the received bytes. */
#include "common.h"

/* Receive element i is element i % sendcount of rank i / sendcount's input. */
static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  size_t base = t->n.param;
  *out = perf_val_of(t->type, perf_input(t, (int)(i / base), i % base));
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclAllGather(send, recv, t->n.param, t->type->type, t->comm, t->stream);
}

static const perf_coll_t kAllGather = {
    .name = "AllGather",
    .moves_only = 1,
    .counts = perf_counts_gathered,
    .bus_factor = perf_bus_ring,
    .alg_bytes = perf_alg_bytes_nranks,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kAllGather);
}
