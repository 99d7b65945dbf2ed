/*
 * ABI: NCCL 2.19's enum values and ncclConfig_t layout, the exported nccl*
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
  assert_int_equal(ncclNumResults, 8);
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
  assert_int_equal(offsetof(ncclConfig_t, size), 0);
  assert_int_equal(offsetof(ncclConfig_t, magic), 8);
  assert_int_equal(offsetof(ncclConfig_t, version), 12);
  assert_int_equal(offsetof(ncclConfig_t, blocking), 16);
  assert_int_equal(offsetof(ncclConfig_t, cgaClusterSize), 20);
  assert_int_equal(offsetof(ncclConfig_t, minCTAs), 24);
  assert_int_equal(offsetof(ncclConfig_t, maxCTAs), 28);
  assert_int_equal(offsetof(ncclConfig_t, netName), 32);
  assert_int_equal(offsetof(ncclConfig_t, splitShare), 40);
  assert_int_equal(sizeof(ncclConfig_t), 48);
  assert_int_equal(c.size, sizeof(ncclConfig_t));
  assert_int_equal(c.magic, 0xcafebeef);
  assert_int_equal(c.version, 21903);
  assert_int_equal(c.blocking, INT_MIN);
  assert_null(c.netName);
}

static void test_version(void** state) {
  (void)state;
  int v = 0;
  assert_int_equal(ncclGetVersion(&v), ncclSuccess);
  assert_int_equal(v, NCCL_VERSION_CODE);
  assert_int_equal(NCCL_VERSION(2, 19, 3), 21903);
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
      cmocka_unit_test(test_enum_values),
      cmocka_unit_test(test_config_layout),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_exported_symbols),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
