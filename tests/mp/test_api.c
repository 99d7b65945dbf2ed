/* The NCCL 2.22-2.32 host calls beyond the collectives themselves: the
 * per-call config forms, ncclGroupSimulateEnd, the parameter API,
 * ncclResetDebugInit, encryption, and the device-side API's refusal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "braid.h"
#include "collcheck.h"
#include "launcher.h"

/* The device-side API is declared by nccl_device.h, which Braid does not
 * ship; a client compiled against NVIDIA's calls it like this. */
ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void* reqs, void* outDevComm);

/* One collective through its nccl*Config form. */
static ncclResult_t issue_config(const cc_call* c, ncclComm_t comm, const ncclCollConfig_t* cfg) {
  switch (c->coll) {
    case CC_ALLREDUCE:
      return ncclAllReduceConfig(c->send, c->recv, c->count, c->type, c->op, comm, NULL, cfg);
    case CC_BROADCAST:
      return ncclBroadcastConfig(c->send, c->recv, c->count, c->type, c->root, comm, NULL, cfg);
    case CC_REDUCE:
      return ncclReduceConfig(c->send, c->recv, c->count, c->type, c->op, c->root, comm, NULL, cfg);
    case CC_ALLGATHER:
      return ncclAllGatherConfig(c->send, c->recv, c->count, c->type, comm, NULL, cfg);
    case CC_REDUCESCATTER:
      return ncclReduceScatterConfig(c->send, c->recv, c->count, c->type, c->op, comm, NULL, cfg);
    case CC_ALLTOALL:
      return ncclAlltoAllConfig(c->send, c->recv, c->count, c->type, comm, NULL, cfg);
    case CC_GATHER:
      return ncclGatherConfig(c->send, c->recv, c->count, c->type, c->root, comm, NULL, cfg);
    default:
      return ncclScatterConfig(c->send, c->recv, c->count, c->type, c->root, comm, NULL, cfg);
  }
}

/* Every nccl*Config form, with a NULL config and with an initialized one
 * (fields Braid ignores set), checked element by element through
 * collcheck's references: the data of the plain calls. A config without
 * the initializer's magic is refused. */
static int config_exact_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0;
  ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
  cfg.algSelection = "Ring";
  cfg.maxCTAs = 4;
  for (int k = 0; k < 2 * CC_NCOLLS && !bad; k++) {
    int coll = k % CC_NCOLLS;
    if (coll == CC_BCAST) continue; /* no Config form */
    cc_call c = {.coll = coll, .type = ncclBfloat16, .kind = AR_SUM, .op = ncclSum, .count = 1031};
    c.root = env->nranks / 2;
    c.salt = 77u + (uint64_t)k;
    c.inplace = k >= CC_NCOLLS;
    if (cc_prepare(&c, env) != 0) return 1;
    ncclResult_t rc = issue_config(&c, comm, k < CC_NCOLLS ? NULL : &cfg);
    if (rc != ncclSuccess) {
      cc_report_rc(&c, env, comm, rc);
      bad++;
    } else {
      bad += cc_verify(&c, env);
    }
    cc_release(&c);
  }
  ncclCollConfig_t wrong = NCCL_COLLCONFIG_INITIALIZER;
  float x = 1;
  wrong.magic = 0;
  bad += mp_expect_rc(env, comm,
                      ncclAllReduceConfig(&x, &x, 1, ncclFloat, ncclSum, comm, NULL, &wrong),
                      ncclInvalidArgument, "ncclAllReduceConfig(config without magic)");
  bad += mp_expect_last_error(env, comm, "ncclAllReduceConfig(config without magic)");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_config_exact(void** state) {
  (void)state;
  assert_int_equal(mp_launch(4, config_exact_body, NULL, NULL), 0);
}

/* ncclGroupSimulateEnd ends the group, runs nothing (the buffers keep their
 * poison), reports a positive modelled time that grows with the bytes, and
 * leaves the comm working. Misuse is refused. */
static int simulate_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0;
  size_t big = 1 << 20;
  float* buf = malloc(sizeof(float) * big);
  float* out = malloc(sizeof(float) * big * (size_t)env->nranks);
  float t[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    size_t count = k ? big : 64;
    for (size_t i = 0; i < count; i++) buf[i] = -1.0f;
    ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
    bad += mp_expect_rc(env, comm, ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, NULL),
                        ncclSuccess, "ncclAllReduce (simulated)");
    bad += mp_expect_rc(env, comm,
                        ncclSend(buf, count, ncclFloat, (env->rank + 1) % env->nranks, comm, NULL),
                        ncclSuccess, "ncclSend (simulated)");
    bad += mp_expect_rc(env, comm, ncclGroupSimulateEnd(&sim), ncclSuccess, "ncclGroupSimulateEnd");
    t[k] = sim.estimatedTime;
    if (!(sim.estimatedTime > 0))
      mp_fail(env, "estimated time %g for %zu floats", sim.estimatedTime, count), bad++;
    if (buf[0] != -1.0f || buf[count - 1] != -1.0f) mp_fail(env, "a simulated call ran"), bad++;
  }
  if (!(t[1] > t[0])) mp_fail(env, "4 MiB modelled at %g us, 256 B at %g us", t[1], t[0]), bad++;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  bad += mp_expect_rc(env, comm, ncclGroupSimulateEnd(&sim), ncclInvalidUsage,
                      "ncclGroupSimulateEnd outside a group");
  ncclSimInfo_t junk;
  memset(&junk, 0, sizeof(junk));
  bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
  bad += mp_expect_rc(env, comm, ncclGroupSimulateEnd(&junk), ncclInvalidArgument,
                      "ncclGroupSimulateEnd(uninitialized simInfo)");
  bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd after the refusal");
  /* The comm still works, with nothing left over from the simulations. */
  cc_call c = {.coll = CC_ALLGATHER, .type = ncclFloat32, .count = 5000, .salt = 9};
  bad += cc_run(&c, env, comm) != 0;
  free(buf);
  free(out);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  if (env->rank == 0) mp_log(env, "simulated: 256 B %.1f us, 4 MiB %.1f us", t[0], t[1]);
  return bad != 0;
}

static void test_group_simulate(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, simulate_body, NULL, NULL), 0);
}

/* ncclCommProperties_t as NCCL 2.32's nccl_device/host.h lays it out. */
typedef struct {
  size_t size;
  unsigned int magic, version;
  int rank, nRanks, cudaDev, nvmlDev;
  _Bool deviceApiSupport, multimemSupport;
  int ginType, nLsaTeams;
  _Bool hostRmaSupport;
  int railedGinType;
  uint64_t commHash;
  int ginMinStride, ginConnectionType;
  _Bool ginSupport[64];
  size_t devCommRuntimeVersionSize;
  _Bool cftSupport, cftMulticastSupport, cftCountedSupport;
} comm_properties;
ncclResult_t ncclCommQueryProperties(ncclComm_t comm, comm_properties* props);

/* Properties (honest: no device API), windows, memory statistics and
 * suspend/resume on a live comm. */
static int comm_state_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0;
  comm_properties p;
  memset(&p, 0x7f, sizeof(p));
  p.size = sizeof(p);
  p.magic = NCCL_API_MAGIC;
  p.version = NCCL_VERSION_CODE;
  bad += mp_expect_rc(env, comm, ncclCommQueryProperties(comm, &p), ncclSuccess,
                      "ncclCommQueryProperties");
  if (p.rank != env->rank || p.nRanks != env->nranks || p.deviceApiSupport || p.multimemSupport ||
      p.hostRmaSupport || p.ginType != 0 || p.ginSupport[2] || p.cftCountedSupport)
    mp_fail(env, "properties: rank %d of %d, device API %d multimem %d", p.rank, p.nRanks,
            p.deviceApiSupport, p.multimemSupport),
        bad++;
  comm_properties short_props;
  memset(&short_props, 0x7f, sizeof(short_props));
  short_props.size = 24; /* a header that knew rank and nRanks only */
  short_props.magic = NCCL_API_MAGIC;
  bad += mp_expect_rc(env, comm, ncclCommQueryProperties(comm, &short_props), ncclSuccess,
                      "ncclCommQueryProperties(24 bytes)");
  if (short_props.nRanks != env->nranks || short_props.cudaDev != 0x7f7f7f7f)
    mp_fail(env, "a 24-byte properties struct was not filled up to its size and no further"), bad++;
  /* a window: registered, found, used, refused as a plain registration */
  float* buf = malloc(sizeof(float) * 8192);
  for (int i = 0; i < 8192; i++) buf[i] = (float)(env->rank + 1);
  ncclWindow_t win = NULL;
  void* user = NULL;
  bad += mp_expect_rc(
      env, comm,
      ncclCommWindowRegister(comm, buf, 8192 * sizeof(float), &win, NCCL_WIN_COLL_SYMMETRIC),
      ncclSuccess, "ncclCommWindowRegister");
  bad += mp_expect_rc(env, comm, ncclWinGetUserPtr(comm, win, &user), ncclSuccess,
                      "ncclWinGetUserPtr");
  if (user != buf) mp_fail(env, "ncclWinGetUserPtr gave %p, not %p", user, (void*)buf), bad++;
  bad += mp_expect_rc(env, comm, ncclAllReduce(buf, buf, 8192, ncclFloat, ncclSum, comm, NULL),
                      ncclSuccess, "ncclAllReduce in a window");
  if (buf[8191] != (float)(env->nranks * (env->nranks + 1) / 2))
    mp_fail(env, "window all-reduce: %g", buf[8191]), bad++;
  bad += mp_expect_rc(env, comm, ncclCommDeregister(comm, win), ncclInvalidArgument,
                      "ncclCommDeregister(a window)");
  bad += mp_expect_rc(env, comm, ncclCommWindowDeregister(comm, win), ncclSuccess,
                      "ncclCommWindowDeregister");
  bad += mp_expect_rc(env, comm, ncclCommWindowDeregister(comm, win), ncclInvalidArgument,
                      "ncclCommWindowDeregister twice");
  bad += mp_expect_rc(env, comm, ncclCommWindowRegister(comm, buf, 64, &win, 0x100),
                      ncclInvalidArgument, "ncclCommWindowRegister(flags 0x100)");
  /* memory statistics and suspend/resume */
  uint64_t v = 7;
  bad += mp_expect_rc(env, comm, ncclCommMemStats(comm, ncclStatGpuMemTotal, &v), ncclSuccess,
                      "ncclCommMemStats");
  if (v != 0) mp_fail(env, "GPU memory of a host comm: %llu bytes", (unsigned long long)v), bad++;
  bad += mp_expect_rc(env, comm, ncclCommSuspend(comm, NCCL_SUSPEND_MEM), ncclSuccess,
                      "ncclCommSuspend");
  bad += mp_expect_rc(env, comm, ncclCommMemStats(comm, ncclStatGpuMemSuspended, &v), ncclSuccess,
                      "ncclCommMemStats(suspended)");
  if (v != 1) mp_fail(env, "suspended reads %llu", (unsigned long long)v), bad++;
  bad += mp_expect_rc(env, comm, ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, NULL),
                      ncclInvalidUsage, "ncclAllReduce while suspended");
  bad += mp_expect_rc(env, comm, ncclCommResume(comm), ncclSuccess, "ncclCommResume");
  bad += mp_expect_rc(env, comm, ncclCommResume(comm), ncclInvalidUsage, "ncclCommResume twice");
  bad += mp_expect_rc(env, comm, ncclCommMemStats(comm, (ncclCommMemStat_t)9, &v),
                      ncclInvalidArgument, "ncclCommMemStats(9)");
  for (int i = 0; i < 8192; i++) buf[i] = 1.0f;
  bad += mp_expect_rc(env, comm, ncclAllReduce(buf, buf, 8192, ncclFloat, ncclSum, comm, NULL),
                      ncclSuccess, "ncclAllReduce after resume");
  if (buf[0] != (float)env->nranks) mp_fail(env, "all-reduce after resume: %g", buf[0]), bad++;
  free(buf);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_comm_state(void** state) {
  (void)state;
  assert_int_equal(mp_launch(3, comm_state_body, NULL, NULL), 0);
}

/* The parameter API reads the same table the library runs on. */
static int param_body(const mp_env* env) {
  int bad = 0;
  setenv("NCCL_ALGO", "Ring,Tree", 1);
  setenv("BRAID_SHM_NSLOTS", "48", 1);
  ncclParamHandle_t h = NULL, none = (ncclParamHandle_t)0x1;
  bad += mp_expect_rc(env, NULL, ncclParamBind(&h, "NCCL_ALGO"), ncclSuccess,
                      "ncclParamBind(NCCL_ALGO)");
  const char* s = NULL;
  bad += mp_expect_rc(env, NULL, ncclParamGetStr(h, &s), ncclSuccess, "ncclParamGetStr");
  if (s == NULL || strcmp(s, "Ring,Tree") != 0)
    mp_fail(env, "NCCL_ALGO reads %s", s ? s : "(null)"), bad++;
  int32_t i32 = 0;
  bad += mp_expect_rc(env, NULL, ncclParamGetI32(h, &i32), ncclInvalidArgument,
                      "ncclParamGetI32(a string)");
  ncclParamHandle_t slots = NULL, timeout = NULL;
  bad += mp_expect_rc(env, NULL, ncclParamBind(&slots, "BRAID_SHM_NSLOTS"), ncclSuccess,
                      "ncclParamBind");
  bad += mp_expect_rc(env, NULL, ncclParamGetI32(slots, &i32), ncclSuccess, "ncclParamGetI32");
  if (i32 != 48) mp_fail(env, "BRAID_SHM_NSLOTS reads %d", i32), bad++;
  uint8_t u8 = 0;
  bad += mp_expect_rc(env, NULL, ncclParamGetU8(slots, &u8), ncclSuccess, "ncclParamGetU8");
  if (u8 != 48) mp_fail(env, "BRAID_SHM_NSLOTS as u8 reads %u", u8), bad++;
  bad += mp_expect_rc(env, NULL, ncclParamBind(&timeout, "BRAID_TIMEOUT_MS"), ncclSuccess,
                      "ncclParamBind");
  int8_t i8 = 0;
  bad += mp_expect_rc(env, NULL, ncclParamGetI8(timeout, &i8), ncclInvalidArgument,
                      "ncclParamGetI8(300000)");
  int64_t i64 = 0;
  bad += mp_expect_rc(env, NULL, ncclParamGetI64(timeout, &i64), ncclSuccess, "ncclParamGetI64");
  if (i64 != 300000) mp_fail(env, "BRAID_TIMEOUT_MS default reads %lld", (long long)i64), bad++;
  char raw[64];
  int len = 0;
  bad += mp_expect_rc(env, NULL, ncclParamGet(slots, raw, sizeof(raw), &len), ncclSuccess,
                      "ncclParamGet");
  memcpy(&i64, raw, sizeof(i64));
  if (len != 8 || i64 != 48)
    mp_fail(env, "ncclParamGet: %d bytes, %lld", len, (long long)i64), bad++;
  bad += mp_expect_rc(env, NULL, ncclParamGet(h, raw, 3, &len), ncclInvalidArgument,
                      "ncclParamGet(short)");
  if (len != 10) mp_fail(env, "ncclParamGet(short) says %d bytes are needed, not 10", len), bad++;
  bad += mp_expect_rc(env, NULL, ncclParamBind(&none, "NCCL_NO_SUCH_THING"), ncclInvalidArgument,
                      "ncclParamBind(unknown)");
  if (none != (ncclParamHandle_t)0x1) mp_fail(env, "a failed bind changed *out"), bad++;
  int vlen = 0;
  bad += mp_expect_rc(env, NULL, ncclParamGetParameter("BRAID_SHM_NSLOTS", &s, &vlen), ncclSuccess,
                      "ncclParamGetParameter");
  if (strcmp(s, "48") != 0 || vlen != 2)
    mp_fail(env, "ncclParamGetParameter gave %s (%d)", s, vlen), bad++;
  const char** keys = NULL;
  int nkeys = 0, found = 0;
  bad += mp_expect_rc(env, NULL, ncclParamGetAllParameterKeys(&keys, &nkeys), ncclSuccess,
                      "ncclParamGetAllParameterKeys");
  for (int k = 0; k < nkeys; k++)
    found += strcmp(keys[k], "NCCL_ALGO") == 0 || strcmp(keys[k], "BRAID_HWLOC_LIB") == 0;
  if (nkeys < 20 || found != 2)
    mp_fail(env, "%d keys, NCCL_ALGO and BRAID_HWLOC_LIB found %d times", nkeys, found), bad++;
  return bad != 0;
}

static void test_params(void** state) {
  (void)state;
  assert_int_equal(mp_launch(1, param_body, NULL, NULL), 0);
}

/* NCCL_DEBUG changed after the first log line takes effect at
 * ncclResetDebugInit, not before. */
static int reset_debug_body(const mp_env* env) {
  int bad = 0;
  ncclParamHandle_t h;
  unsetenv("NCCL_DEBUG");
  mp_capture cap;
  if (mp_capture_begin(&cap) != 0) return 1;
  ncclParamBind(&h, "NCCL_FIRST_UNKNOWN"); /* a WARN, not printed: logging is off */
  setenv("NCCL_DEBUG", "WARN", 1);
  ncclParamBind(&h, "NCCL_SECOND_UNKNOWN"); /* still off: settings are read once */
  ncclResetDebugInit();
  ncclParamBind(&h, "NCCL_THIRD_UNKNOWN"); /* printed */
  int first = mp_capture_end(&cap, "NCCL_FIRST_UNKNOWN");
  if (mp_capture_begin(&cap) != 0) return 1;
  ncclParamBind(&h, "NCCL_FOURTH_UNKNOWN");
  int fourth = mp_capture_end(&cap, "NCCL WARN*NCCL_FOURTH_UNKNOWN");
  if (first != 0 || fourth != 1)
    mp_fail(env, "WARN lines: %d before the reset (want 0), %d after (want 1)", first, fourth),
        bad++;
  return bad;
}

static void test_reset_debug_init(void** state) {
  (void)state;
  assert_int_equal(mp_launch(1, reset_debug_body, NULL, NULL), 0);
}

/* What Braid does not provide answers ncclInvalidUsage, naming the call in
 * ncclGetLastError; encryption "none" is what Braid does. */
static int refusals_body(const mp_env* env) {
  ncclComm_t comm = NULL;
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = 0;
  char reqs[512] = {0}, devcomm[4096];
  bad += mp_expect_rc(env, comm, ncclDevCommCreate(comm, (void*)reqs, (void*)devcomm),
                      ncclInvalidUsage, "ncclDevCommCreate");
  const char* last = ncclGetLastError(comm);
  if (last == NULL || strstr(last, "ncclDevCommCreate") == NULL)
    mp_fail(env, "last error after ncclDevCommCreate: %s", last ? last : "(null)"), bad++;
  bad +=
      mp_expect_rc(env, comm, ncclSignal(0, 0, 0, 0, comm, NULL), ncclInvalidUsage, "ncclSignal");
  ncclEncryptionConfig_t enc = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  bad += mp_expect_rc(env, comm, ncclSetEncryption(&enc), ncclSuccess, "ncclSetEncryption(none)");
  enc.mode = NCCL_ENCRYPTION_MODE_PSK;
  enc.psk = "secret";
  bad +=
      mp_expect_rc(env, comm, ncclSetEncryption(&enc), ncclInvalidUsage, "ncclSetEncryption(psk)");
  if (strcmp(ncclGetErrorString(ncclTimeout), "unknown result code") == 0)
    mp_fail(env, "ncclTimeout has no error string"), bad++;
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad != 0;
}

static void test_refusals(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, refusals_body, NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_exact), cmocka_unit_test(test_group_simulate),
      cmocka_unit_test(test_params),       cmocka_unit_test(test_reset_debug_init),
      cmocka_unit_test(test_refusals),     cmocka_unit_test(test_comm_state),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
