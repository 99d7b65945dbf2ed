/*
 * The deterministic mode end to end (docs/determinism.md): forked ranks run
 * the same calls under many environments - NCCL_ALGO forcing each
 * algorithm, small chunks, nodes faked by NCCL_HOSTID (TCP between them,
 * node-major and interleaved), shared memory off, the mode set by
 * braidCommSetDeterministic instead of BRAID_DETERMINISTIC, device buffers
 * on the simulated driver (Direct on one node, and Hier with its stage
 * between nodes on the device through the fake net plugin, each checked
 * to have run so where the layout lets it), shared-memory rings of one 4 KiB slot under the
 * smallest executor window (every message fills its ring, and Pairwise's
 * levels and slices in flight must still not wait on each other in a
 * circle) - and every result must be bitwise the same as
 * under the first environment. In each, a float sum is checked against a
 * serial reference of the canonical order, and a small call on a slice of
 * the same elements must match the big call's slice. With the mode off,
 * forcing Ring and Tree must give other bits (the comparison has teeth).
 * Rank counts 4 (a power of two: small all-reduces exchange whole buffers)
 * and 5 (positions without a rank).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "braid.h"
#include "common/order_inputs.h"
#include "devmem.h"
#include "launcher.h"

#define NCALLS 8
#define NVARIANTS 17
#define BIG 1000003
#define SLICE_FIRST 5000
#define SLICE_COUNT 1000

/* What the ranks of each environment left: digests of every call's output,
 * per rank, in memory shared with the test process. */
struct det_results {
  uint64_t digest[NVARIANTS][MP_MAX_RANKS][NCALLS];
};
static struct det_results* g_results;
static char g_binary_dir[4096]; /* the fake net plugins lie beside this binary, in fakenet/ */

struct det_variant {
  const char* name;
  int deterministic; /* 0: mode off; 1: BRAID_DETERMINISTIC; 2: braidCommSetDeterministic */
  const char* algo;  /* NCCL_ALGO, NULL: unset */
  const char* chunk; /* BRAID_CHUNK_SIZE, NULL: default */
  int nodes;         /* 0: one node; else ranks faked onto this many nodes */
  int interleaved;   /* node of rank r: r % nodes, else r / ceil(n / nodes) */
  int shm_off;
  int device;
  int tight;  /* one 4 KiB slot per shared-memory ring, a window of 4 steps */
  int bound;  /* rank r bound to allowed CPU popcount(r) mod their count */
  int plugin; /* between the nodes, the fake net plugin, taking device memory */
  /* a TUNING line every call shows (with `expect_ranks` ranks, or any where
   * 0; with others none: the layout refuses that path), NULL: none */
  const char* expect;
  int expect_ranks;
};

struct det_case {
  const struct det_variant* v;
  int index;
};

/* One call of the list: collective, type, op, count, where its elements
 * start in the notional buffer, in place or not. */
enum { DET_ALLREDUCE, DET_REDUCESCATTER, DET_REDUCE };
struct det_call {
  int coll;
  ncclDataType_t type;
  int op; /* ncclNumOps: PreMulSum by 0.75 */
  size_t count;
  size_t first;
  int inplace;
  int specials; /* zeros, infinities and NaNs among the inputs */
};
static const struct det_call kCalls[NCALLS] = {
    {DET_ALLREDUCE, ncclFloat32, ncclSum, BIG, 0, 0, 0},
    {DET_ALLREDUCE, ncclFloat32, ncclSum, SLICE_COUNT, SLICE_FIRST, 1, 0},
    {DET_ALLREDUCE, ncclBfloat16, ncclAvg, 4099, 7, 0, 1},
    {DET_REDUCESCATTER, ncclFloat64, ncclSum, 10007, 3, 0, 1},
    {DET_REDUCE, ncclFloat32, ncclMax, 777, 11, 1, 1},
    {DET_ALLREDUCE, ncclFloat16, ncclNumOps, 3001, 1, 0, 1},
    {DET_ALLREDUCE, ncclFloat8e4m3, ncclSum, 5000, 2, 1, 0},
    {DET_ALLREDUCE, ncclFloat32, ncclSum, 2, 9, 0, 1}, /* 8 bytes */
};

static uint64_t fnv(const void* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char*)p)[i]) * 1099511628211ull;
  return h;
}

/* ---- The serial reference of a float sum: the canonical tree ---- */

static float canon_sum(const float* x, int n, int base, int size) {
  if (size == 1) return x[base];
  int half = size / 2;
  float a = canon_sum(x, n, base, half);
  if (base + half >= n) return a;
  volatile float b = canon_sum(x, n, base + half, half); /* volatile: a + b, in that order */
  return a + b;
}

static int check_reference(const mp_env* env, const float* out, size_t count) {
  int p = 1;
  while (p < env->nranks) p *= 2;
  for (size_t i = 0; i < count; i++) {
    float x[MP_MAX_RANKS];
    for (int r = 0; r < env->nranks; r++) order_input(ncclFloat32, 0, r, i, &x[r]);
    float want = canon_sum(x, env->nranks, 0, p);
    if (memcmp(&want, &out[i], 4) != 0) {
      mp_fail(env, "element %zu: %a, the canonical order gives %a", i, (double)out[i],
              (double)want);
      return 1;
    }
  }
  return 0;
}

/* ---- Running the calls ---- */

struct det_bufs {
  void* send; /* host copies */
  void* recv;
  void* dsend; /* device copies (device variants) */
  void* drecv;
};

static size_t send_count(const mp_env* env, const struct det_call* c) {
  return c->coll == DET_REDUCESCATTER ? c->count * (size_t)env->nranks : c->count;
}

static ncclResult_t issue(const mp_env* env, ncclComm_t comm, const struct det_call* c,
                          ncclRedOp_t op, const void* send, void* recv, cudaStream_t s) {
  if (c->coll == DET_REDUCESCATTER) {
    if (c->inplace) recv = (char*)send + (size_t)env->rank * c->count * order_type_size(c->type);
    return ncclReduceScatter(send, recv, c->count, c->type, op, comm, s);
  }
  if (c->coll == DET_REDUCE) return ncclReduce(send, recv, c->count, c->type, op, 1, comm, s);
  return ncclAllReduce(send, recv, c->count, c->type, op, comm, s);
}

/* The call on host buffers, or on device copies of them (copied back). */
static int run_call(const mp_env* env, ncclComm_t comm, const struct det_call* c, int device,
                    cudaStream_t s, struct det_bufs* b) {
  size_t es = order_type_size(c->type), ns = send_count(env, c), bytes = ns * es;
  ncclRedOp_t op = c->op == ncclNumOps ? ncclSum : (ncclRedOp_t)c->op;
  int bad = 0;
  b->send = malloc(bytes + 1);
  b->recv = c->inplace ? b->send : calloc(1, bytes + 1);
  for (size_t i = 0; i < ns; i++)
    order_input(c->type, c->specials, env->rank, c->first + i, (char*)b->send + i * es);
  if (c->op == ncclNumOps) {
    uint16_t scalar = 0x3a00; /* 0.75 in half */
    if (ncclRedOpCreatePreMulSum(&op, &scalar, c->type, ncclScalarHostImmediate, comm)) return 1;
  }
  if (!device) {
    bad += mp_expect_rc(env, comm, issue(env, comm, c, op, b->send, b->recv, NULL), ncclSuccess,
                        "call");
  } else {
    if (ncclMemAlloc(&b->dsend, bytes) != ncclSuccess) return 1;
    b->drecv = b->dsend;
    if (!c->inplace && ncclMemAlloc(&b->drecv, bytes) != ncclSuccess) return 1;
    bad += dev_copy(env, b->dsend, b->send, bytes);
    bad += mp_expect_rc(env, comm, issue(env, comm, c, op, b->dsend, b->drecv, s), ncclSuccess,
                        "device call");
    bad += dev_sync(env, s);
    bad += dev_copy(env, b->recv, b->drecv, bytes);
    if (b->drecv != b->dsend) ncclMemFree(b->drecv);
    ncclMemFree(b->dsend);
  }
  if (c->op == ncclNumOps) ncclRedOpDestroy(op, comm);
  return bad;
}

/* The part of the output this rank holds. */
static uint64_t output_digest(const mp_env* env, const struct det_call* c, const void* recv) {
  size_t es = order_type_size(c->type);
  if (c->coll == DET_REDUCE && env->rank != 1) return 0;
  if (c->coll == DET_REDUCESCATTER) {
    const char* mine = c->inplace ? (const char*)recv + (size_t)env->rank * c->count * es : recv;
    return fnv(mine, c->count * es);
  }
  return fnv(recv, c->count * es);
}

static void set_env(const mp_env* env, const struct det_variant* v) {
  char host[32];
  unsetenv("NCCL_ALGO");
  if (v->algo) setenv("NCCL_ALGO", v->algo, 1);
  if (v->chunk) setenv("BRAID_CHUNK_SIZE", v->chunk, 1);
  setenv("BRAID_DETERMINISTIC", v->deterministic == 1 ? "1" : "0", 1);
  if (v->shm_off) setenv("NCCL_SHM_DISABLE", "1", 1);
  if (v->tight) {
    setenv("BRAID_SHM_NSLOTS", "1", 1);
    setenv("BRAID_SHM_SLOT_BYTES", "4096", 1);
    setenv("BRAID_NSTEPS", "4", 1);
  }
  if (v->nodes) {
    int per = (env->nranks + v->nodes - 1) / v->nodes;
    snprintf(host, sizeof(host), "detnode%d",
             v->interleaved ? env->rank % v->nodes : env->rank / per);
    setenv("NCCL_HOSTID", host, 1);
  }
  if (v->plugin) {
    char path[4200];
    snprintf(path, sizeof(path), "%s/fakenet/libnccl-net-fake12.so", g_binary_dir);
    setenv("NCCL_NET_PLUGIN", path, 1);
    setenv("NCCL_NET", "fake", 1);
    setenv("FAKENET_CUDA", "1", 1);
    setenv("CUDASIM_ONE_QUEUE", "1", 1); /* GPU work from the proxy would hang there */
  }
}

/* Every call of variant v showed its TUNING line where it should, and
 * none where the layout refuses it: 0, or 1 after saying so. */
static int tuning_check(const mp_env* env, const struct det_variant* v, mp_capture* cap) {
  int seen = mp_capture_count(cap, v->expect);
  int want = v->expect_ranks == 0 || v->expect_ranks == env->nranks ? NCALLS : 0;
  mp_capture_end_quiet(cap);
  if (seen == want) return 0;
  mp_fail(env, "%s: %d calls say \"%s\", not %d", v->name, seen, v->expect, want);
  return 1;
}

/* Rank r on the allowed CPU popcount(r) mod their count: where two CPUs
 * have caches of their own, 2^l apart no ranks share one, and the layout
 * re-pairs Pairwise's partners (algorithms/layout.c) on 4 ranks. */
static int bind_rank(const mp_env* env) {
  return mp_bind_rank(env, __builtin_popcount((unsigned)env->rank));
}

static int det_body(const mp_env* env) {
  const struct det_case* dc = env->arg;
  const struct det_variant* v = dc->v;
  ncclComm_t comm;
  cudaStream_t s = NULL;
  void* big = NULL;
  int bad = 0;
  mp_capture cap;
  set_env(env, v);
  if (v->expect && mp_capture_debug(&cap, "TUNING") != 0) return 1;
  if (v->bound && bind_rank(env)) return 1;
  if (v->device && (dev_open(env, 0) || (s = dev_stream(env)) == NULL)) return 1;
  if (mp_comm_init(env, &comm)) return 1;
  if (v->deterministic == 2)
    bad += mp_expect_rc(env, comm, braidCommSetDeterministic(comm, 1), ncclSuccess, "set mode");
  for (int i = 0; i < NCALLS && !bad; i++) {
    const struct det_call* c = &kCalls[i];
    struct det_bufs b = {0};
    bad += run_call(env, comm, c, v->device, s, &b);
    g_results->digest[dc->index][env->rank][i] = output_digest(env, c, b.recv);
    if (i == 0 && v->deterministic) bad += check_reference(env, b.recv, c->count);
    if (i == 1 && v->deterministic && memcmp(b.recv, (float*)big + SLICE_FIRST, c->count * 4)) {
      mp_fail(env, "a call on elements %d.. gives other bits than the big call's", SLICE_FIRST);
      bad++;
    }
    if (i == 0) big = b.recv, b.recv = b.send; /* kept for call 1 */
    if (b.recv != b.send) free(b.recv);
    free(b.send);
  }
  free(big);
  if (v->expect) bad += tuning_check(env, v, &cap);
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

/* ---- The environments ---- */

static const struct det_variant kVariants[NVARIANTS] = {
    {"env, auto", 1, NULL, NULL, 0, 0, 0, 0, 0, 0, 0, NULL, 0},
    {"full rings: one 4 KiB slot, 4 steps", 1, NULL, NULL, 0, 0, 0, 0, 1, 0, 0, NULL, 0},
    {"full rings, 2 nodes (the pipelined halving)", 1, NULL, NULL, 2, 0, 0, 0, 1, 0, 0, NULL, 0},
    {"full rings, ranks bound (Pairwise re-paired)", 1, NULL, NULL, 0, 0, 0, 0, 1, 1, 0, NULL, 0},
    {"braidCommSetDeterministic, Ring", 2, "Ring", NULL, 0, 0, 0, 0, 0, 0, 0, NULL, 0},
    {"Tree, 16 KiB chunks", 1, "Tree", "16384", 0, 0, 0, 0, 0, 0, 0, NULL, 0},
    {"RecDoubling over TCP", 1, "RecDoubling", NULL, 0, 0, 1, 0, 0, 0, 0, NULL, 0},
    {"Hier, 2 nodes", 1, "Hier", NULL, 2, 0, 0, 0, 0, 0, 0, NULL, 0},
    {"2 nodes interleaved", 1, NULL, NULL, 2, 1, 0, 0, 0, 0, 0, NULL, 0},
    {"one rank per node", 1, "^Pairwise", NULL, 8, 0, 0, 0, 0, 0, 0, NULL, 0},
    {"device buffers", 1, NULL, NULL, 0, 0, 0, 1, 0, 0, 0, NULL, 0},
    {"device buffers, Direct named", 1, "Direct,Ring", "32768", 0, 0, 0, 1, 0, 0, 0,
     "Direct instead", 0},
    {"device buffers, 2 nodes over a plugin", 1, NULL, NULL, 2, 0, 0, 1, 0, 0, 1,
     "node stages, on the device", 4},
    {"device buffers, one rank per node over a plugin", 1, NULL, NULL, 8, 0, 0, 1, 0, 0, 1,
     "node stages, on the device", 4},
    {"off, Ring", 0, "Ring", NULL, 0, 0, 0, 0, 0, 0, 0, NULL, 0},
    {"off, Tree", 0, "Tree", NULL, 0, 0, 0, 0, 0, 0, 0, NULL, 0},
    {"off, Hier, 2 nodes", 0, "Hier", NULL, 2, 0, 0, 0, 0, 0, 0, NULL, 0},
};
#define FIRST_OFF 14

/* Calls whose digests differ between variant v and variant 0, on any rank. */
static int calls_differing(int n, int v, int* which) {
  int differ = 0;
  for (int i = 0; i < NCALLS; i++) {
    int d = 0;
    for (int r = 0; r < n; r++) d |= g_results->digest[v][r][i] != g_results->digest[0][r][i];
    if (d) which[differ++] = i;
  }
  return differ;
}

static void run_variants(int n) {
  const char* lib = getenv("BRAID_CUDA_LIB"); /* built only where CUDA is */
  int has_device = lib && strstr(lib, "cudasim") && access(lib, R_OK) == 0;
  memset(g_results, 0, sizeof(*g_results));
  for (int v = 0; v < NVARIANTS; v++) {
    struct det_case dc = {&kVariants[v], v};
    if (kVariants[v].device && !has_device) continue;
    assert_int_equal(mp_launch(n, det_body, &dc, NULL), 0);
    int which[NCALLS], d = calls_differing(n, v, which);
    if (v < FIRST_OFF && d) {
      fprintf(stderr, "%d ranks, %s: call %d (and %d more) differs from %s\n", n, kVariants[v].name,
              which[0], d - 1, kVariants[0].name);
      fail();
    }
  }
  /* Teeth: without the mode, some algorithm gives the big float sum other bits. */
  int teeth = 0;
  for (int v = FIRST_OFF; v < NVARIANTS; v++) {
    int which[NCALLS], d = calls_differing(n, v, which);
    teeth += d > 0 && which[0] == 0;
  }
  assert_true(teeth > 0);
}

static void test_four_ranks(void** state) {
  (void)state;
  run_variants(4);
}

static void test_five_ranks(void** state) {
  (void)state;
  run_variants(5);
}

/* The call's arguments are checked; the mode reads back. */
static int api_body(const mp_env* env) {
  ncclComm_t comm;
  int on = -1, bad = 0;
  unsetenv("BRAID_DETERMINISTIC");
  if (mp_comm_init(env, &comm)) return 1;
  bad += mp_expect_rc(env, comm, braidCommGetDeterministic(comm, &on), ncclSuccess, "get");
  bad += on != 0;
  bad += mp_expect_rc(env, comm, braidCommSetDeterministic(comm, 2), ncclInvalidArgument, "2");
  bad +=
      mp_expect_rc(env, comm, braidCommGetDeterministic(comm, NULL), ncclInvalidArgument, "NULL");
  bad += mp_expect_rc(env, comm, braidCommSetDeterministic(comm, 1), ncclSuccess, "set");
  bad += mp_expect_rc(env, comm, braidCommGetDeterministic(comm, &on), ncclSuccess, "get");
  bad += on != 1;
  bad += mp_expect_rc(env, NULL, braidCommSetDeterministic(NULL, 1), ncclInvalidArgument, "NULL");
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  return bad;
}

static void test_api(void** state) {
  (void)state;
  assert_int_equal(mp_launch(2, api_body, NULL, NULL), 0);
}

int main(void) {
  ssize_t len = readlink("/proc/self/exe", g_binary_dir, sizeof(g_binary_dir) - 1);
  char* slash;
  g_binary_dir[len > 0 ? len : 0] = '\0';
  if ((slash = strrchr(g_binary_dir, '/')) != NULL) *slash = '\0';
  mp_default_env("BRAID_CUDA_LIB", "build/tests/libcudasim.so");
  mp_default_env("BRAID_TIMEOUT_MS", "30000");
  g_results =
      mmap(NULL, sizeof(*g_results), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_results == MAP_FAILED) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_api),
      cmocka_unit_test(test_four_ranks),
      cmocka_unit_test(test_five_ranks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
