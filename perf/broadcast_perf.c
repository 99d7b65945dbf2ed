/* broadcast_perf: nccl-tests' broadcast_perf for Braid (host or device buffers, --mem). -r picks
 * the root (-1: every rank in turn); only the root has an input, every rank must receive it. */
#include "common.h"

/* Other ranks' send buffers are not read: left as they are, and in place the poison stays. */
static void init(const perf_test_t* t, void* send) {
  if (t->rank == t->root) perf_init_own(t, send);
}

static int expect(const perf_test_t* t, size_t i, perf_val_t* out) {
  *out = perf_val_of(t->type, perf_input(t, t->root, i));
  return 1;
}

static ncclResult_t run(const perf_test_t* t, const void* send, void* recv) {
  return ncclBroadcast(send, recv, t->n.param, t->type->type, t->root, t->comm, t->stream);
}

static const perf_coll_t kBroadcast = {
    .name = "Broadcast",
    .has_root = 1,
    .moves_only = 1,
    .counts = perf_counts_flat,
    .bus_factor = perf_bus_one,
    .init = init,
    .expect = expect,
    .run = run,
};

int main(int argc, char** argv) {
  return perf_main(argc, argv, &kBroadcast);
}
