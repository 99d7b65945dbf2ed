/*
 * ncclCommRegister and ncclCommDeregister (mem_register.h): a comm's
 * registrations of user buffers, checked, into its cache (mem.c); windows
 * (window.c) register through here too.
 */
#include "api/mem_register.h"

#include <stdint.h>

#include "comm/comm.h"
#include "core.h"
#include "engine/mem.h"

/* A range a registration may name: a buffer no machine can hold (a size
 * like SIZE_MAX, a negative number cast) or one that wraps is a bug. */
static ncclResult_t reg_range_check(const char* fn, const void* buff, size_t size) {
  if (size <= COMM_MAX_BYTES && (uintptr_t)buff <= UINTPTR_MAX - size) return ncclSuccess;
  WARN("%s : [%p, +%zu) is larger than any buffer can be (2^56 bytes) or wraps", fn, buff, size);
  return ncclInvalidArgument;
}

ncclResult_t mem_reg_api(struct ncclComm* comm, const char* fn, void* buff, size_t size, int window,
                         int win_flags, struct mem_reg** out) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_call_enter(comm, fn, COMM_CALL_WORKING));
  if (buff == NULL || size == 0 || out == NULL) {
    WARN("%s : buff %p size %zu handle %p", fn, buff, size, (void*)out);
    res = ncclInvalidArgument;
  }
  if (res == ncclSuccess) res = reg_range_check(fn, buff, size);
  if (res == ncclSuccess)
    res = window ? mem_window_add(&comm->regs, buff, size, win_flags, out)
                 : mem_reg_add(&comm->regs, buff, size, out);
  comm_call_leave(comm);
fail:
  return res;
}

/* Registration: the TCP transport already moves data straight between user
 * buffers and sockets, so there is no copy to skip; the registration is
 * kept (and checked) for transports that map or pin memory. */
NCCL_API(ncclResult_t, ncclCommRegister, const ncclComm_t comm, void* buff, size_t size,
         void** handle);
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  struct mem_reg* r = NULL;
  ncclResult_t res = mem_reg_api(comm, "ncclCommRegister", buff, size, 0, 0, handle ? &r : NULL);
  if (res == ncclSuccess) *handle = r;
  return res;
}

NCCL_API(ncclResult_t, ncclCommDeregister, const ncclComm_t comm, void* handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  ncclResult_t res = ncclSuccess;
  CHECK(comm_check(comm, "ncclCommDeregister"));
  if (!mem_reg_is(&comm->regs, handle, 0) || mem_reg_remove(&comm->regs, handle) != ncclSuccess)
    FAIL(ncclInvalidArgument, "ncclCommDeregister : %p is not a registration of this comm", handle);
fail:
  return res;
}
