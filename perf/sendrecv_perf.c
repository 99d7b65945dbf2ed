/* sendrecv_perf: nccl-tests' sendrecv_perf for Braid (host or device buffers, --mem). Each rank
 * sends to rank + 1 and receives from rank - 1 in one group; -o only labels rows, as in nccl-tests.
 */
#include "common.h"

/* Receive element i is the previous rank's input element i. */
static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  int prev = (t->rank - 1 + t->nranks) % t->nranks;
  *out = perf_val_of(t->type, perf_input(t, prev, i));
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  int next = (t->rank + 1) % t->nranks, prev = (t->rank - 1 + t->nranks) % t->nranks;
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) return res;
  res = ncclSend(send, t->n.param, t->type->type, next, t->comm, t->stream);
  if (res == ncclSuccess) res = ncclRecv(recv, t->n.param, t->type->type, prev, t->comm, t->stream);
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

/* In place (send == recv) the result is undefined: timed, not checked, as in nccl-tests. */
static const perf_coll_t kSendRecv = {
    .name = "SendRecv",
    .has_op = 1,
    .moves_only = 1,
    .inplace_unchecked = 1,
    .counts = perf_counts_flat,
    .bus_factor = perf_bus_one,
    .init = perf_init_own,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kSendRecv);
}
