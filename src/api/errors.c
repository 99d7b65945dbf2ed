/*
 * Diagnostics: error strings (NCCL's wording), ncclGetLastError (the text
 * of the most recent WARN) and ncclResetDebugInit.
 */
#include "core.h"

NCCL_API(const char*, ncclGetErrorString, ncclResult_t code);
const char* ncclGetErrorString(ncclResult_t code) {
  switch (code) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the Braid developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclTimeout:
      return "operation timed out";
    default:
      return "unknown result code";
  }
}

NCCL_API(const char*, ncclGetLastError, ncclComm_t comm);
const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm; /* NCCL keeps one last error per process; so do we (per thread first) */
  return debug_last_error();
}

NCCL_API(void, ncclResetDebugInit, void);
void ncclResetDebugInit(void) {
  debug_reset();
}

/* NCCL exports this name too (without a pnccl alias); same effect. */
BRAID_API(void, ncclResetDebugInitInternal, void);
void ncclResetDebugInitInternal(void) {
  debug_reset();
}
