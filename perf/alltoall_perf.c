/* alltoall_perf: nccl-tests' alltoall_perf for Braid (host or device buffers, --mem), through
 * ncclAlltoAll: block p of each rank's input goes to rank p, into block <sender>. */
#include "common.h"

/* count / nranks elements (whole 16 bytes) per peer; the size column is the whole buffer. */
static void counts(size_t count, size_t elt_size, int nranks, perf_counts_t* out) {
  out->param = perf_block_count(count, elt_size, nranks);
  out->send = out->recv = out->param * (size_t)nranks;
  out->send_inplace = out->recv_inplace = 0;
}

/* Receive block p holds block <this rank> of rank p's input. */
static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  size_t base = t->n.param, p = i / base;
  *out = perf_val_of(t->type, perf_input(t, (int)p, (size_t)t->rank * base + i % base));
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclAlltoAll(send, recv, t->n.param, t->type->type, t->comm, t->stream);
}

/* In place (send == recv) the result is undefined: timed, not checked, as in nccl-tests. */
static const perf_coll_t kAlltoAll = {
    .name = "AlltoAll",
    .moves_only = 1,
    .inplace_unchecked = 1,
    .counts = counts,
    .bus_factor = perf_bus_ring,
    .alg_bytes = perf_alg_bytes_nranks,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kAlltoAll);
}
