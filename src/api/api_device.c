/*
 * The host entry points of NCCL's device-side API (nccl_device.h: device
 * communicators, teams, LSA/GIN/multimem/CFT pointers and barriers) and of
 * the one-sided and encryption calls. Braid provides none of them: each is
 * exported so that a client built against NCCL 2.32 loads, and each
 * answers ncclInvalidUsage with a WARN (so ncclGetLastError names the
 * call). ncclCommQueryProperties says deviceApiSupport = false, which is
 * how a client should find this out before calling.
 */
#include "core.h"

/* ncclTeam_t: returned by value, so its layout (three ints) is ABI. */
struct nccl_team {
  int nRanks, rank, stride;
};

static ncclResult_t not_provided(const char* fn) {
  WARN("%s: Braid does not provide NCCL's device-side API (see ncclCommQueryProperties)", fn);
  return ncclInvalidUsage;
}

static struct nccl_team no_team(const char* fn) {
  struct nccl_team none = {0, -1, 0};
  not_provided(fn);
  return none;
}

NCCL_API(ncclResult_t, ncclDevCommCreate, ncclComm_t comm, const void* reqs, void* outDevComm);
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm) {
  (void)comm, (void)reqs, (void)outDevComm;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclDevCommDestroy, ncclComm_t comm, const void* devComm);
ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void* devComm) {
  (void)comm, (void)devComm;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGetLsaMultimemDevicePointer, ncclWindow_t w, size_t off, void** out);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t w, size_t off, void** out) {
  (void)w, (void)off, (void)out;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGetMultimemDevicePointer, ncclWindow_t w, size_t off, void* mm,
         void** out);
ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t w, size_t off, void* mm, void** out) {
  (void)w, (void)off, (void)mm, (void)out;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGetLsaDevicePointer, ncclWindow_t w, size_t off, int lsaRank,
         void** out);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t w, size_t off, int lsaRank, void** out) {
  (void)w, (void)off, (void)lsaRank, (void)out;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGetPeerDevicePointer, ncclWindow_t w, size_t off, int peer, void** out);
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t w, size_t off, int peer, void** out) {
  (void)w, (void)off, (void)peer, (void)out;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGetMultimemDeviceLeInfo, ncclWindow_t w, size_t off, uint32_t* le,
         size_t* leOff);
ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t w, size_t off, uint32_t* le, size_t* leOff) {
  (void)w, (void)off, (void)le, (void)leOff;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGetCftDeviceLeInfo, ncclWindow_t w, size_t off, int peerCft,
         struct nccl_team team, uint32_t* le, size_t* leOff);
ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t w, size_t off, int peerCft, struct nccl_team team,
                                    uint32_t* le, size_t* leOff) {
  (void)w, (void)off, (void)peerCft, (void)team, (void)le, (void)leOff;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGetPeerDeviceLeInfo, ncclWindow_t w, size_t off, int peerWorld,
         uint32_t* le, size_t* leOff);
ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t w, size_t off, int peerWorld, uint32_t* le,
                                     size_t* leOff) {
  (void)w, (void)off, (void)peerWorld, (void)le, (void)leOff;
  return not_provided(__func__);
}

/* Teams answer an empty team (rank -1) besides the WARN: they return a
 * struct, not a result code. */
NCCL_API(struct nccl_team, ncclTeamWorld, ncclComm_t comm);
struct nccl_team ncclTeamWorld(ncclComm_t comm) {
  (void)comm;
  return no_team(__func__);
}

NCCL_API(struct nccl_team, ncclTeamLsa, ncclComm_t comm);
struct nccl_team ncclTeamLsa(ncclComm_t comm) {
  (void)comm;
  return no_team(__func__);
}

NCCL_API(struct nccl_team, ncclTeamRail, ncclComm_t comm);
struct nccl_team ncclTeamRail(ncclComm_t comm) {
  (void)comm;
  return no_team(__func__);
}

NCCL_API(struct nccl_team, ncclTeamCft, ncclComm_t comm, int mode);
struct nccl_team ncclTeamCft(ncclComm_t comm, int mode) {
  (void)comm, (void)mode;
  return no_team(__func__);
}

NCCL_API(struct nccl_team, ncclTeamCftMultimem, ncclComm_t comm);
struct nccl_team ncclTeamCftMultimem(ncclComm_t comm) {
  (void)comm;
  return no_team(__func__);
}

/* Rank translations answer -1 (no such rank). */
NCCL_API(int, ncclTeamRankToWorld, ncclComm_t comm, struct nccl_team team, int rank);
int ncclTeamRankToWorld(ncclComm_t comm, struct nccl_team team, int rank) {
  (void)comm, (void)team, (void)rank;
  not_provided(__func__);
  return -1;
}

NCCL_API(int, ncclTeamRankToLsa, ncclComm_t comm, struct nccl_team team, int rank);
int ncclTeamRankToLsa(ncclComm_t comm, struct nccl_team team, int rank) {
  (void)comm, (void)team, (void)rank;
  not_provided(__func__);
  return -1;
}

NCCL_API(ncclResult_t, ncclLsaBarrierCreateRequirement, struct nccl_team team, int n, void* h,
         void* req);
ncclResult_t ncclLsaBarrierCreateRequirement(struct nccl_team team, int n, void* h, void* req) {
  (void)team, (void)n, (void)h, (void)req;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGinBarrierCreateRequirement, ncclComm_t comm, struct nccl_team team,
         int n, void* h, void* req);
ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, struct nccl_team team, int n, void* h,
                                             void* req) {
  (void)comm, (void)team, (void)n, (void)h, (void)req;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGinOutboxCreateRequirement, int nBlocks, int sizeLog2, void* h,
         void* req);
ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int sizeLog2, void* h, void* req) {
  (void)nBlocks, (void)sizeLog2, (void)h, (void)req;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclGinInboxA2ACreateRequirement, struct nccl_team peers, int nBlocks,
         int sizeLog2, void* h, void* req);
ncclResult_t ncclGinInboxA2ACreateRequirement(struct nccl_team peers, int nBlocks, int sizeLog2,
                                              void* h, void* req) {
  (void)peers, (void)nBlocks, (void)sizeLog2, (void)h, (void)req;
  return not_provided(__func__);
}

/* Answers -1 slots: no LL all-to-all buffer can be made. */
NCCL_API(int, ncclLLA2ACalcSlots, int maxElts, int maxEltSize);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize) {
  (void)maxElts, (void)maxEltSize;
  not_provided(__func__);
  return -1;
}

NCCL_API(ncclResult_t, ncclLLA2ACreateRequirement, int nBlocks, int nSlots, void* h, void* req);
ncclResult_t ncclLLA2ACreateRequirement(int nBlocks, int nSlots, void* h, void* req) {
  (void)nBlocks, (void)nSlots, (void)h, (void)req;
  return not_provided(__func__);
}

/* One-sided signalling needs the device API's windows; not provided. */
NCCL_API(ncclResult_t, ncclPutSignal, const void* localbuff, size_t count, ncclDataType_t datatype,
         int peer, ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
         unsigned int flags, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclPutSignal(const void* localbuff, size_t count, ncclDataType_t datatype, int peer,
                           ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                           unsigned int flags, ncclComm_t comm, cudaStream_t stream) {
  (void)localbuff, (void)count, (void)datatype, (void)peer, (void)peerWin, (void)peerWinOffset;
  (void)sigIdx, (void)ctx, (void)flags, (void)comm, (void)stream;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclSignal, int peer, int sigIdx, int ctx, unsigned int flags,
         ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                        cudaStream_t stream) {
  (void)peer, (void)sigIdx, (void)ctx, (void)flags, (void)comm, (void)stream;
  return not_provided(__func__);
}

NCCL_API(ncclResult_t, ncclWaitSignal, int nDesc, ncclWaitSignalDesc_t* descs, ncclComm_t comm,
         cudaStream_t stream);
ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t* descs, ncclComm_t comm,
                            cudaStream_t stream) {
  (void)nDesc, (void)descs, (void)comm, (void)stream;
  return not_provided(__func__);
}

/* Encryption: Braid's traffic is plaintext; asking for none is honoured. */
NCCL_API(ncclResult_t, ncclSetEncryption, const ncclEncryptionConfig_t* config);
ncclResult_t ncclSetEncryption(const ncclEncryptionConfig_t* config) {
  if (config != NULL && config->mode == NCCL_ENCRYPTION_MODE_NONE) return ncclSuccess;
  WARN("ncclSetEncryption: Braid does not encrypt its traffic (only NCCL_ENCRYPTION_MODE_NONE)");
  return ncclInvalidUsage;
}
