/* The CPU grid emulation of the kernel as sm_80 runs it: without fp8's
 * conversion instructions, fp8 goes through kern_convert.h's integer code
 * (kern_hw.h, KB_EMULATE_SM80), which the tests then check as they check
 * the default emulation (of sm_89 and up). */
#include <stdatomic.h>

#define KB_EMULATE_SM80 1
static atomic_ulong g_fixups;
#define KB_FIXUP_HOOK() atomic_fetch_add_explicit(&g_fixups, 1, memory_order_relaxed)

#include "kern_emulate.h"

void kern_emulate_reduce_copy_sm80(const struct kern_dev_task* t, unsigned grid, unsigned block) {
  uint64_t stride = (uint64_t)grid * block;
  for (unsigned b = 0; b < grid; b++)
    for (unsigned x = 0; x < block; x++) kern_dev_task_run(t, (uint64_t)b * block + x, stride);
}

unsigned long kern_emulate_fixups_sm80(void) {
  return atomic_load_explicit(&g_fixups, memory_order_relaxed);
}
