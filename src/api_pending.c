/*
 * NCCL 2.32 host calls Braid does not provide yet (issue 15 tracks them):
 * exported so that clients built against 2.32 load, each answering
 * ncclInvalidUsage with a WARN that names it. Each moves to its own file
 * when it is implemented; this file then disappears.
 */
#include "core.h"

static ncclResult_t not_yet(const char* fn) {
  WARN("%s: not provided by this version of Braid", fn);
  return ncclInvalidUsage;
}

NCCL_API(ncclResult_t, ncclCommRevoke, ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  (void)comm, (void)revokeFlags;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommShrink, ncclComm_t comm, int* excludeRanksList,
         int excludeRanksCount, ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  (void)comm, (void)excludeRanksList, (void)excludeRanksCount, (void)newcomm, (void)config;
  (void)shrinkFlags;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommGetUniqueId, ncclComm_t comm, ncclUniqueId* uniqueId);
ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* uniqueId) {
  (void)comm, (void)uniqueId;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommGrow, ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId,
         int rank, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId* uniqueId, int rank,
                          ncclComm_t* newcomm, ncclConfig_t* config) {
  (void)comm, (void)nRanks, (void)uniqueId, (void)rank, (void)newcomm, (void)config;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommSuspend, ncclComm_t comm, int flags);
ncclResult_t ncclCommSuspend(ncclComm_t comm, int flags) {
  (void)comm, (void)flags;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommResume, ncclComm_t comm);
ncclResult_t ncclCommResume(ncclComm_t comm) {
  (void)comm;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommMemStats, ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value);
ncclResult_t ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t* value) {
  (void)comm, (void)stat, (void)value;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommWindowRegister, ncclComm_t comm, void* buff, size_t size,
         ncclWindow_t* win, int winFlags);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                    int winFlags) {
  (void)comm, (void)buff, (void)size, (void)win, (void)winFlags;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommWindowDeregister, ncclComm_t comm, ncclWindow_t win);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  (void)comm, (void)win;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclWinGetUserPtr, ncclComm_t comm, ncclWindow_t win, void** outUserPtr);
ncclResult_t ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void** outUserPtr) {
  (void)comm, (void)win, (void)outUserPtr;
  return not_yet(__func__);
}

NCCL_API(ncclResult_t, ncclCommQueryProperties, ncclComm_t comm, void* props);
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, void* props) {
  (void)comm, (void)props;
  return not_yet(__func__);
}
