/*
 * ABI: NCCL 2.32's enum values and struct layouts (ncclConfig_t,
 * ncclCollConfig_t, ncclSimInfo_t), read by size from older headers, the exported nccl*
 * and pnccl* symbols of libnccl.so.2 (loaded with dlopen), and its soname.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "braid.h"
#include "nccl.h"

static const char* g_lib = "build/lib/libnccl.so.2";

static void test_enum_values(void** state) {
  (void)state;
  assert_int_equal(ncclSuccess, 0);
  assert_int_equal(ncclUnhandledCudaError, 1);
  assert_int_equal(ncclSystemError, 2);
  assert_int_equal(ncclInternalError, 3);
  assert_int_equal(ncclInvalidArgument, 4);
  assert_int_equal(ncclInvalidUsage, 5);
  assert_int_equal(ncclRemoteError, 6);
  assert_int_equal(ncclInProgress, 7);
  assert_int_equal(ncclTimeout, 8);
  assert_int_equal(ncclNumResults, 9);
  assert_int_equal(ncclStatGpuMemSuspend, 0);
  assert_int_equal(ncclStatGpuMemTotal, 3);
  assert_int_equal(NCCL_SHRINK_ABORT, 1);
  assert_int_equal(NCCL_API_MAGIC, 0xcafebeef);
  assert_int_equal(NCCL_WIN_REQUIRED_ALIGNMENT, 4096);
  assert_int_equal(ncclSum, 0);
  assert_int_equal(ncclProd, 1);
  assert_int_equal(ncclMax, 2);
  assert_int_equal(ncclMin, 3);
  assert_int_equal(ncclAvg, 4);
  assert_int_equal(ncclNumOps, 5);
  assert_int_equal(ncclInt8, 0);
  assert_int_equal(ncclChar, 0);
  assert_int_equal(ncclUint8, 1);
  assert_int_equal(ncclInt32, 2);
  assert_int_equal(ncclInt, 2);
  assert_int_equal(ncclUint32, 3);
  assert_int_equal(ncclInt64, 4);
  assert_int_equal(ncclUint64, 5);
  assert_int_equal(ncclFloat16, 6);
  assert_int_equal(ncclHalf, 6);
  assert_int_equal(ncclFloat32, 7);
  assert_int_equal(ncclFloat, 7);
  assert_int_equal(ncclFloat64, 8);
  assert_int_equal(ncclDouble, 8);
  assert_int_equal(ncclBfloat16, 9);
  assert_int_equal(ncclFloat8e4m3, 10);
  assert_int_equal(ncclFloat8e5m2, 11);
  assert_int_equal(ncclNumTypes, 12);
  assert_int_equal(ncclScalarDevice, 0);
  assert_int_equal(ncclScalarHostImmediate, 1);
  assert_int_equal(NCCL_UNIQUE_ID_BYTES, 128);
  assert_int_equal(sizeof(ncclUniqueId), 128);
  assert_int_equal(sizeof(ncclRedOp_t), 4);
}

static void test_config_layout(void** state) {
  (void)state;
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  static const struct {
    size_t offset, want;
  } fields[] = {
      {offsetof(ncclConfig_t, size), 0},
      {offsetof(ncclConfig_t, magic), 8},
      {offsetof(ncclConfig_t, version), 12},
      {offsetof(ncclConfig_t, blocking), 16},
      {offsetof(ncclConfig_t, cgaClusterSize), 20},
      {offsetof(ncclConfig_t, minCTAs), 24},
      {offsetof(ncclConfig_t, maxCTAs), 28},
      {offsetof(ncclConfig_t, netName), 32},
      {offsetof(ncclConfig_t, splitShare), 40},
      {offsetof(ncclConfig_t, trafficClass), 44},
      {offsetof(ncclConfig_t, commName), 48},
      {offsetof(ncclConfig_t, collnetEnable), 56},
      {offsetof(ncclConfig_t, CTAPolicy), 60},
      {offsetof(ncclConfig_t, shrinkShare), 64},
      {offsetof(ncclConfig_t, nvlsCTAs), 68},
      {offsetof(ncclConfig_t, nChannelsPerNetPeer), 72},
      {offsetof(ncclConfig_t, nvlinkCentricSched), 76},
      {offsetof(ncclConfig_t, graphUsageMode), 80},
      {offsetof(ncclConfig_t, numRmaCtx), 84},
      {offsetof(ncclConfig_t, maxP2pPeers), 88},
      {offsetof(ncclConfig_t, graphStreamOrdering), 92},
      {offsetof(ncclConfig_t, launchOrderImplicit), 96},
      {offsetof(ncclConfig_t, numRmaSig), 100},
      {offsetof(ncclConfig_t, rmaEagerInit), 104},
      {offsetof(ncclConfig_t, hostCftMode), 108},
      {offsetof(ncclConfig_t, nvlsHostMode), 112},
      {sizeof(ncclConfig_t), 120},
  };
  for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
    assert_int_equal(fields[i].offset, fields[i].want);
  assert_int_equal(c.size, sizeof(ncclConfig_t));
  assert_int_equal(c.magic, 0xcafebeef);
  assert_int_equal(c.version, 23203);
  assert_int_equal(c.blocking, INT_MIN);
  assert_int_equal(c.nvlsHostMode, INT_MIN);
  assert_null(c.netName);
  assert_null(c.commName);
}

static void test_coll_config_layout(void** state) {
  (void)state;
  ncclCollConfig_t c = NCCL_COLLCONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  assert_int_equal(offsetof(ncclCollConfig_t, ext), 16);
  assert_int_equal(offsetof(ncclCollConfig_t, cgaClusterSize), 36);
  assert_int_equal(offsetof(ncclCollConfig_t, algSelection), 40);
  assert_int_equal(offsetof(ncclCollConfig_t, forceAlgSelection), 48);
  assert_int_equal(offsetof(ncclCollConfig_t, userProfilerTag), 56);
  assert_int_equal(offsetof(ncclCollConfig_t, launchCompletionEvent), 64);
  assert_int_equal(sizeof(ncclCollConfig_t), 72);
  assert_int_equal(c.forceAlgSelection, 1);
  assert_int_equal(c.CTAPolicy, INT_MIN);
  assert_int_equal(sizeof(ncclSimInfo_t), 24);
  assert_int_equal(sim.magic, 0x74685283);
  assert_true(sim.estimatedTime == NCCL_UNDEF_FLOAT);
  assert_int_equal(sizeof(ncclEncryptionConfig_t), 32);
  assert_int_equal(sizeof(ncclWaitSignalDesc_t), 16);
}

static void test_version(void** state) {
  (void)state;
  int v = 0;
  assert_int_equal(ncclGetVersion(&v), ncclSuccess);
  assert_int_equal(v, BRAID_NCCL_LEVEL);
  assert_true(v <= NCCL_VERSION_CODE);
  assert_int_equal(NCCL_VERSION(2, 32, 3), 23203);
  assert_int_equal(ncclGetVersion(NULL), ncclInvalidArgument);
  assert_string_equal(ncclGetErrorString(ncclSuccess), "no error");
  assert_non_null(ncclGetErrorString((ncclResult_t)99));
}

static const char* const k_symbols[] = {
    "GetVersion",     "GetUniqueId",  "CommInitRank", "CommInitRankConfig",
    "CommInitAll",    "CommFinalize", "CommDestroy",  "CommAbort",
    "CommCount",      "CommUserRank", "CommCuDevice", "CommGetAsyncError",
    "GetErrorString", "GetLastError", "AllReduce",    "RedOpCreatePreMulSum",
    "RedOpDestroy",   "GroupStart",   "GroupEnd",
};

static void test_exported_symbols(void** state) {
  (void)state;
  void* h = dlopen(g_lib, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) fprintf(stderr, "dlopen %s: %s\n", g_lib, dlerror());
  assert_non_null(h);
  char name[64];
  for (size_t i = 0; i < sizeof(k_symbols) / sizeof(k_symbols[0]); i++) {
    snprintf(name, sizeof(name), "nccl%s", k_symbols[i]);
    void* a = dlsym(h, name);
    snprintf(name, sizeof(name), "pnccl%s", k_symbols[i]);
    void* b = dlsym(h, name);
    if (!a || !b) fprintf(stderr, "missing symbol for %s\n", k_symbols[i]);
    assert_non_null(a);
    assert_ptr_equal(a, b);
  }
  /* internals stay hidden */
  assert_null(dlsym(h, "exec_progress"));
  assert_null(dlsym(h, "kern_reduce"));
  struct link_map* map = NULL;
  assert_int_equal(dlinfo(h, RTLD_DI_LINKMAP, &map), 0);
  dlclose(h);
}

int main(int argc, char** argv) {
  if (argc > 1) g_lib = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_enum_values),        cmocka_unit_test(test_config_layout),
      cmocka_unit_test(test_coll_config_layout), cmocka_unit_test(test_version),
      cmocka_unit_test(test_exported_symbols),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
