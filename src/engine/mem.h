/*
 * A comm's registered memory: the ranges ncclCommRegister and windows
 * registered, and what a transport is told of a buffer inside one. (What
 * kind a buffer is, and copies between kinds: gpu/mem_kind.h.)
 */
#ifndef BRAID_MEM_H_
#define BRAID_MEM_H_

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "mem_kind.h"
#include "nccl.h"
#include "transport.h"

/* Handles a registration keeps for those who pin or map it: one per
 * transport id (below TRANSPORT_MAX_ID, transport_table.c checks). */
#define MEM_REG_HANDLES TRANSPORT_MAX_ID

/* One ncclCommRegister'ed range, or a window (ncclCommWindowRegister);
 * the handle the user gets back. */
struct mem_reg {
  void* base;
  size_t size;
  int window; /* 1: a window, with its flags in win_flags */
  int win_flags;
  void* handles[MEM_REG_HANDLES]; /* the attach hook's, by transport id (cudaipc: the
                                     CUDA IPC export of device memory, or NULL) */
  struct mem_reg* next;
};

/* Who else prepares a registered range: a comm's transports. attach runs
 * before a registration is listed (its failure fails the register), detach
 * after it is unlisted. */
struct mem_reg_hooks {
  ncclResult_t (*attach)(void* arg, struct mem_reg* reg);
  void (*detach)(void* arg, struct mem_reg* reg);
  void* arg;
};

/* A comm's registrations. Register and deregister come from user threads
 * while the comm's work runs elsewhere: the lock covers the list; `count`
 * lets a call without registrations skip the lookup and the lock. */
struct mem_regs {
  pthread_mutex_t lock;
  struct mem_reg* head;
  _Atomic int count;
  struct mem_reg_hooks hooks;
};

/* hooks: NULL when nothing else registers memory. */
void mem_regs_init(struct mem_regs* regs, const struct mem_reg_hooks* hooks);
/* Drop every registration left (the user need not deregister first). */
void mem_regs_free(struct mem_regs* regs);
ncclResult_t mem_reg_add(struct mem_regs* regs, void* base, size_t size, struct mem_reg** out);
/* The same for a window with its NCCL_WIN_* flags. */
ncclResult_t mem_window_add(struct mem_regs* regs, void* base, size_t size, int flags,
                            struct mem_reg** out);
/* ncclInvalidArgument when `reg` is not one of these registrations. */
ncclResult_t mem_reg_remove(struct mem_regs* regs, struct mem_reg* reg);
/* Whether `reg` is one of these registrations, a window (window 1) or a
 * plain one (window 0). */
int mem_reg_is(struct mem_regs* regs, const struct mem_reg* reg, int window);
/* The registration covering all of [ptr, ptr + bytes), if any: what a
 * transport that maps or pins memory looks up before moving a buffer. It
 * stays valid until the user deregisters it, which must not overlap a call
 * that uses the buffer (NCCL's rule too). */
const struct mem_reg* mem_reg_find(struct mem_regs* regs, const void* ptr, size_t bytes);

/* What transport t is told of `bytes` at ptr, memory of `kind`: the
 * TRANSPORT_CAP_*_MEM bit, and t's handle from `reg` (NULL: none) when the
 * bytes lie inside it. */
struct transport_buf mem_transport_buf(void* ptr, size_t bytes, enum mem_kind kind,
                                       const struct mem_reg* reg, const struct transport* t);

#endif /* BRAID_MEM_H_ */
