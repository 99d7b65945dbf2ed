/*
 * Windows (ncclCommWindowRegister): a buffer registered with the comm for
 * symmetric collectives and one-sided calls. Braid's windows are
 * registrations (mem.c) marked as windows: collectives on a buffer inside
 * one find it registered, as with ncclCommRegister. Braid's host
 * transports need nothing from the other ranks to use a window, so
 * registering one exchanges nothing; the one-sided calls that would use
 * its peers' windows are not provided (api_device.c).
 */
#include "comm/comm.h"
#include "core.h"
#include "engine/mem.h"
#include "api/mem_register.h"

#define WIN_FLAGS_KNOWN \
  (NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING | NCCL_WIN_GIN_ONLY | NCCL_WIN_CFT_COUNTED)

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size,
         ncclWindow_t* win, int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  ncclResult_t res = ncclSuccess;
  struct mem_reg* r = NULL;
  if (winFlags & ~WIN_FLAGS_KNOWN)
    FAIL(ncclInvalidArgument, "ncclCommWindowRegister : unknown flags 0x%x", winFlags);
  CHECK(mem_reg_api(comm, "ncclCommWindowRegister", buff, size, 1, winFlags, win ? &r : NULL));
  *win = (ncclWindow_t)r;
  INFO(SUB_INIT, "Rank %d: window %p = [%p, +%zu) flags 0x%x", comm->rank, (void*)r, buff, size,
       winFlags);
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  ncclResult_t res = ncclSuccess;
  struct mem_reg* r = (struct mem_reg*)win;
  CHECK(comm_check(comm, "ncclCommWindowDeregister"));
  if (!mem_reg_is(&comm->regs, r, 1) || mem_reg_remove(&comm->regs, r) != ncclSuccess)
    FAIL(ncclInvalidArgument, "ncclCommWindowDeregister : %p is not a window of this comm",
         (void*)win);
fail:
  return res;
}

NCCL_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  ncclResult_t res = ncclSuccess;
  const struct mem_reg* r = (const struct mem_reg*)win;
  CHECK(comm_check(comm, "ncclWinGetUserPtr"));
  if (outUserPtr == NULL) FAIL(ncclInvalidArgument, "ncclWinGetUserPtr : outUserPtr is NULL");
  if (!mem_reg_is(&comm->regs, r, 1))
    FAIL(ncclInvalidArgument, "ncclWinGetUserPtr : %p is not a window of this comm", (void*)win);
  *outUserPtr = r->base;
fail:
  return res;
}
