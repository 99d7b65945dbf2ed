/*
 * Memory: buffer kinds, copies, the registration cache behind
 * ncclCommRegister/ncclCommDeregister, and ncclMemAlloc/ncclMemFree.
 */
#include "mem.h"

#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "core.h"

enum mem_kind mem_query(const void* ptr) {
  (void)ptr; /* without a CUDA driver every pointer is host memory */
  return MEM_HOST;
}

const char* mem_kind_name(enum mem_kind kind) {
  static const char* const names[MEM_KIND_COUNT] = {"host", "device", "managed"};
  return (unsigned)kind < MEM_KIND_COUNT ? names[kind] : "?";
}

ncclResult_t mem_copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) memmove(dst, src, bytes);
  return ncclSuccess;
}

void mem_regs_init(struct mem_regs* regs) {
  pthread_mutex_init(&regs->lock, NULL);
  regs->head = NULL;
}

void mem_regs_free(struct mem_regs* regs) {
  while (regs->head) {
    struct mem_reg* r = regs->head;
    regs->head = r->next;
    free(r);
  }
  pthread_mutex_destroy(&regs->lock);
}

ncclResult_t mem_reg_add(struct mem_regs* regs, void* base, size_t size, struct mem_reg** out) {
  ncclResult_t res = ncclSuccess;
  struct mem_reg* r = NULL;
  CHECK(braid_calloc(&r, 1, sizeof(*r)));
  pthread_mutex_lock(&regs->lock);
  *r = (struct mem_reg){base, size, regs->head};
  regs->head = r;
  pthread_mutex_unlock(&regs->lock);
  *out = r;
fail:
  return res;
}

ncclResult_t mem_reg_remove(struct mem_regs* regs, struct mem_reg* reg) {
  struct mem_reg* found = NULL;
  pthread_mutex_lock(&regs->lock);
  for (struct mem_reg** pp = &regs->head; *pp && !found; pp = &(*pp)->next)
    if (*pp == reg) {
      found = *pp;
      *pp = found->next;
    }
  pthread_mutex_unlock(&regs->lock);
  free(found);
  return found ? ncclSuccess : ncclInvalidArgument;
}

const struct mem_reg* mem_reg_find(struct mem_regs* regs, const void* ptr, size_t bytes) {
  const struct mem_reg* hit = NULL;
  uintptr_t lo = (uintptr_t)ptr;
  pthread_mutex_lock(&regs->lock);
  for (const struct mem_reg* r = regs->head; r && !hit; r = r->next) {
    uintptr_t base = (uintptr_t)r->base;
    if (lo >= base && lo - base <= r->size && bytes <= r->size - (lo - base)) hit = r;
  }
  pthread_mutex_unlock(&regs->lock);
  return hit;
}

/* Registration: the TCP transport already moves data straight between user
 * buffers and sockets, so there is no copy to skip; the registration is
 * kept (and checked) for transports that map or pin memory. */
NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size,
         void** handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  ncclResult_t res = ncclSuccess;
  struct mem_reg* r = NULL;
  CHECK(comm_check(comm, "ncclCommRegister"));
  if (buff == NULL || size == 0 || handle == NULL)
    FAIL(ncclInvalidArgument, "ncclCommRegister : buff %p size %zu handle %p", buff, size,
         (void*)handle);
  CHECK(mem_reg_add(&comm->regs, buff, size, &r));
  *handle = r;
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check(comm, "ncclCommDeregister"));
  if (mem_reg_remove(&comm->regs, handle) != ncclSuccess)
    FAIL(ncclInvalidArgument, "ncclCommDeregister : %p is not a registration of this comm", handle);
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclMemAlloc, void** ptr, size_t size);
ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (ptr == NULL || size == 0) {
    WARN("ncclMemAlloc : ptr %p size %zu", (void*)ptr, size);
    return ncclInvalidArgument;
  }
  /* Not braid_calloc: page-aligned and unzeroed, as cudaMalloc'd memory is
   * (a transport may map or pin it whole); the failure is logged below. */
  *ptr = aligned_alloc(4096, ALIGN_UP(size, 4096));
  if (*ptr == NULL) {
    WARN("ncclMemAlloc : out of memory for %zu bytes", size);
    return ncclSystemError;
  }
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclMemFree, void* ptr);
ncclResult_t ncclMemFree(void* ptr) {
  free(ptr);
  return ncclSuccess;
}
