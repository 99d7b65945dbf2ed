/* Building blocks shared by the collective descriptors of the perf tools: nccl-tests' element
 * counts and 16-byte block rounding, bus-bandwidth factors, algbw byte counts and input filling. */
#include "common.h"

void perf_counts_flat(size_t count, size_t elt_size, int nranks, perf_counts_t* out) {
  (void)elt_size;
  (void)nranks;
  out->send = out->recv = out->param = count;
  out->send_inplace = out->recv_inplace = 0;
}

void perf_counts_gathered(size_t count, size_t elt_size, int nranks, perf_counts_t* out) {
  size_t base = perf_block_count(count, elt_size, nranks);
  out->send = out->param = base;
  out->recv = base * (size_t)nranks;
  out->send_inplace = base;
  out->recv_inplace = 0;
}

void perf_counts_scattered(size_t count, size_t elt_size, int nranks, perf_counts_t* out) {
  size_t base = perf_block_count(count, elt_size, nranks);
  out->send = base * (size_t)nranks;
  out->recv = out->param = base;
  out->send_inplace = 0;
  out->recv_inplace = base;
}

size_t perf_block_count(size_t count, size_t elt_size, int nranks) {
  size_t per16 = elt_size < 16 ? 16 / elt_size : 1;
  return count / (size_t)nranks / per16 * per16;
}

double perf_bus_one(int nranks) {
  (void)nranks;
  return 1.0;
}

double perf_bus_ring(int nranks) {
  return (double)(nranks - 1) / nranks;
}

double perf_alg_bytes_nranks(const perf_test_t* t) {
  return (double)t->n.param * (double)t->type->size * t->nranks;
}

void perf_init_own(const perf_test_t* t, void* send) {
  perf_fill(t, send, t->n.send, t->rank, 0);
}
