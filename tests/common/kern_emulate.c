/* The CPU grid emulation (kern_emulate.h): thread (b, x) of the grid is
 * element first = b * block + x of a grid-stride loop, as on the GPU. */
#include <stdatomic.h>

/* Counted before kern_body.h is read: its NaN fix-up calls this. */
static atomic_ulong g_fixups;
#define KB_FIXUP_HOOK() atomic_fetch_add_explicit(&g_fixups, 1, memory_order_relaxed)

#include "kern_emulate.h"

void kern_emulate_reduce_copy(const struct kern_dev_task* t, unsigned grid, unsigned block) {
  uint64_t stride = (uint64_t)grid * block;
  for (unsigned b = 0; b < grid; b++)
    for (unsigned x = 0; x < block; x++) kern_dev_task_run(t, (uint64_t)b * block + x, stride);
}

void kern_emulate_reduce_copy_at(const struct kern_dev_task* t, unsigned grid, unsigned block) {
  struct kern_dev_task row;
  for (uint32_t r = 0; r < kern_dev_task_rows(t); r++)
    if (kern_dev_task_row(t, r, &row)) kern_emulate_reduce_copy(&row, grid, block);
}

unsigned long kern_emulate_fixups(void) {
  return atomic_load_explicit(&g_fixups, memory_order_relaxed);
}
