/*
 * Registering user buffers with a comm (mem_register.c).
 */
#ifndef BRAID_MEM_REGISTER_H_
#define BRAID_MEM_REGISTER_H_

#include <stddef.h>

#include "engine/mem.h"
#include "nccl.h"

struct ncclComm;

/* ncclCommRegister and ncclCommWindowRegister (fn names it in WARNs):
 * the comm working, a range of at most COMM_MAX_BYTES that does not wrap
 * the address space, then listed (window: with its flags). */
ncclResult_t mem_reg_api(struct ncclComm* comm, const char* fn, void* buff, size_t size, int window,
                         int win_flags, struct mem_reg** out);

#endif /* BRAID_MEM_REGISTER_H_ */
