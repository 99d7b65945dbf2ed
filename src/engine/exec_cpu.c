/*
 * The executor's backend for host memory: a task runs on the CPU kernels
 * when it is posted and post says it is done, so the executor never tests
 * it and a step sends as soon as it would with the kernels called inline.
 */
#include "engine/exec_cpu.h"
#include "engine/executor.h"

static ncclResult_t cpu_post(void* state, const struct kern_task* t, uint64_t* ticket, int* done) {
  (void)state;
  *ticket = 0;
  *done = 1;
  /* A plain copy is a memory copy: mem_copy picks the right one. */
  if (t->nsrcs == 1 && t->ndsts == 1 && !(t->pre & 1u) && !(t->flags & KERN_POST))
    return mem_copy(t->dsts[0], t->srcs[0], t->n * kern_type_size(t->redop.type));
  kern_task_run(t);
  return ncclSuccess;
}

static ncclResult_t cpu_test(void* state, uint64_t ticket, int* done) {
  (void)state, (void)ticket;
  *done = 1;
  return ncclSuccess;
}

const struct exec_backend exec_backend_cpu = {"cpu", cpu_post, cpu_test};
