/* The net plugin transport (transports/net) over the fake plugin
 * (tests/common/fakenet), every interface version from 8 to 12: every
 * collective and send/recv exact between emulated hosts (NCCL_HOSTID per
 * rank), alone and beside shared memory; and every failure a plugin shows
 * (a call's error, a test that never completes, a connection that dies, a
 * registration refused, a size or device that lies) gives each rank an
 * error within the timeout, never a hang or a write outside the buffers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <dlfcn.h>

#include "braid.h"
#include "collcheck.h"
#include "devmem.h"
#include "launcher.h"

static const size_t kCounts[] = {0, 1, 1023, 150001}; /* the last is cut by the fake's 100000 */
static const ncclDataType_t kTypes[] = {ncclFloat32, ncclInt32, ncclBfloat16, ncclFloat64};
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

typedef struct net_case {
  int version; /* the fake plugin's interface */
  int nranks;
  int per_host;      /* ranks per emulated host */
  const char* fault; /* FAKENET_FAULT; NULL: none */
  const char* after; /* FAKENET_FAULT_AFTER */
  int init_fails;    /* the fault stops ncclCommInitRank itself */
  int sync;          /* device calls run synchronously (BRAID_STREAM_MEMOPS=0) */
  int hier;          /* device calls run as Hier with direct node stages */
  int no_cuda;       /* the fake does not take device memory (FAKENET_CUDA=0) */
  int unforced;      /* NCCL_ALGO unset, the host tuned to the ring: Hier as the policy picks it */
  int no_hier;       /* NCCL_ALGO=^Hier: no call runs Hier, not even one rank a host's */
  int mixed_cuda;    /* the fake takes device memory on each host's first rank only */
} net_case;

static char g_plugin_dir[4096];

/* The fake plugins lie beside this binary, in fakenet/. */
static void find_plugins(void) {
  ssize_t n = readlink("/proc/self/exe", g_plugin_dir, sizeof(g_plugin_dir) - 1);
  g_plugin_dir[n > 0 ? n : 0] = '\0';
  char* slash = strrchr(g_plugin_dir, '/');
  if (slash) *slash = '\0';
}

static void rank_env(const mp_env* env, const net_case* c) {
  char path[4200], host[32];
  snprintf(path, sizeof(path), "%s/fakenet/libnccl-net-fake%d.so", g_plugin_dir, c->version);
  snprintf(host, sizeof(host), "fakenet-host-%d", env->rank / c->per_host);
  setenv("NCCL_NET_PLUGIN", path, 1);
  setenv("NCCL_NET", "fake", 1); /* compared without case, as NCCL does */
  setenv("NCCL_HOSTID", host, 1);
  if (c->fault) setenv("FAKENET_FAULT", c->fault, 1);
  if (c->after) setenv("FAKENET_FAULT_AFTER", c->after, 1);
  setenv("BRAID_TIMEOUT_MS", "4000", 1);
}

/* Every collective at every count, the rest rotating: the number wrong,
 * -1 at the first call that fails. */
static int collectives(const mp_env* env, ncclComm_t comm) {
  int wrong = 0, i = 0;
  for (int coll = 0; coll < CC_NCOLLS; coll++)
    for (size_t ci = 0; ci < COUNT_OF(kCounts); ci++, i++) {
      cc_call c = {.coll = coll, .count = kCounts[ci], .salt = (uint64_t)i, .inplace = i & 1};
      c.type = kTypes[(size_t)i % COUNT_OF(kTypes)];
      c.kind = cc_is_reduction(coll) ? i % AR_NKINDS : AR_SUM;
      c.root = i % env->nranks;
      if (cc_is_reduction(coll) && ar_op_create(env, comm, c.type, c.kind, &c.op) != 0) return -1;
      int r = cc_run(&c, env, comm);
      if (cc_is_reduction(coll)) ar_op_destroy(env, comm, c.kind, c.op);
      if (r < 0) return -1;
      wrong += r;
    }
  return wrong;
}

static int ring_sendrecv(const mp_env* env, ncclComm_t comm) {
  size_t bytes = 300000; /* three of the fake's messages */
  int n = env->nranks, to = (env->rank + 1) % n, from = (env->rank + n - 1) % n, bad = 0;
  unsigned char* out = malloc(bytes);
  unsigned char* in = malloc(bytes);
  if (out == NULL || in == NULL) bad = -1;
  for (size_t b = 0; bad == 0 && b < bytes; b++)
    out[b] = (unsigned char)(b * 7 + (size_t)env->rank);
  if (bad == 0 && mp_sendrecv(env, comm, out, in, bytes, to, from) != 0) bad = -1;
  for (size_t b = 0; bad == 0 && b < bytes; b++)
    if (in[b] != (unsigned char)(b * 7 + (size_t)from)) bad = 1;
  free(out);
  free(in);
  return bad;
}

static int recorder_says(ncclComm_t comm, const char* what) {
  char* text = NULL;
  if (braidCommRecorder(comm, &text) != ncclSuccess || text == NULL) return 0;
  int found = strstr(text, what) != NULL;
  free(text);
  return found;
}

/* Every collective and a ring of send/recv, exact, a link of each rank
 * over the plugin. */
static int good_body(const mp_env* env) {
  const net_case* c = env->arg;
  ncclComm_t comm;
  rank_env(env, c);
  if (mp_comm_init(env, &comm) != 0) return 1;
  int bad = collectives(env, comm);
  if (bad == 0) bad = ring_sendrecv(env, comm);
  if (bad < 0) {
    ncclCommAbort(comm);
    return 1;
  }
  if (!recorder_says(comm, "\"transport\":\"net\"")) {
    mp_fail(env, "no link of this rank went over the net plugin");
    bad++;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

/* A plugin failure: init refuses the network, or the first call that
 * crosses it fails, on every rank, in time; the comm still aborts. */
static int fault_body(const mp_env* env) {
  const net_case* c = env->arg;
  ncclComm_t comm;
  rank_env(env, c);
  ncclResult_t rc = ncclCommInitRank(&comm, env->nranks, env->id, env->rank);
  if (c->init_fails) {
    if (rc == ncclSuccess) {
      mp_fail(env, "init succeeded with FAKENET_FAULT=%s", c->fault);
      ncclCommDestroy(comm);
      return 1;
    }
    return mp_expect_last_error(env, NULL, "a failed init");
  }
  if (rc != ncclSuccess) {
    mp_fail(env, "init failed (%s) with FAKENET_FAULT=%s", ncclGetErrorString(rc), c->fault);
    return 1;
  }
  cc_call call = {.coll = CC_ALLREDUCE, .type = ncclFloat32, .count = 150001, .op = ncclSum};
  int r = cc_run(&call, env, comm);
  int bad = r != -1;
  if (bad) mp_fail(env, "an all-reduce across the failing plugin gave %d, not an error", r);
  ncclCommAbort(comm);
  return bad;
}

/* Device buffers (the simulated driver): staged through pinned host
 * memory, as over sockets, and carried by the plugin. */
static int device_body(const mp_env* env) {
  const net_case* c = env->arg;
  static const size_t counts[] = {1, 150001};
  ncclComm_t comm;
  cudaStream_t s;
  int bad = 0, i = 0;
  rank_env(env, c);
  if (dev_open(env, 0) != 0 || (s = dev_stream(env)) == NULL) return 1;
  if (mp_comm_init(env, &comm) != 0) return 1;
  for (int coll = 0; coll < CC_NCOLLS; coll++)
    for (size_t ci = 0; ci < COUNT_OF(counts); ci++, i++) {
      dev_call d = {.host = {.coll = coll, .count = counts[ci], .salt = (uint64_t)i}};
      d.host.type = kTypes[(size_t)i % COUNT_OF(kTypes)];
      d.host.op = ncclSum;
      d.host.root = i % env->nranks;
      int wrong = dev_call_prepare(&d, env);
      if (!wrong) {
        ncclResult_t rc = cc_issue(&d.dev, comm, s);
        wrong = rc != ncclSuccess || dev_sync(env, s) || dev_call_fetch(&d, env) ||
                cc_verify(&d.host, env);
      }
      if (wrong) mp_fail(env, "device buffers: %s of %zu wrong", cc_coll_name(coll), counts[ci]);
      bad += wrong;
      dev_call_release(&d);
    }
  if (!recorder_says(comm, "\"transport\":\"net\"")) {
    mp_fail(env, "no link of this rank went over the net plugin");
    bad++;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

/* Two counts the fake plugin of this case keeps, by the name of the
 * function that gives them (the library loaded it; dlopen finds that
 * copy): fakenet_stats, registrations of device memory and flushes;
 * fakenet_traffic, the bytes its requests posted on device memory and on
 * host memory (payloads only). */
static int plugin_counts(const net_case* c, const char* fn, long* a, long* b) {
  char path[4200];
  snprintf(path, sizeof(path), "%s/fakenet/libnccl-net-fake%d.so", g_plugin_dir, c->version);
  void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  void (*counts)(long*, long*) = h ? (void (*)(long*, long*))dlsym(h, fn) : NULL;
  if (counts == NULL) return 1;
  counts(a, b);
  dlclose(h);
  return 0;
}

/* Where both ends' devices take CUDA memory (FAKENET_CUDA=1), device
 * send/recv goes straight to the plugin, registered as device memory and
 * flushed after each receive; exact. */
static int device_p2p_body(const mp_env* env) {
  const net_case* c = env->arg;
  size_t bytes = 300001; /* three of the fake's messages and a byte */
  int n = env->nranks, to = (env->rank + 1) % n, from = (env->rank + n - 1) % n, bad = 0;
  ncclComm_t comm;
  cudaStream_t s;
  void *dout = NULL, *din = NULL;
  long regs = 0, flushes = 0;
  setenv("FAKENET_CUDA", "1", 1);
  rank_env(env, c);
  unsigned char* out = malloc(bytes);
  unsigned char* in = malloc(bytes);
  if (out == NULL || in == NULL || dev_open(env, 0) != 0 || (s = dev_stream(env)) == NULL ||
      mp_comm_init(env, &comm) != 0)
    return 1;
  for (size_t b = 0; b < bytes; b++) out[b] = (unsigned char)(b * 13 + (size_t)env->rank);
  bad += mp_expect_rc(env, comm, ncclMemAlloc(&dout, bytes), ncclSuccess, "ncclMemAlloc") +
         mp_expect_rc(env, comm, ncclMemAlloc(&din, bytes), ncclSuccess, "ncclMemAlloc");
  if (!bad) bad = dev_copy(env, dout, out, bytes);
  if (!bad) {
    bad += mp_expect_rc(env, comm, ncclGroupStart(), ncclSuccess, "ncclGroupStart");
    bad += mp_expect_rc(env, comm, ncclSend(dout, bytes, ncclUint8, to, comm, s), ncclSuccess,
                        "ncclSend");
    bad += mp_expect_rc(env, comm, ncclRecv(din, bytes, ncclUint8, from, comm, s), ncclSuccess,
                        "ncclRecv");
    bad += mp_expect_rc(env, comm, ncclGroupEnd(), ncclSuccess, "ncclGroupEnd");
    bad += dev_sync(env, s) || dev_copy(env, in, din, bytes);
  }
  for (size_t b = 0; !bad && b < bytes; b++)
    if (in[b] != (unsigned char)(b * 13 + (size_t)from)) {
      mp_fail(env, "device send/recv from %d: byte %zu wrong (%d, not %d)", from, b, in[b],
              (unsigned char)(b * 13 + (size_t)from));
      bad = 1;
    }
  if (!bad &&
      (plugin_counts(c, "fakenet_stats", &regs, &flushes) != 0 || regs == 0 || flushes == 0)) {
    mp_fail(env,
            "device buffers did not go to the plugin (%ld device registrations, %ld "
            "flushes)",
            regs, flushes);
    bad = 1;
  }
  ncclMemFree(dout);
  ncclMemFree(din);
  free(out);
  free(in);
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

/* The collectives an executor runs (the others are send/recv groups). */
static int coll_scheduled(int coll) {
  return coll != CC_ALLTOALL && coll != CC_GATHER && coll != CC_SCATTER;
}

/* Whether one call's traffic is what its path gives: every rank of an
 * all-gather or a broadcast moves only device memory, synchronous or
 * ordered on its stream; synchronous calls (`direct`) post the user's
 * device buffers to the plugin, every rank of an all-reduce some; a
 * reduction ordered on its stream is staged through pinned host memory. */
static int traffic_wrong(const mp_env* env, int coll, int direct, long cuda, long host) {
  int moves_only_final = coll == CC_ALLGATHER || coll == CC_BROADCAST || coll == CC_BCAST;
  const char* why = NULL;
  if ((moves_only_final || (direct && coll == CC_ALLREDUCE)) && cuda == 0)
    why = "no device memory went to the plugin";
  else if (moves_only_final && host != 0)
    why = "host memory went to the plugin";
  else if (!direct && !moves_only_final && coll_scheduled(coll) && cuda != 0)
    why = "device memory went to the plugin";
  if (why) mp_fail(env, "%s: %s (%ld device, %ld host bytes)", cc_coll_name(coll), why, cuda, host);
  return why != NULL;
}

/* Where both ends' devices take CUDA memory (FAKENET_CUDA=1), every
 * collective on device buffers is exact, each call's buffers going to
 * the plugin as they are when it runs synchronously (the case's `sync`);
 * ordered on its stream, an all-gather's and a broadcast's too, a
 * reduction's staged. In place and out of place, by turns. With ranks
 * sharing a host (shared memory between them) each rank goes direct only
 * where every link its schedule uses takes device memory: exact either
 * way, the traffic not checked. */
static int device_direct_body(const mp_env* env) {
  const net_case* c = env->arg;
  int direct = c->sync, bad = 0;
  ncclComm_t comm;
  cudaStream_t s;
  setenv("FAKENET_CUDA", "1", 1);
  setenv("BRAID_STREAM_MEMOPS", direct ? "0" : "1", 1);
  /* one rank a host: a reduction would take Hier, its stage between hosts
   * in device scratch (test_hier_device), not the executor */
  setenv("NCCL_ALGO", "^Direct", 1);
  rank_env(env, c);
  if (dev_open(env, 0) != 0 || (s = dev_stream(env)) == NULL) return 1;
  if (mp_comm_init(env, &comm) != 0) return 1;
  for (int i = 0; i < 2 * CC_NCOLLS; i++) {
    int coll = i % CC_NCOLLS;
    dev_call d = {
        .host = {.coll = coll, .count = 150001, .salt = (uint64_t)i, .inplace = i >= CC_NCOLLS}};
    d.host.type = kTypes[(size_t)i % COUNT_OF(kTypes)];
    d.host.op = ncclSum;
    d.host.root = coll % env->nranks;
    long cuda0 = 0, host0 = 0, cuda1 = 0, host1 = 0;
    int wrong = dev_call_prepare(&d, env) || plugin_counts(c, "fakenet_traffic", &cuda0, &host0);
    if (!wrong) {
      ncclResult_t rc = cc_issue(&d.dev, comm, s);
      wrong = rc != ncclSuccess || dev_sync(env, s) || dev_call_fetch(&d, env) ||
              cc_verify(&d.host, env);
      if (wrong)
        mp_fail(env, "device buffers: %s%s wrong", cc_coll_name(coll),
                d.host.inplace ? " in place" : "");
    }
    if (!wrong && c->per_host == 1)
      wrong = plugin_counts(c, "fakenet_traffic", &cuda1, &host1) ||
              traffic_wrong(env, coll, direct, cuda1 - cuda0, host1 - host0);
    bad += wrong;
    dev_call_release(&d);
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

/* Hier with direct node stages over a plugin, two or four hosts of two
 * ranks (NCCL_ALGO naming Direct) or of one (alone): where the fake takes
 * device memory, the stage between the
 * hosts of an all-reduce, a reduce-scatter, an all-gather, a reduce and a
 * broadcast runs in
 * device scratch, so that only device memory goes to the plugin, ordered
 * on the stream with one hardware queue for every stream
 * (CUDASIM_ONE_QUEUE=1: a kernel the proxy launched while the stream
 * waits would never run); where it does not, the stage runs in pinned host
 * memory and only host memory goes to it (no_cuda). On 4 hosts the stage
 * halves (direct_step), gated or synchronous; on 3 or 5 it folds first
 * (a reduce-scatter's rows in pairs). A reduce and a broadcast go that way
 * only where the stage is on the device (staged otherwise). On hosts of
 * unequal sizes every collective does too, the ranks past the smallest
 * host's count passing nothing through the plugin. Every type,
 * sum, avg, max and premulsum, in place and out of place: exact either way, and the
 * TUNING log says which stage ran. A PreMulSum (each rank's input
 * multiplied on the device first) goes the same way. */
static const int kHierColls[] = {CC_ALLREDUCE, CC_REDUCESCATTER, CC_ALLGATHER, CC_REDUCE,
                                 CC_BROADCAST};
#define HIER_NCOLLS ((int)COUNT_OF(kHierColls))
#define HIER_CALLS (6 * HIER_NCOLLS)
static const int kHierKinds[] = {AR_SUM, AR_AVG, AR_MAX, AR_PREMUL};
static const ncclRedOp_t kHierOps[] = {ncclSum, ncclAvg, ncclMax, ncclSum /* made per call */};

/* Whether the last host holds fewer ranks than the others (nranks not a
 * multiple of per_host): the columns are then the smallest host's
 * indexes (algorithms/direct.h; a reduce-scatter's and all-gather's with
 * two rows a host, one junk on the small host). */
static int hosts_uneven(const net_case* c) {
  return c->nranks % c->per_host != 0;
}

/* Whether `rank` holds an index past the columns: no stage between
 * hosts, so nothing of its own through the plugin. */
static int past_columns(const net_case* c, int rank) {
  return hosts_uneven(c) && rank % c->per_host >= c->nranks % c->per_host;
}

/* Whether a call's stage between hosts runs in device scratch: where
 * the fake takes device memory (algorithms/direct.h: every reduction on 2
 * to 16384 nodes). */
static int hier_stage_on_device(const net_case* c) {
  return !c->no_cuda && !c->mixed_cuda; /* mixed: one column's pairs would, the other's not */
}

/* Whether call `coll` runs as Hier at all: not one rank a host's
 * all-gather (in place, op_net_direct), nor a reduce that only the
 * device's stage between nodes takes, nor one rank a host's call whose
 * stage cannot run on the device (staged whole, its traffic the
 * executor's). */
static int hier_runs(const net_case* c, int coll) {
  int dev = hier_stage_on_device(c), alone = c->per_host == 1;
  if (c->no_hier) return 0;
  int moves = coll == CC_ALLGATHER || coll == CC_BROADCAST; /* data only */
  int rooted = coll == CC_REDUCE || coll == CC_BROADCAST;
  return !(alone && moves) && !(!dev && rooted) && !(alone && !dev);
}

/* Whether one Hier call's traffic through the plugin is its stage's: none
 * from a rank past the columns; else device memory only (or, pinned,
 * host memory only; a reduce's rank may pass nothing between hosts). */
static int hier_traffic_wrong(const mp_env* env, const net_case* c, int coll, long cuda,
                              long host) {
  if (past_columns(c, env->rank)) return cuda != 0 || host != 0;
  if (hier_stage_on_device(c)) return cuda == 0 || host != 0;
  return cuda != 0 || (host == 0 && coll != CC_REDUCE);
}

static int hier_call_wrong(const mp_env* env, const net_case* c, ncclComm_t comm, cudaStream_t s,
                           int i) {
  int coll = kHierColls[i % HIER_NCOLLS];
  dev_call d = {.host = {.coll = coll,
                         .count = 150001,
                         .salt = (uint64_t)i,
                         .inplace = (i / HIER_NCOLLS) % 2,
                         .root = i % env->nranks}};
  long cuda0 = 0, host0 = 0, cuda1 = 0, host1 = 0;
  char what[128];
  size_t k = (size_t)(i / 2) % COUNT_OF(kHierOps);
  d.host.type = kTypes[(size_t)(i / 3) % COUNT_OF(kTypes)];
  if (kHierKinds[k] == AR_AVG && d.host.type == ncclInt32) k = 0; /* an integer's avg truncates */
  d.host.kind = kHierKinds[k];
  d.host.op = kHierOps[k];
  if (d.host.kind == AR_PREMUL && ar_op_create(env, comm, d.host.type, AR_PREMUL, &d.host.op))
    return 1;
  int wrong = dev_call_prepare(&d, env) || plugin_counts(c, "fakenet_traffic", &cuda0, &host0);
  cc_describe(&d.host, what, sizeof(what));
  if (!wrong) {
    ncclResult_t rc = cc_issue(&d.dev, comm, s);
    wrong = rc != ncclSuccess || dev_sync(env, s) || dev_call_fetch(&d, env) ||
            cc_verify(&d.host, env) || plugin_counts(c, "fakenet_traffic", &cuda1, &host1);
    if (wrong) mp_fail(env, "Hier on devices: %s wrong", what);
  }
  if (!wrong && hier_runs(c, coll) &&
      hier_traffic_wrong(env, c, coll, cuda1 - cuda0, host1 - host0)) {
    mp_fail(env, "Hier on devices: %s moved %ld device, %ld host bytes through the plugin", what,
            cuda1 - cuda0, host1 - host0);
    wrong = 1;
  }
  dev_call_release(&d);
  return wrong + ar_op_destroy(env, comm, d.host.kind, d.host.op);
}

/* A tuner file (BRAID_TUNE_FILE) that gives the host's reductions and
 * all-gathers to the ring, written for this rank: 0, or -1 after saying
 * why. */
static int tune_to_ring(const mp_env* env, char* path, size_t len) {
  static const char kRing[] =
      "force AllReduce 0 1G Ring\nforce ReduceScatter 0 1G Ring\nforce AllGather 0 1G Ring\n";
  snprintf(path, len, "/tmp/braid-test-net-tune-XXXXXX");
  int fd = mkstemp(path);
  if (fd < 0 || write(fd, kRing, sizeof(kRing) - 1) != (ssize_t)(sizeof(kRing) - 1)) {
    mp_fail(env, "cannot write a tuner file at %s", path);
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  setenv("BRAID_TUNE_FILE", path, 1);
  return 0;
}

static int hier_device_body(const mp_env* env) {
  const net_case* c = env->arg;
  int on_device = !c->no_cuda, bad = 0, calls = 0, dev_calls = 0;
  char tune[64] = "";
  const char* stage = ": Hier with direct node stages";
  ncclComm_t comm;
  cudaStream_t s;
  mp_capture cap;
  int cuda_here = on_device && !(c->mixed_cuda && env->rank % c->per_host != 0);
  setenv("FAKENET_CUDA", cuda_here ? "1" : "0", 1);
  setenv("CUDASIM_ONE_QUEUE", "1", 1);
  setenv("BRAID_STREAM_MEMOPS", c->sync ? "0" : "1", 1);
  if (c->per_host > 1 && !c->unforced)
    setenv("NCCL_ALGO", "Direct,Ring", 1); /* one rank a host takes Hier unasked */
  if (c->no_hier) setenv("NCCL_ALGO", "^Hier", 1);
  if (c->unforced && tune_to_ring(env, tune, sizeof(tune)) != 0) return 1;
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "TUNING", 1);
  rank_env(env, c);
  int capturing = mp_capture_begin(&cap) == 0;
  if (!capturing || dev_open(env, 0) != 0 || (s = dev_stream(env)) == NULL ||
      mp_comm_init(env, &comm) != 0) {
    if (capturing) mp_capture_end_quiet(&cap);
    if (tune[0]) unlink(tune);
    return 1;
  }
  for (int i = 0; i < HIER_CALLS; i++) {
    int coll = kHierColls[i % HIER_NCOLLS], dev = hier_stage_on_device(c);
    int hier = hier_runs(c, coll);
    bad += hier_call_wrong(env, c, comm, s, i);
    calls += hier;
    dev_calls += hier && dev;
  }
  bad += mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy");
  if (tune[0]) unlink(tune);
  int ran = mp_capture_count(&cap, stage), on_dev = mp_capture_count(&cap, "on the device");
  mp_capture_end_quiet(&cap);
  if (ran < calls || on_dev != (on_device ? dev_calls : 0) || (c->no_hier && ran != 0)) {
    mp_fail(env, "%d of %d calls ran as \"%s\" (%d on the device, not %d)", ran, calls, stage + 2,
            on_dev, dev_calls);
    bad++;
  }
  return bad;
}

/* A ring reduce on host buffers over the plugin, two hosts of two ranks,
 * to the roots whose successor is on the other host (1 and 3): the
 * successor lists the root as a peer, but the root never sends to it, so
 * nothing but the connect phase moves the root's connection there on.
 * Every rank then stays away from the library past the timeout, so that
 * no later call moves it on either (the successor timed out accepting
 * it). Then an all-reduce on the same links. */
static int reduce_roots_body(const mp_env* env) {
  const net_case* c = env->arg;
  ncclComm_t comm;
  int bad = 0;
  rank_env(env, c);
  setenv("NCCL_ALGO", "Ring", 1);
  setenv("BRAID_TIMEOUT_MS", "700", 1);
  if (mp_comm_init(env, &comm) != 0) return 1;
  for (int root = 1; root <= env->nranks + 1 && bad == 0; root += 2) {
    cc_call call = {.coll = root < env->nranks ? CC_REDUCE : CC_ALLREDUCE,
                    .type = ncclFloat32,
                    .kind = AR_SUM,
                    .op = ncclSum,
                    .count = 150001,
                    .root = root % env->nranks,
                    .salt = (uint64_t)root};
    bad += cc_run(&call, env, comm) != 0;
    usleep(900 * 1000);
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

/* A rank whose device calls run synchronously over a fake that takes
 * device memory: its device buffers go to the plugin as they are. */
static int direct_rank_open(const mp_env* env, const net_case* c, ncclComm_t* comm,
                            cudaStream_t* s) {
  setenv("FAKENET_CUDA", "1", 1);
  setenv("BRAID_STREAM_MEMOPS", c->sync ? "0" : "1", 1);
  /* ranks a host apart would run Hier (cuda_direct_kind), not the executor */
  if (!c->hier) setenv("NCCL_ALGO", "^Direct", 1);
  setenv("CUDASIM_ONE_QUEUE", "1", 1);
  rank_env(env, c);
  if (dev_open(env, 0) != 0 || (*s = dev_stream(env)) == NULL) return 1;
  return mp_comm_init(env, comm);
}

/* Cut by the fake's 100000-byte messages, out of place (it can run again). */
static const cc_call kDirectCall = {
    .coll = CC_ALLREDUCE, .type = ncclFloat32, .count = 150001, .op = ncclSum};

/* One all-reduce of d (prepared out of place, so that it can run again),
 * exact; the fake's device registrations after it in *regs. */
static int regs_after_call(const mp_env* env, const net_case* c, ncclComm_t comm, cudaStream_t s,
                           dev_call* d, long* regs) {
  long flushes = 0;
  ncclResult_t rc = cc_issue(&d->dev, comm, s);
  if (rc != ncclSuccess || dev_sync(env, s) || dev_call_fetch(d, env) || cc_verify(&d->host, env)) {
    mp_fail(env, "a device all-reduce sent as is: wrong or failed (%s)", ncclGetErrorString(rc));
    return 1;
  }
  return plugin_counts(c, "fakenet_stats", regs, &flushes);
}

/* Device buffers that go to the plugin as they are keep their
 * registration (the whole allocation, per connection): the same call again
 * registers nothing new; buffers freed and allocated again (likely at the
 * same addresses) are registered again, never reached through the old
 * registration (the fake checks each request's allocation against its
 * registration's, as a NIC's pinned pages would differ). */
static int device_regs_body(const mp_env* env) {
  const net_case* c = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  long regs[4] = {0};
  if (direct_rank_open(env, c, &comm, &s) != 0) return 1;
  dev_call d = {.host = kDirectCall};
  int bad = dev_call_prepare(&d, env);
  for (int k = 0; k < 3 && !bad; k++) bad = regs_after_call(env, c, comm, s, &d, &regs[k]);
  void* old = d.drecv;
  dev_call_release(&d);
  if (!bad) bad = dev_call_prepare(&d, env) || regs_after_call(env, c, comm, s, &d, &regs[3]);
  if (!bad && (regs[0] == 0 || regs[2] != regs[1] || regs[3] <= regs[2])) {
    mp_fail(env, "device registrations %ld, %ld, %ld, then %ld after new buffers (%s address)",
            regs[0], regs[1], regs[2], regs[3], d.drecv == old ? "the same" : "another");
    bad = 1;
  }
  dev_call_release(&d);
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

/* A NIC that will not register a device allocation whole (FAKENET_MAX_MR
 * below the buffers' size, above a message's): each message is registered
 * on its own, exact, and the refusal is asked once per allocation and
 * connection, not again at the same call's next run. */
static int device_refused_body(const mp_env* env) {
  const net_case* c = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  long refused[2] = {0}, regs = 0, unused;
  setenv("FAKENET_MAX_MR", "200000", 1); /* a buffer is 600004 bytes, a message 100000 at most */
  if (direct_rank_open(env, c, &comm, &s) != 0) return 1;
  dev_call d = {.host = kDirectCall};
  int bad = dev_call_prepare(&d, env);
  for (int k = 0; k < 2 && !bad; k++)
    bad = regs_after_call(env, c, comm, s, &d, &regs) ||
          plugin_counts(c, "fakenet_refusals", &refused[k], &unused);
  if (!bad && (refused[0] == 0 || refused[1] != refused[0] || regs == 0)) {
    mp_fail(env, "refused whole registrations %ld, then %ld (%ld device registrations)", refused[0],
            refused[1], regs);
    bad = 1;
  }
  dev_call_release(&d);
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

/* A plugin failure under a collective (`coll`) whose device buffers go to the
 * plugin as they are (FAKENET_CUDA=1, synchronous), or under Hier's stage
 * between hosts in device scratch (the case's `hier`, gated): an error on
 * every rank in time, nothing written outside the buffers, the comm
 * aborts. */
static int device_fault_run(const mp_env* env, int coll) {
  const net_case* c = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  if (direct_rank_open(env, c, &comm, &s) != 0) return 1;
  dev_call d = {.host = kDirectCall};
  d.host.coll = coll;
  int bad = dev_call_prepare(&d, env);
  if (!bad) {
    ncclResult_t rc = cc_issue(&d.dev, comm, s), async = ncclSuccess;
    if (rc == ncclSuccess && dev_sync(env, s) == 0) ncclCommGetAsyncError(comm, &async);
    if (rc == ncclSuccess && async == ncclSuccess) {
      mp_fail(env, "a device %s across the failing plugin (%s) succeeded",
              cc_coll_name(d.host.coll), c->fault);
      bad = 1;
    }
    bad += dev_call_fetch(&d, env) || cc_verify_guards(&d.host, env);
  }
  dev_call_release(&d);
  ncclCommAbort(comm);
  return bad;
}

static int device_fault_body(const mp_env* env) {
  return device_fault_run(env, CC_ALLREDUCE);
}

/* Hier's reduce-scatter folding (its rows in pairs, algorithms/direct.h) */
static int device_rs_fault_body(const mp_env* env) {
  return device_fault_run(env, CC_REDUCESCATTER);
}

/* Hier's broadcast (hosts of two ranks: its stage a ring from the root's
 * host, algorithms/direct.h) */
static int device_bcast_fault_body(const mp_env* env) {
  return device_fault_run(env, CC_BROADCAST);
}

/* Hier's all-gather (on hosts of unequal sizes: two rows a host, one junk,
 * spread over the host's ranks) */
static int device_ag_fault_body(const mp_env* env) {
  return device_fault_run(env, CC_ALLGATHER);
}

/* Every case: a fault that hangs a rank fails here. */
static int launch(int nranks, mp_body_fn body, const void* arg) {
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = 60;
  return mp_launch(nranks, body, (void*)arg, &o);
}

/* Device buffers need the simulated driver, which a build may lack. */
static int have_driver(void) {
  const char* lib = getenv("BRAID_CUDA_LIB");
  return lib != NULL && access(lib, R_OK) == 0;
}

static void test_device_p2p(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(3, device_p2p_body, *state), 0);
}

static void test_device_direct(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, device_direct_body, *state), 0);
}

static void test_device_regs(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, device_regs_body, *state), 0);
}

static void test_device_refused(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, device_refused_body, *state), 0);
}

static void test_device_fault(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, device_fault_body, *state), 0);
}

static void test_device_rs_fault(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, device_rs_fault_body, *state), 0);
}

static void test_device_bcast_fault(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, device_bcast_fault_body, *state), 0);
}

static void test_device_ag_fault(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, device_ag_fault_body, *state), 0);
}

static void test_reduce_roots(void** state) {
  assert_int_equal(launch(((const net_case*)*state)->nranks, reduce_roots_body, *state), 0);
}

static void test_hier_device(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(((const net_case*)*state)->nranks, hier_device_body, *state), 0);
}

static void test_device(void** state) {
  if (!have_driver()) skip();
  assert_int_equal(launch(3, device_body, *state), 0);
}

/* The topology's report names the plugin and each of its devices with
 * what it says of itself (the fake's two differ in name and grouping),
 * and which device the host's first rank uses: read from its own log. */
static int topology_body(const mp_env* env) {
  const net_case* c = env->arg;
  char want[320];
  ncclComm_t comm;
  mp_capture cap;
  int bad = 0;
  rank_env(env, c);
  if (mp_capture_debug(&cap, "GRAPH") != 0 || mp_comm_init(env, &comm) != 0) return 1;
  snprintf(want, sizeof(want),
           "Topology: NET/Plugin Fake, 2 devices, rank %d on device 0:* 0 fake0, 10000 Mb/s, "
           "1.0 us*1 receive grouped, host memory;* 1 fake1, 10000 Mb/s, 1.0 us*8 receives "
           "grouped, host memory",
           env->rank);
  int lines = mp_capture_count(&cap, want);
  mp_capture_end_quiet(&cap);
  if (lines != (env->rank % c->per_host == 0)) {
    mp_fail(env, "%d lines of the topology's report say \"%s\"", lines, want);
    bad = 1;
  }
  return mp_expect_rc(env, comm, ncclCommDestroy(comm), ncclSuccess, "ncclCommDestroy") + bad;
}

static void test_topology(void** state) {
  assert_int_equal(launch(4, topology_body, *state), 0);
}

static void test_net(void** state) {
  const net_case* c = *state;
  assert_int_equal(launch(c->nranks, c->fault ? fault_body : good_body, c), 0);
}

static const net_case k_v8 = {.version = 8, .nranks = 3, .per_host = 1};
static const net_case k_v9 = {.version = 9, .nranks = 3, .per_host = 1};
static const net_case k_v10 = {.version = 10, .nranks = 3, .per_host = 1};
static const net_case k_v11 = {.version = 11, .nranks = 3, .per_host = 1};
static const net_case k_v12 = {.version = 12, .nranks = 4, .per_host = 1};
/* shared memory inside a host */
static const net_case k_v12_2x2 = {.version = 12, .nranks = 4, .per_host = 2};
/* device buffers where the plugin takes them, synchronous and gated calls */
static const net_case k_direct_sync = {.version = 12, .nranks = 3, .per_host = 1, .sync = 1};
static const net_case k_direct_gated = {.version = 11, .nranks = 3, .per_host = 1};
static const net_case k_direct_mixed_sync = {.version = 12, .nranks = 4, .per_host = 2, .sync = 1};
static const net_case k_direct_mixed_gated = {.version = 10, .nranks = 4, .per_host = 2};
/* Hier's stage between hosts on device scratch, or (no_cuda) pinned */
static const net_case k_hier_device = {.version = 12, .nranks = 4, .per_host = 2, .hier = 1};
static const net_case k_hier_pinned = {
    .version = 9, .nranks = 4, .per_host = 2, .hier = 1, .no_cuda = 1};
/* one rank a host */
static const net_case k_hier_pair = {.version = 11, .nranks = 2, .per_host = 1, .hier = 1};
/* 4 hosts: halving */
static const net_case k_hier_halving = {.version = 12, .nranks = 4, .per_host = 1, .hier = 1};
static const net_case k_hier_halving_2 = {.version = 10, .nranks = 8, .per_host = 2, .hier = 1};
static const net_case k_hier_halving_sync = {
    .version = 12, .nranks = 4, .per_host = 1, .sync = 1, .hier = 1};
/* 3 hosts: a fold */
static const net_case k_hier_fold = {.version = 12, .nranks = 3, .per_host = 1, .hier = 1};
/* 3 hosts of 2 */
static const net_case k_hier_fold_2 = {.version = 11, .nranks = 6, .per_host = 2, .hier = 1};
/* 5, synchronous */
static const net_case k_hier_fold_5 = {
    .version = 12, .nranks = 5, .per_host = 1, .sync = 1, .hier = 1};
/* hosts of unequal sizes: 2 + 1, 2 + 2 + 1 (a fold), 3 + 3 + 1 synchronous, 2 + 1 pinned */
static const net_case k_hier_uneven = {.version = 12, .nranks = 3, .per_host = 2, .hier = 1};
static const net_case k_hier_uneven_fold = {.version = 11, .nranks = 5, .per_host = 2, .hier = 1};
static const net_case k_hier_uneven_sync = {
    .version = 12, .nranks = 7, .per_host = 3, .sync = 1, .hier = 1};
static const net_case k_hier_uneven_pinned = {
    .version = 10, .nranks = 3, .per_host = 2, .hier = 1, .no_cuda = 1};
/* a call whose stage between hosts moves device memory takes Hier where
 * the host would run the ring (a tuner file says so; 2 + 2, 2 + 2 + 1) */
static const net_case k_hier_unforced = {
    .version = 12, .nranks = 4, .per_host = 2, .hier = 1, .unforced = 1};
static const net_case k_hier_unforced_uneven = {
    .version = 12, .nranks = 5, .per_host = 2, .hier = 1, .unforced = 1};
/* NCCL_ALGO=^Hier: none of it, one rank a host (which takes it unasked) or
 * two (the tuner given the ring) */
static const net_case k_hier_refused_pair = {
    .version = 12, .nranks = 2, .per_host = 1, .hier = 1, .no_hier = 1};
static const net_case k_hier_refused_2x2 = {
    .version = 12, .nranks = 4, .per_host = 2, .hier = 1, .unforced = 1, .no_hier = 1};
/* a host's ranks reach the network through NICs of which one takes
 * device memory and one does not: every rank must decide alike (the stage
 * in pinned memory for all), or a host's two columns run different calls */
static const net_case k_hier_mixed = {
    .version = 12, .nranks = 4, .per_host = 2, .hier = 1, .mixed_cuda = 1};
static const net_case k_fd_die = {
    .version = 12, .nranks = 2, .per_host = 1, .fault = "die", .after = "3", .sync = 1};
static const net_case k_fd_stall = {
    .version = 10, .nranks = 2, .per_host = 1, .fault = "stall", .sync = 1};
static const net_case k_fd_regmr = {
    .version = 11, .nranks = 2, .per_host = 1, .fault = "regmr", .after = "6", .sync = 1};
static const net_case k_fh_die = {
    .version = 12, .nranks = 2, .per_host = 1, .fault = "die", .after = "3", .hier = 1};
static const net_case k_fh_stall = {
    .version = 10, .nranks = 2, .per_host = 1, .fault = "stall", .hier = 1};
/* a registration refused: the scratch's */
static const net_case k_fh_regmr = {
    .version = 11, .nranks = 2, .per_host = 1, .fault = "regmr", .after = "3", .hier = 1};
/* 4 hosts: halving */
static const net_case k_fh_halving_die = {
    .version = 12, .nranks = 4, .per_host = 1, .fault = "die", .after = "3", .hier = 1};
/* 3 hosts: a fold */
static const net_case k_fh_fold_die = {
    .version = 12, .nranks = 3, .per_host = 1, .fault = "die", .after = "3", .hier = 1};
/* 5 hosts: a fold */
static const net_case k_fh_fold_stall = {
    .version = 12, .nranks = 5, .per_host = 1, .fault = "stall", .after = "2", .hier = 1};
/* a reduce-scatter's rows in pairs */
static const net_case k_fh_rs_fold_die = {
    .version = 12, .nranks = 3, .per_host = 1, .fault = "die", .after = "3", .hier = 1};
/* a broadcast's ring from the root's host, 3 hosts of 2 ranks */
static const net_case k_fh_bcast_die = {
    .version = 12, .nranks = 6, .per_host = 2, .fault = "die", .after = "3", .hier = 1};
static const net_case k_fh_bcast_stall = {
    .version = 11, .nranks = 6, .per_host = 2, .fault = "stall", .after = "2", .hier = 1};
static const net_case k_fh_rs_fold_stall = {
    .version = 11, .nranks = 5, .per_host = 1, .fault = "stall", .after = "2", .hier = 1};
/* hosts of unequal sizes (2 + 2 + 1, 2 + 1): a column's rows, two a host,
 * one junk on the small host; a reduce-scatter folding, an all-gather */
static const net_case k_fh_rs_rows_die = {
    .version = 12, .nranks = 5, .per_host = 2, .fault = "die", .after = "3", .hier = 1};
static const net_case k_fh_ag_rows_stall = {
    .version = 11, .nranks = 3, .per_host = 2, .fault = "stall", .after = "2", .hier = 1};
static const net_case k_f_init = {
    .version = 12, .nranks = 2, .per_host = 1, .fault = "init", .init_fails = 1};
static const net_case k_f_devices = {
    .version = 8, .nranks = 2, .per_host = 1, .fault = "devices", .init_fails = 1};
static const net_case k_f_props = {
    .version = 12, .nranks = 2, .per_host = 1, .fault = "props", .init_fails = 1};
static const net_case k_f_baddev = {
    .version = 10, .nranks = 2, .per_host = 1, .fault = "baddev", .init_fails = 1};
/* listen fails, per connection */
static const net_case k_f_listen = {.version = 12, .nranks = 2, .per_host = 1, .fault = "listen"};
static const net_case k_f_connect = {.version = 12, .nranks = 2, .per_host = 1, .fault = "connect"};
static const net_case k_f_accept = {.version = 9, .nranks = 2, .per_host = 1, .fault = "accept"};
static const net_case k_f_regmr = {.version = 12, .nranks = 2, .per_host = 1, .fault = "regmr"};
/* a registration refused: a payload's */
static const net_case k_f_regmr_late = {
    .version = 11, .nranks = 2, .per_host = 1, .fault = "regmr", .after = "6"};
static const net_case k_f_isend = {
    .version = 12, .nranks = 2, .per_host = 1, .fault = "isend", .after = "2"};
static const net_case k_f_irecv = {
    .version = 8, .nranks = 2, .per_host = 1, .fault = "irecv", .after = "2"};
static const net_case k_f_test = {
    .version = 12, .nranks = 2, .per_host = 1, .fault = "test", .after = "20"};
static const net_case k_f_stall = {.version = 12, .nranks = 2, .per_host = 1, .fault = "stall"};
static const net_case k_f_die = {
    .version = 12, .nranks = 2, .per_host = 1, .fault = "die", .after = "3"};
static const net_case k_f_badsize = {.version = 9, .nranks = 2, .per_host = 1, .fault = "badsize"};

#define CASE(test, c) cmocka_unit_test_prestate(test, (void*)&(c))
#define NET_TEST(c) CASE(test_net, c)

int main(void) {
  find_plugins();
  mp_default_env("BRAID_CUDA_LIB", "build/tests/libcudasim.so");
  const struct CMUnitTest tests[] = {
      NET_TEST(k_v8),
      NET_TEST(k_v9),
      NET_TEST(k_v10),
      NET_TEST(k_v11),
      NET_TEST(k_v12),
      NET_TEST(k_v12_2x2),
      NET_TEST(k_f_init),
      NET_TEST(k_f_devices),
      NET_TEST(k_f_props),
      NET_TEST(k_f_baddev),
      NET_TEST(k_f_listen),
      NET_TEST(k_f_connect),
      NET_TEST(k_f_accept),
      NET_TEST(k_f_regmr),
      NET_TEST(k_f_regmr_late),
      NET_TEST(k_f_isend),
      NET_TEST(k_f_irecv),
      NET_TEST(k_f_test),
      NET_TEST(k_f_stall),
      NET_TEST(k_f_die),
      NET_TEST(k_f_badsize),
      CASE(test_topology, k_v12_2x2),
      CASE(test_reduce_roots, k_v12_2x2),
      CASE(test_device, k_v10),
      CASE(test_device_p2p, k_v12),
      CASE(test_device_p2p, k_v8),
      CASE(test_device_direct, k_direct_sync),
      CASE(test_device_direct, k_direct_gated),
      CASE(test_device_direct, k_direct_mixed_sync),
      CASE(test_device_direct, k_direct_mixed_gated),
      CASE(test_hier_device, k_hier_device),
      CASE(test_hier_device, k_hier_pinned),
      CASE(test_hier_device, k_hier_pair),
      CASE(test_hier_device, k_hier_halving),
      CASE(test_hier_device, k_hier_halving_2),
      CASE(test_hier_device, k_hier_halving_sync),
      CASE(test_hier_device, k_hier_fold),
      CASE(test_hier_device, k_hier_fold_2),
      CASE(test_hier_device, k_hier_fold_5),
      CASE(test_hier_device, k_hier_uneven),
      CASE(test_hier_device, k_hier_uneven_fold),
      CASE(test_hier_device, k_hier_uneven_sync),
      CASE(test_hier_device, k_hier_uneven_pinned),
      CASE(test_hier_device, k_hier_unforced),
      CASE(test_hier_device, k_hier_unforced_uneven),
      CASE(test_hier_device, k_hier_refused_pair),
      CASE(test_hier_device, k_hier_refused_2x2),
      CASE(test_hier_device, k_hier_mixed),
      CASE(test_device_regs, k_direct_sync),
      CASE(test_device_refused, k_direct_sync),
      CASE(test_device_fault, k_fd_die),
      CASE(test_device_fault, k_fd_stall),
      CASE(test_device_fault, k_fd_regmr),
      CASE(test_device_fault, k_fh_die),
      CASE(test_device_fault, k_fh_stall),
      CASE(test_device_fault, k_fh_regmr),
      CASE(test_device_fault, k_fh_halving_die),
      CASE(test_device_fault, k_fh_fold_die),
      CASE(test_device_fault, k_fh_fold_stall),
      CASE(test_device_rs_fault, k_fh_rs_fold_die),
      CASE(test_device_rs_fault, k_fh_rs_fold_stall),
      CASE(test_device_bcast_fault, k_fh_bcast_die),
      CASE(test_device_bcast_fault, k_fh_bcast_stall),
      CASE(test_device_rs_fault, k_fh_rs_rows_die),
      CASE(test_device_ag_fault, k_fh_ag_rows_stall),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
