/*
 * The registration cache behind ncclCommRegister and windows (mem.h): the
 * registered ranges of a comm, found by the transports that pin or map
 * memory. The API calls are mem_register.c's and window.c's.
 */
#include "engine/mem.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

void mem_regs_init(struct mem_regs* regs, const struct mem_reg_hooks* hooks) {
  pthread_mutex_init(&regs->lock, NULL);
  regs->head = NULL;
  atomic_init(&regs->count, 0);
  regs->hooks = hooks ? *hooks : (struct mem_reg_hooks){0};
}

static void reg_drop(struct mem_regs* regs, struct mem_reg* r) {
  if (regs->hooks.detach) regs->hooks.detach(regs->hooks.arg, r);
  free(r);
}

void mem_regs_free(struct mem_regs* regs) {
  while (regs->head) {
    struct mem_reg* r = regs->head;
    regs->head = r->next;
    reg_drop(regs, r);
  }
  atomic_store(&regs->count, 0);
  pthread_mutex_destroy(&regs->lock);
}

/* Listed only once complete, so a lookup never sees half a registration. */
static ncclResult_t reg_add(struct mem_regs* regs, void* base, size_t size, int window,
                            int win_flags, struct mem_reg** out) {
  ncclResult_t res = ncclSuccess;
  struct mem_reg* r = NULL;
  CHECK(braid_calloc(&r, 1, sizeof(*r)));
  r->base = base;
  r->size = size;
  r->window = window;
  r->win_flags = win_flags;
  if (regs->hooks.attach) CHECK(regs->hooks.attach(regs->hooks.arg, r));
  pthread_mutex_lock(&regs->lock);
  r->next = regs->head;
  regs->head = r;
  atomic_fetch_add(&regs->count, 1);
  pthread_mutex_unlock(&regs->lock);
  *out = r;
  return ncclSuccess;
fail:
  free(r);
  return res;
}

ncclResult_t mem_reg_add(struct mem_regs* regs, void* base, size_t size, struct mem_reg** out) {
  return reg_add(regs, base, size, 0, 0, out);
}

ncclResult_t mem_window_add(struct mem_regs* regs, void* base, size_t size, int flags,
                            struct mem_reg** out) {
  return reg_add(regs, base, size, 1, flags, out);
}

ncclResult_t mem_reg_remove(struct mem_regs* regs, struct mem_reg* reg) {
  struct mem_reg* found = NULL;
  pthread_mutex_lock(&regs->lock);
  for (struct mem_reg** pp = &regs->head; *pp; pp = &(*pp)->next)
    if (*pp == reg) { /* unlink and stop: pp must not step past the gap */
      found = *pp;
      *pp = found->next;
      break;
    }
  if (found) atomic_fetch_sub(&regs->count, 1);
  pthread_mutex_unlock(&regs->lock);
  if (found) reg_drop(regs, found);
  return found ? ncclSuccess : ncclInvalidArgument;
}

int mem_reg_is(struct mem_regs* regs, const struct mem_reg* reg, int window) {
  int found = 0;
  pthread_mutex_lock(&regs->lock);
  for (const struct mem_reg* r = regs->head; r && !found; r = r->next)
    found = r == reg && r->window == window;
  pthread_mutex_unlock(&regs->lock);
  return found;
}

/* Whether all of [ptr, ptr + bytes) lies in r (no overflow near the top). */
static int reg_covers(const struct mem_reg* r, const void* ptr, size_t bytes) {
  uintptr_t p = (uintptr_t)ptr, base = (uintptr_t)r->base;
  return p >= base && p - base <= r->size && bytes <= r->size - (p - base);
}

const struct mem_reg* mem_reg_find(struct mem_regs* regs, const void* ptr, size_t bytes) {
  const struct mem_reg* hit = NULL;
  if (atomic_load_explicit(&regs->count, memory_order_relaxed) == 0) return NULL;
  pthread_mutex_lock(&regs->lock);
  for (const struct mem_reg* r = regs->head; r && !hit; r = r->next)
    if (reg_covers(r, ptr, bytes)) hit = r;
  pthread_mutex_unlock(&regs->lock);
  return hit;
}

struct transport_buf mem_transport_buf(void* ptr, size_t bytes, enum mem_kind kind,
                                       const struct mem_reg* reg, const struct transport* t) {
  int inside = reg && reg_covers(reg, ptr, bytes);
  unsigned mem = kind == MEM_HOST ? TRANSPORT_CAP_HOST_MEM : TRANSPORT_CAP_DEVICE_MEM;
  return (struct transport_buf){
      .ptr = ptr, .bytes = bytes, .mem = mem, .reg = inside ? reg->handles[t->id] : NULL};
}
