/* What a rank takes from its peers and from the host on device buffers
 * (issue 31), on the simulated driver:
 *  - the direct algorithm writes nothing unless every rank made the same
 *    call: a count, op, type or root that differs is ncclInvalidUsage on
 *    every rank, naming both calls, with every byte of every buffer and of
 *    the rest of its allocation as it was;
 *  - a peer's buffer description is used only inside the allocation it
 *    names, as mapped here (this binary wraps cudaipc_describe so that a
 *    rank can lie about its own), on the direct path and on CUDA IPC
 *    send/recv: the call fails naming the peer, nothing is written outside;
 *  - a stranger on the host (another user, or another process of this
 *    user) who holds the comm's secret still gets no link to a rank's fd
 *    listener, and a rank's data goes on right;
 *  - a stranger who took a rank's listener name first makes that rank and
 *    its peers fail at once, and gets nothing from them;
 *  - idle and garbage connections to the listeners (whose names every user
 *    reads in /proc/net/unix) delay nobody. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "comm/comm.h"
#include "cuda/cudaipc_fd.h"
#include "cuda/cudaipc_fd_link.h"
#include "cuda/cudaipc_mem.h"
#include "devmem.h"
#include "launcher.h"
#include "stranger.h"

#define DEADLINE_S 60            /* a wait for BRAID_TIMEOUT_MS fails the launch here */
#define LONG_TIMEOUT_MS "600000" /* no failure here may come from the timeout */
#define FLAG_GO 10               /* shm: a rank may make its call now */
#define MIB ((size_t)1 << 20)

/* ---- a rank lying about its buffers (TRUST_LIE, read in this rank) ---- */

ncclResult_t __real_cudaipc_describe(const void* ptr, struct cudaipc_desc* desc, int* fd);

/* "size": the allocation is 2 MiB long (it is 4); "base": it starts 4 MiB
 * after where it does. */
ncclResult_t __wrap_cudaipc_describe(const void* ptr, struct cudaipc_desc* desc, int* fd) {
  ncclResult_t rc = __real_cudaipc_describe(ptr, desc, fd);
  const char* lie = getenv("TRUST_LIE");
  if (rc != ncclSuccess || lie == NULL) return rc;
  if (strcmp(lie, "size") == 0) desc->size = 2 * MIB;
  if (strcmp(lie, "base") == 0) desc->base += 4 * MIB;
  return rc;
}

/* ---- device buffers with their allocation around them ---- */

/* 4 MiB of device memory filled with a pattern of `seed`; the call's
 * buffer starts at `off`. */
typedef struct dev_block {
  unsigned char* dev;
  unsigned char* host; /* what the block must still hold where nothing may be written */
} dev_block;

static int block_open(const mp_env* env, dev_block* b, int seed) {
  b->host = malloc(4 * MIB);
  if (b->host == NULL || ncclMemAlloc((void**)&b->dev, 4 * MIB) != ncclSuccess) return 1;
  for (size_t i = 0; i < 4 * MIB; i++) b->host[i] = (unsigned char)(seed * 31 + i * 7);
  return dev_copy(env, b->dev, b->host, 4 * MIB);
}

/* Bytes of the block that differ from what it held. */
static size_t block_changed(const mp_env* env, const dev_block* b) {
  unsigned char* now = malloc(4 * MIB);
  size_t n = 0;
  if (now == NULL || dev_copy(env, now, b->dev, 4 * MIB)) n = 4 * MIB;
  for (size_t i = 0; now && n < 4 * MIB && i < 4 * MIB; i++) n += now[i] != b->host[i];
  free(now);
  return n;
}

static void block_close(dev_block* b) {
  ncclMemFree(b->dev);
  free(b->host);
}

/* Two ranks of body(arg), none waiting past DEADLINE_S. */
static int launch_pair(mp_body_fn body, void* arg) {
  mp_opts o = MP_OPTS_INIT;
  o.deadline_s = DEADLINE_S;
  return mp_launch(2, body, arg, &o);
}

/* ---- calls that differ, on the direct algorithm ---- */

typedef struct differ_case {
  const char* what;
  int sync; /* BRAID_STREAM_MEMOPS=0: the synchronous direct path, else gated */
} differ_case;

/* Rank r's call of case `what`: an all-reduce of 32768 floats, but for
 * rank 1, which differs in one thing. */
static ncclResult_t differ_call(const mp_env* env, const char* what, ncclComm_t comm,
                                cudaStream_t s, void* send, void* recv) {
  int odd = env->rank == 1;
  size_t n = 32768;
  if (strcmp(what, "count") == 0)
    return ncclAllReduce(send, recv, odd ? 3 * n : n, ncclFloat, ncclSum, comm, s);
  if (strcmp(what, "op") == 0)
    return ncclAllReduce(send, recv, n, ncclFloat, odd ? ncclMax : ncclSum, comm, s);
  if (strcmp(what, "type") == 0)
    return ncclAllReduce(send, recv, n, odd ? ncclInt32 : ncclFloat, ncclSum, comm, s);
  if (strcmp(what, "broadcast root") == 0)
    return ncclBroadcast(send, recv, n, ncclFloat, odd, comm, s);
  return ncclReduce(send, recv, n, ncclFloat, ncclSum, odd, comm, s); /* "reduce root" */
}

static int differ_body(const mp_env* env) {
  const differ_case* k = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  dev_block in, out;
  int bad = 0;
  setenv("NCCL_ALGO", "Direct", 1);
  if (k->sync) setenv("BRAID_STREAM_MEMOPS", "0", 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (block_open(env, &in, 1 + env->rank) || block_open(env, &out, 7 + env->rank)) return 1;
  ncclResult_t rc = differ_call(env, k->what, comm, s, in.dev, out.dev);
  rc = dev_outcome(env, comm, s, rc);
  bad += mp_expect_rc(env, comm, rc, ncclInvalidUsage, k->what);
  const char* why = ncclGetLastError(comm);
  if (strstr(why, "called") == NULL ||
      strstr(why, env->rank ? "rank 0 called" : "rank 1 called") == NULL)
    mp_fail(env, "%s: the error does not name both calls: \"%s\"", k->what, why), bad++;
  size_t changed = block_changed(env, &in) + block_changed(env, &out);
  if (changed) mp_fail(env, "%s: %zu bytes written by calls that differ", k->what, changed), bad++;
  ncclCommAbort(comm);
  block_close(&in);
  block_close(&out);
  return bad;
}

static void test_direct_calls_differ(void** state) {
  (void)state;
  static const char* const what[] = {"count", "op", "type", "broadcast root", "reduce root"};
  for (int i = 0; i < 5; i++)
    for (int sync = 0; sync < 2; sync++) {
      differ_case k = {what[i], sync};
      assert_int_equal(launch_pair(differ_body, &k), 0);
    }
}

/* ---- a peer lying about its buffer ---- */

typedef struct lie_case {
  const char* lie;
  int p2p; /* CUDA IPC send/recv (rank 1 receives), else a direct all-reduce */
} lie_case;

#define LIE_COUNT 1024 /* floats, at 3 MiB into the block: outside a 2 MiB one */

static int lie_body(const mp_env* env) {
  const lie_case* k = env->arg;
  ncclComm_t comm;
  cudaStream_t s;
  dev_block b;
  int bad = 0;
  setenv("NCCL_ALGO", "Direct", 1);
  if (env->rank == 1) setenv("TRUST_LIE", k->lie, 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (block_open(env, &b, 3 + env->rank)) return 1;
  unsigned char* buf = b.dev + 3 * MIB;
  ncclResult_t rc;
  if (k->p2p)
    rc = env->rank == 0 ? ncclSend(buf, LIE_COUNT, ncclFloat, 1, comm, s)
                        : ncclRecv(buf, LIE_COUNT, ncclFloat, 0, comm, s);
  else
    rc = ncclAllReduce(buf, buf, LIE_COUNT, ncclFloat, ncclSum, comm, s);
  rc = dev_outcome(env, comm, s, rc);
  if (rc == ncclSuccess) mp_fail(env, "a call with a lying peer succeeded"), bad++;
  if (env->rank == 0) { /* it mapped the liar's buffer: it says who lied */
    bad += mp_expect_rc(env, comm, rc, ncclInvalidUsage, "a peer's buffer outside its allocation");
    if (strstr(ncclGetLastError(comm), "rank 1 named") == NULL)
      mp_fail(env, "the error does not name the peer: \"%s\"", ncclGetLastError(comm)), bad++;
    size_t changed = block_changed(env, &b);
    if (changed > (k->p2p ? 0 : LIE_COUNT * sizeof(float)))
      mp_fail(env, "%zu bytes of rank 0's block changed", changed), bad++;
  }
  ncclCommAbort(comm);
  block_close(&b);
  return bad;
}

static void test_peer_buffer_outside(void** state) {
  (void)state;
  static const lie_case cases[] = {{"size", 0}, {"base", 0}, {"size", 1}, {"base", 1}};
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    assert_int_equal(launch_pair(lie_body, (void*)&cases[i]), 0);
}

/* ---- strangers at a rank's fd listener ---- */

typedef struct stranger_link {
  struct sockaddr_un addr;
  socklen_t len;
  struct cudaipc_fd_hello hello;
  uint64_t secret; /* what the stranger holds */
} stranger_link;

/* As a stranger holding the secret would: to every p2p listener named in
 * /proc/net/unix, a hello claiming rank 1 on the p2p channel, made as the
 * protocol makes it and, on another link, with the secret itself where
 * the proof goes (how links opened before). 0 when every listener closed
 * or ignored them within 3 s, 1 when one sent anything. */
static int stranger_hellos(void* arg) {
  const stranger_link* proto = arg;
  char names[16][108], buf[512];
  int socks[32], n = 0, got = 0;
  int nnames = stranger_abstract_names("braid-ipc-p2p-", names, 16);
  for (int i = 0; i < nnames; i++)
    for (int form = 0; form < 2 && n < 32; form++) {
      struct sockaddr_un a = {.sun_family = AF_UNIX};
      struct cudaipc_fd_hello h = proto->hello;
      size_t len = strlen(names[i]);
      memcpy(a.sun_path + 1, names[i], len);
      if (form) h.proof = proto->secret;
      int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
      if (connect(s, (struct sockaddr*)&a,
                  (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len)) == 0)
        send(s, &h, sizeof(h), MSG_NOSIGNAL);
      socks[n++] = s;
    }
  for (int t = 0; t < 30 && !got; t++) {
    for (int i = 0; i < n; i++) got |= recv(socks[i], buf, sizeof(buf), MSG_DONTWAIT) > 0;
    usleep(100000);
  }
  return nnames == 0 ? 3 : got;
}

/* One exchange of 256 floats to rank `to` from the other rank over CUDA
 * IPC: 0 when `to` received what was sent, else the failures. */
static int p2p_once(const mp_env* env, ncclComm_t comm, cudaStream_t s, float* dev, float value,
                    int to) {
  float host[256];
  int bad = 0;
  for (int i = 0; i < 256; i++) host[i] = env->rank == to ? -1.0f : value + (float)i;
  bad += dev_copy(env, dev, host, sizeof(host));
  ncclResult_t rc = env->rank == to ? ncclRecv(dev, 256, ncclFloat, 1 - to, comm, s)
                                    : ncclSend(dev, 256, ncclFloat, to, comm, s);
  bad += mp_expect_rc(env, comm, dev_outcome(env, comm, s, rc), ncclSuccess, "send/recv");
  if (env->rank == to && !bad) {
    bad += dev_copy(env, host, dev, sizeof(host));
    for (int i = 0; i < 256 && !bad; i++)
      if (host[i] != value + (float)i)
        mp_fail(env, "[%d] = %g: not the sender's", i, host[i]), bad++;
  }
  return bad;
}

/* Rank 0 listens (its first device call), then two strangers holding the
 * secret, as nobody and as this user, open links claiming to be rank 1
 * before rank 1 does; rank 0's receive from rank 1 must still get rank
 * 1's bytes, and neither stranger anything. */
static int secret_holder_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  float* dev = NULL;
  int bad = 0;
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc((void**)&dev, MIB)) return 1;
  float zero[256] = {0};
  bad += dev_copy(env, dev, zero, sizeof(zero));
  ncclResult_t rc = ncclAllReduce(dev, dev, 256, ncclFloat, ncclSum, comm, s);
  bad += mp_expect_rc(env, comm, dev_outcome(env, comm, s, rc), ncclSuccess, "a first device call");
  if (env->rank == 0) {
    stranger_link l;
    pid_t kids[2];
    memset(&l, 0, sizeof(l));
    l.secret = comm->tctx.secret;
    cudaipc_fd_hello_make(comm->tctx.secret, "p2p", 1, 1, &l.hello); /* rank 1, channel p2p */
    for (int k = 0; k < 2; k++)
      if (stranger_run(env, k ? getuid() : STRANGER_UID, stranger_hellos, &l, 0, &kids[k]))
        return 1;
    mp_sleep_ms(300);                               /* their links wait at the listeners */
    rc = ncclRecv(dev, 256, ncclFloat, 1, comm, s); /* its proxy serves the listener */
    for (int k = 0; k < 2; k++)
      if (stranger_join(env, kids[k]) != 0) mp_fail(env, "stranger %d got a message", k), bad++;
    __atomic_store_n(&env->shm[FLAG_GO], 1, __ATOMIC_SEQ_CST);
    bad += mp_expect_rc(env, comm, dev_outcome(env, comm, s, rc), ncclSuccess,
                        "the receive the strangers tried");
    float host[256];
    bad += dev_copy(env, host, dev, sizeof(host));
    for (int i = 0; i < 256 && !bad; i++)
      if (host[i] != 5.0f + (float)i) mp_fail(env, "[%d] = %g: not rank 1's", i, host[i]), bad++;
  } else {
    if (!mp_wait_flag(&env->shm[FLAG_GO], 30000)) bad++;
    float host[256];
    for (int i = 0; i < 256; i++) host[i] = 5.0f + (float)i;
    bad += dev_copy(env, dev, host, sizeof(host));
    bad += mp_expect_rc(env, comm,
                        dev_outcome(env, comm, s, ncclSend(dev, 256, ncclFloat, 0, comm, s)),
                        ncclSuccess, "rank 1's send");
  }
  bad += p2p_once(env, comm, s, dev, 40.0f, 0); /* the link that won goes on working */
  ncclCommDestroy(comm);
  ncclMemFree(dev);
  return bad;
}

static void test_stranger_with_secret(void** state) {
  (void)state;
  assert_int_equal(launch_pair(secret_holder_body, NULL), 0);
}

/* A stranger binds a rank's listener name before the rank does, and
 * keeps what comes to it for 3 s: 1 if any byte came. */
static int squatter(void* arg) {
  const stranger_link* l = arg;
  char buf[512];
  int got = 0, s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
  if (s < 0 || bind(s, (const struct sockaddr*)&l->addr, l->len) != 0 || listen(s, 8) != 0)
    return 2;
  for (int t = 0; t < 300 && !got; t++) {
    int c = accept(s, NULL, NULL);
    if (c >= 0) {
      struct timeval tv = {0, 100000};
      setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      got = recv(c, buf, sizeof(buf), 0) > 0;
      close(c);
    }
    usleep(10000);
  }
  return got;
}

/* The direct links' listeners open at the first direct call: a stranger
 * who knew the secret could bind rank 1's name first. Rank 1 then fails
 * at once (the name is taken), rank 0 too (who holds the name is not
 * rank 1), and the stranger gets nothing from either. */
static int squatted_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  float* dev = NULL;
  pid_t kid = -1;
  int bad = 0;
  setenv("NCCL_ALGO", "Direct", 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc((void**)&dev, MIB)) return 1;
  if (env->rank == 1) {
    stranger_link l;
    l.len = cudaipc_fd_addr(comm->tctx.secret, "direct", 1, &l.addr);
    if (stranger_run(env, STRANGER_UID, squatter, &l, 0, &kid)) return 1;
    mp_sleep_ms(200); /* bound by now */
    __atomic_store_n(&env->shm[FLAG_GO], 1, __ATOMIC_SEQ_CST);
  } else if (!mp_wait_flag(&env->shm[FLAG_GO], 30000)) {
    bad++;
  }
  ncclResult_t rc = ncclAllReduce(dev, dev, 256, ncclFloat, ncclSum, comm, s);
  rc = dev_outcome(env, comm, s, rc);
  const char* want = env->rank == 1 ? "is taken" : "held by";
  if (rc == ncclSuccess) mp_fail(env, "a direct call with a squatted listener succeeded"), bad++;
  if (strstr(ncclGetLastError(comm), want) == NULL)
    mp_fail(env, "the error does not say \"%s\": \"%s\"", want, ncclGetLastError(comm)), bad++;
  if (kid > 0 && stranger_join(env, kid) != 0) mp_fail(env, "the squatter got bytes"), bad++;
  ncclCommAbort(comm);
  ncclMemFree(dev);
  return bad;
}

static void test_squatted_name(void** state) {
  (void)state;
  assert_int_equal(launch_pair(squatted_body, NULL), 0);
}

/* ---- a flood of idle and garbage connections ---- */

#define FLOOD_LINKS 100

/* As nobody: open FLOOD_LINKS connections to every braid listener name
 * in /proc/net/unix, garbage on every third, and hold them until killed. */
static int flood(void* arg) {
  (void)arg;
  char names[16][108];
  int n = stranger_abstract_names("braid-ipc-", names, 16);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < FLOOD_LINKS; k++) {
      struct sockaddr_un a = {.sun_family = AF_UNIX};
      size_t len = strlen(names[i]);
      memcpy(a.sun_path + 1, names[i], len);
      int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
      connect(s, (struct sockaddr*)&a,
              (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len));
      if (k % 3 == 0) send(s, "garbage", 7, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  pause();
  return n == 0 ? 3 : 0;
}

/* Each rank's listeners are up (a device call each, and the direct links
 * of rank 1 waiting for rank 0's), a flood arrives at them, then the
 * calls that make the links run: all right, none waiting. */
static int flood_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  float* dev = NULL;
  pid_t kid = -1;
  int bad = 0;
  setenv("NCCL_ALGO", "Direct", 1);
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc((void**)&dev, MIB)) return 1;
  float host[256];
  for (int i = 0; i < 256; i++) host[i] = (float)(env->rank + 1);
  bad += dev_copy(env, dev, host, sizeof(host));
  if (env->rank == 0) { /* rank 1's direct listener waits for this rank's link */
    if (!mp_wait_flag(&env->shm[FLAG_GO], 30000)) bad++;
  }
  ncclResult_t rc = ncclAllReduce(dev, dev, 256, ncclFloat, ncclSum, comm, s); /* gated */
  if (env->rank == 1) {
    mp_sleep_ms(300); /* its listeners are up */
    if (stranger_run(env, STRANGER_UID, flood, NULL, 0, &kid)) return 1;
    mp_sleep_ms(500); /* the flood is in */
    __atomic_store_n(&env->shm[FLAG_GO], 1, __ATOMIC_SEQ_CST);
  }
  bad += mp_expect_rc(env, comm, dev_outcome(env, comm, s, rc), ncclSuccess, "direct all-reduce");
  bad += dev_copy(env, host, dev, sizeof(host));
  for (int i = 0; i < 256 && !bad; i++)
    if (host[i] != 3.0f) mp_fail(env, "all-reduce [%d] = %g", i, host[i]), bad++;
  bad += p2p_once(env, comm, s, dev, 9.0f, 1); /* rank 1's p2p listener, flooded too */
  if (kid > 0) stranger_stop(kid);
  ncclCommDestroy(comm);
  ncclMemFree(dev);
  return bad;
}

static void test_flood(void** state) {
  (void)state;
  assert_int_equal(launch_pair(flood_body, NULL), 0);
}

/* ---- no secret where strangers read ---- */

/* Every braid listener name must be free of the comm's secret. */
static int names_body(const mp_env* env) {
  ncclComm_t comm;
  cudaStream_t s;
  float* dev = NULL;
  char names[16][108], hex[32];
  int bad = 0;
  setenv("NCCL_ALGO", "Direct", 1);
  setenv("BRAID_STREAM_MEMOPS", "0", 1); /* synchronous: the listeners are up when it returns */
  if (dev_open(env, 0) || mp_comm_init(env, &comm) || (s = dev_stream(env)) == NULL) return 1;
  if (ncclMemAlloc((void**)&dev, MIB)) return 1;
  bad += p2p_once(env, comm, s, dev, 1.0f, 0);
  snprintf(hex, sizeof(hex), "%016llx", (unsigned long long)comm->tctx.secret);
  int n = stranger_abstract_names("braid-", names, 16);
  for (int i = 0; i < n; i++)
    if (strstr(names[i], hex)) mp_fail(env, "a public name holds the secret: %s", names[i]), bad++;
  if (n == 0) mp_fail(env, "no listener name found"), bad++;
  ncclCommDestroy(comm);
  ncclMemFree(dev);
  return bad;
}

static void test_no_secret_in_names(void** state) {
  (void)state;
  assert_int_equal(launch_pair(names_body, NULL), 0);
}

int main(void) {
  mp_default_env("BRAID_CUDA_LIB", "build/tests/libcudasim.so");
  mp_default_env("BRAID_TIMEOUT_MS", LONG_TIMEOUT_MS);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_secret_in_names),  cmocka_unit_test(test_direct_calls_differ),
      cmocka_unit_test(test_peer_buffer_outside), cmocka_unit_test(test_stranger_with_secret),
      cmocka_unit_test(test_squatted_name),       cmocka_unit_test(test_flood),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
