/*
 * Memory: what kind a buffer is, copies between buffers of any kind, the
 * registration cache behind ncclCommRegister, and ncclMemAlloc. Library
 * code reaches user buffers only through these (and the kernels).
 */
#ifndef BRAID_MEM_H_
#define BRAID_MEM_H_

#include <pthread.h>
#include <stddef.h>

#include "nccl.h"

/* Where a buffer lives. Only host memory exists until the CUDA driver
 * shim lands; then mem_query tells device and managed memory apart. */
enum mem_kind { MEM_HOST = 0, MEM_DEVICE = 1, MEM_MANAGED = 2, MEM_KIND_COUNT };

enum mem_kind mem_query(const void* ptr);
const char* mem_kind_name(enum mem_kind kind);

/* Copy `bytes` from src to dst, whatever their kinds; the ranges may
 * overlap (memmove's rule). */
ncclResult_t mem_copy(void* dst, const void* src, size_t bytes);

/* One ncclCommRegister'ed range; the handle the user gets back. */
struct mem_reg {
  void* base;
  size_t size;
  struct mem_reg* next;
};

/* A comm's registrations. Register and deregister come from user threads
 * while the comm's work runs elsewhere: the lock covers the list. */
struct mem_regs {
  pthread_mutex_t lock;
  struct mem_reg* head;
};

void mem_regs_init(struct mem_regs* regs);
/* Drop every registration left (the user need not deregister first). */
void mem_regs_free(struct mem_regs* regs);
ncclResult_t mem_reg_add(struct mem_regs* regs, void* base, size_t size, struct mem_reg** out);
/* ncclInvalidArgument when `reg` is not one of these registrations. */
ncclResult_t mem_reg_remove(struct mem_regs* regs, struct mem_reg* reg);
/* The registration covering all of [ptr, ptr + bytes), if any: what a
 * transport that maps or pins memory looks up before moving a buffer. It
 * stays valid until the user deregisters it, which must not overlap a call
 * that uses the buffer (NCCL's rule too). */
const struct mem_reg* mem_reg_find(struct mem_regs* regs, const void* ptr, size_t bytes);

#endif /* BRAID_MEM_H_ */
