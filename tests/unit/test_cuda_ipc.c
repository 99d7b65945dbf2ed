/*
 * CUDA IPC between two processes (transports/cudaipc) on the simulated
 * driver, or a real one with BRAID_CUDA_LIB: an exporter describes a
 * cuMemAlloc'ed buffer (legacy handle) and an ncclMemAlloc'ed one (cuMem,
 * its POSIX fd over the Unix-socket link), the importer maps both and
 * reads what the exporter wrote; a second lookup maps nothing; a buffer
 * at an address the cache knows, but with another buffer id (freed and
 * reallocated), is mapped afresh and never read stale; a buffer named
 * outside what was mapped is refused. The fd link: a connection without
 * the comm's hello, or from a process the peer table does not name for
 * the rank it claims, is closed and the wait goes on; a listener held by
 * another process than the peer's is refused before anything is sent.
 * Each side is a child that opens the driver itself (a real driver does
 * not survive fork).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/cudasim_path.h"
#include "cuda/cuda_driver.h"
#include "cuda/cudaipc_fd.h"
#include "cuda/cudaipc_fd_link.h"
#include "cuda/cudaipc_mem.h"
#include "bootstrap/bootstrap.h"
#include "engine/mem.h"
#include "nccl.h"
#include "param.h"

#define BYTES (3u << 20) /* more than one 2 MiB granule */
#define TIMEOUT_MS 10000

/* A child's check: print what failed and leave with status 1. */
#define EXPECT(cond)                                                    \
  do {                                                                  \
    if (!(cond)) {                                                      \
      fprintf(stderr, "%s:%d: %s failed\n", __FILE__, __LINE__, #cond); \
      _exit(1);                                                         \
    }                                                                   \
  } while (0)

static const struct cuda_api* child_driver(CUdevice* dev) {
  const struct cuda_api* cu = cuda_driver();
  CUcontext ctx;
  EXPECT(cu != NULL);
  EXPECT(cu->cuDeviceGet(dev, 0) == CUDA_SUCCESS);
  EXPECT(cu->cuDevicePrimaryCtxRetain(&ctx, *dev) == CUDA_SUCCESS);
  EXPECT(cu->cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return cu;
}

static void fill(unsigned char* h, unsigned char salt) {
  for (size_t i = 0; i < BYTES; i++) h[i] = (unsigned char)(i * 31 + salt);
}

static int holds(const unsigned char* h, unsigned char salt) {
  for (size_t i = 0; i < BYTES; i++)
    if (h[i] != (unsigned char)(i * 31 + salt)) return 0;
  return 1;
}

/* A device buffer holding the pattern of `salt`: cuMemAlloc'ed (legacy)
 * or ncclMemAlloc'ed (cuMem). */
static void* exported_buffer(const struct cuda_api* cu, int vmm, unsigned char salt,
                             unsigned char* h) {
  void* p = NULL;
  CUdeviceptr d = 0;
  if (vmm) {
    EXPECT(ncclMemAlloc(&p, BYTES) == ncclSuccess);
  } else {
    EXPECT(cu->cuMemAlloc(&d, BYTES) == CUDA_SUCCESS);
    p = (void*)(uintptr_t)d;
  }
  fill(h, salt);
  EXPECT(mem_copy(p, h, BYTES) == ncclSuccess);
  return p;
}

static void send_desc(int link, const void* p, struct cudaipc_desc* d) {
  int fd = -1;
  EXPECT(cudaipc_describe(p, d, &fd) == ncclSuccess);
  EXPECT((d->kind == CUDAIPC_VMM) == (fd >= 0));
  EXPECT(cudaipc_fd_send(link, d, sizeof(*d), fd, TIMEOUT_MS, NULL) == ncclSuccess);
  if (fd >= 0) close(fd);
}

static void wait_word(int link) {
  int fd, word = 0;
  EXPECT(cudaipc_fd_recv(link, &word, sizeof(word), &fd, TIMEOUT_MS, NULL) == ncclSuccess);
  EXPECT(fd < 0 && word == 1);
}

static void send_word(int link) {
  int word = 1;
  EXPECT(cudaipc_fd_send(link, &word, sizeof(word), -1, TIMEOUT_MS, NULL) == ncclSuccess);
}

static void exporter(int link) {
  CUdevice dev;
  const struct cuda_api* cu = child_driver(&dev);
  unsigned char* h = malloc(BYTES);
  struct cudaipc_desc a, b, c;
  EXPECT(h != NULL);
  void* pa = exported_buffer(cu, 0, 1, h);
  void* pb = exported_buffer(cu, 1, 2, h);
  send_desc(link, pa, &a);
  send_desc(link, (char*)pb + 4096, &b); /* inside: the whole allocation is described */
  EXPECT(b.base == (uint64_t)(uintptr_t)pb && a.base == (uint64_t)(uintptr_t)pa);
  wait_word(link);
  /* pa freed, and a new buffer "at its address": whether the allocator
   * really reuses it is the driver's business; the description says so */
  EXPECT(cu->cuMemFree((CUdeviceptr)(uintptr_t)pa) == CUDA_SUCCESS);
  void* pc = exported_buffer(cu, 0, 3, h);
  int fd = -1;
  EXPECT(cudaipc_describe(pc, &c, &fd) == ncclSuccess && fd < 0);
  EXPECT(c.buffer_id != a.buffer_id);
  c.base = a.base;
  EXPECT(cudaipc_fd_send(link, &c, sizeof(c), -1, TIMEOUT_MS, NULL) == ncclSuccess);
  wait_word(link); /* the importer is done with every mapping */
  EXPECT(ncclMemFree(pb) == ncclSuccess);
  EXPECT(cu->cuMemFree((CUdeviceptr)(uintptr_t)pc) == CUDA_SUCCESS);
  free(h);
  _exit(0);
}

/* Receive a description and map it: *p the buffer's address here; the
 * whole allocation is mapped, and nothing past it is handed out. */
static void map_next(int link, struct cudaipc_cache* cache, struct cudaipc_desc* d, void** p) {
  int fd;
  size_t mapped = 0;
  char* at = NULL;
  EXPECT(cudaipc_fd_recv(link, d, sizeof(*d), &fd, TIMEOUT_MS, NULL) == ncclSuccess);
  EXPECT(!cudaipc_cache_holds(cache, 0, d));
  EXPECT(cudaipc_cache_map(cache, 0, d, fd, p, &mapped) == ncclSuccess);
  EXPECT(mapped >= BYTES);
  EXPECT(cudaipc_translate(d, *p, mapped, d->base + 16, mapped - 16, 0, &at) == ncclSuccess &&
         at == (char*)*p + 16);
  EXPECT(cudaipc_translate(d, *p, mapped, d->base + 16, mapped - 15, 0, &at) == ncclInvalidUsage);
  EXPECT(cudaipc_translate(d, *p, mapped, d->base - 1, 1, 0, &at) == ncclInvalidUsage);
  EXPECT(cudaipc_translate(d, *p, mapped, d->base + mapped + 1, 0, 0, &at) == ncclInvalidUsage);
  if (fd >= 0) close(fd);
}

static void importer(int link) {
  CUdevice dev;
  const struct cuda_api* cu = child_driver(&dev);
  struct cudaipc_cache* cache = NULL;
  struct cudaipc_desc a, b, c;
  void *pa, *pb, *pc, *again;
  uint64_t maps, stale;
  unsigned char* h = malloc(BYTES);
  EXPECT(h != NULL && cudaipc_cache_create(dev, &cache) == ncclSuccess);
  (void)cu;
  map_next(link, cache, &a, &pa);
  map_next(link, cache, &b, &pb);
  EXPECT(mem_copy(h, pa, BYTES) == ncclSuccess && holds(h, 1));
  EXPECT(mem_copy(h, pb, BYTES) == ncclSuccess && holds(h, 2));
  EXPECT(cudaipc_cache_holds(cache, 0, &a) && !cudaipc_cache_holds(cache, 1, &a));
  size_t mapped;
  EXPECT(cudaipc_cache_map(cache, 0, &a, -1, &again, &mapped) == ncclSuccess && again == pa);
  send_word(link);
  map_next(link, cache, &c, &pc); /* a's address, another buffer id */
  EXPECT(mem_copy(h, pc, BYTES) == ncclSuccess && holds(h, 3));
  cudaipc_cache_stats(cache, &maps, &stale);
  EXPECT(maps == 3 && stale == 1);
  cudaipc_cache_destroy(cache);
  send_word(link);
  free(h);
  _exit(0);
}

static int child_status(pid_t pid) {
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return -1;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_export_import(void** state) {
  (void)state;
  int sv[2];
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  pid_t e = fork();
  if (e == 0) close(sv[1]), exporter(sv[0]);
  pid_t i = fork();
  if (i == 0) close(sv[0]), importer(sv[1]);
  close(sv[0]);
  close(sv[1]);
  assert_int_equal(child_status(e), 0);
  assert_int_equal(child_status(i), 0);
}

/* A process that knows the listener's name but not the comm's secret: a
 * hello whose proof is wrong is closed. */
static void stranger_connects(uint64_t secret) {
  struct sockaddr_un a;
  struct cudaipc_fd_hello hello;
  socklen_t len = cudaipc_fd_addr(secret, "test", 0, &a);
  cudaipc_fd_hello_make(secret ^ 1, "test", 1, 7, &hello);
  int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  EXPECT(s >= 0 && connect(s, (struct sockaddr*)&a, len) == 0);
  EXPECT(send(s, &hello, sizeof(hello), 0) == (ssize_t)sizeof(hello));
  char c;
  EXPECT(recv(s, &c, 1, 0) == 0); /* closed by the acceptor */
  close(s);
}

/* Another process of this user with the secret: a true hello of rank 1,
 * but rank 1 is not its pid. */
static void impostor_connects(uint64_t secret) {
  struct sockaddr_un a;
  struct cudaipc_fd_hello hello;
  socklen_t len = cudaipc_fd_addr(secret, "test", 0, &a);
  cudaipc_fd_hello_make(secret, "test", 1, 7, &hello);
  pid_t c = fork();
  if (c == 0) {
    int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
    char x;
    EXPECT(s >= 0 && connect(s, (struct sockaddr*)&a, len) == 0);
    EXPECT(send(s, &hello, sizeof(hello), 0) == (ssize_t)sizeof(hello));
    EXPECT(recv(s, &x, 1, 0) == 0); /* closed by the acceptor */
    _exit(0);
  }
  EXPECT(waitpid(c, NULL, 0) == c);
}

/* Rank 1 connects to rank 0's listener after a stranger and an impostor,
 * and, first, to a listener that claims to be rank 0 with another pid:
 * the acceptor closes the stranger and the impostor and returns rank 1's
 * link, whose message carries an fd. */
static void test_fd_link(void** state) {
  (void)state;
  uint64_t secret = 0x1234abcdull ^ (uint64_t)getpid();
  int link, peer, tag, fd, go[2];
  char msg[16] = "hello";
  struct peer_info peers[2];
  struct cudaipc_listener* l = NULL;
  assert_int_equal(pipe(go), 0);
  pid_t c = fork();
  if (c == 0) {
    char x;
    EXPECT(read(go[0], &x, 1) == 1); /* rank 0 listens */
    stranger_connects(secret);
    impostor_connects(secret);
    EXPECT(cudaipc_fd_connect(secret, "test", 1, 0, getppid() + 1000000, 7, TIMEOUT_MS, NULL,
                              &link) == ncclSystemError); /* not rank 0's pid: nothing sent */
    EXPECT(cudaipc_fd_connect(secret, "test", 1, 0, getppid(), 7, TIMEOUT_MS, NULL, &link) ==
           ncclSuccess);
    EXPECT(cudaipc_fd_send(link, msg, sizeof(msg), 1 /* stdout, as an fd */, TIMEOUT_MS, NULL) ==
           ncclSuccess);
    _exit(0);
  }
  memset(peers, 0, sizeof(peers));
  peers[0].pid = getpid();
  peers[1].pid = c;
  assert_int_equal(cudaipc_fd_listen(secret, "test", 0, peers, 2, 2, &l), ncclSuccess);
  assert_int_equal(cudaipc_fd_listen(secret, "test", 0, peers, 2, 2, &l), ncclSystemError);
  assert_int_equal(write(go[1], "g", 1), 1);
  assert_int_equal(cudaipc_fd_accept(l, TIMEOUT_MS, NULL, &link, &peer, &tag), ncclSuccess);
  assert_int_equal(peer, 1);
  assert_int_equal(tag, 7);
  memset(msg, 0, sizeof(msg));
  assert_int_equal(cudaipc_fd_recv(link, msg, sizeof(msg), &fd, TIMEOUT_MS, NULL), ncclSuccess);
  assert_string_equal(msg, "hello");
  assert_true(fd >= 0);
  close(fd);
  close(link);
  cudaipc_fd_listener_free(l);
  assert_int_equal(child_status(c), 0);
}

/* A peer that sent its last word and closed with our message unread:
 * the link is reset, and the kernel says so ahead of that last word. The
 * receiver must still get the word, then the end of the link (a direct
 * call's peers learn so which rank failed, not just "connection reset"). */
static void test_fd_link_reset(void** state) {
  (void)state;
  int sv[2], fd;
  char last[16] = "fail", unread[16] = "done", got[16] = {0};
  assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  assert_int_equal(cudaipc_fd_send(sv[1], last, sizeof(last), -1, TIMEOUT_MS, NULL), ncclSuccess);
  assert_int_equal(cudaipc_fd_send(sv[0], unread, sizeof(unread), -1, TIMEOUT_MS, NULL),
                   ncclSuccess);
  close(sv[1]); /* with "done" unread: a reset */
  assert_int_equal(cudaipc_fd_recv(sv[0], got, sizeof(got), &fd, TIMEOUT_MS, NULL), ncclSuccess);
  assert_string_equal(got, "fail");
  assert_int_equal(fd, -1);
  assert_int_equal(cudaipc_fd_recv(sv[0], got, sizeof(got), &fd, TIMEOUT_MS, NULL),
                   ncclSystemError); /* then the end */
  assert_true(cudaipc_fd_closed(sv[0]));
  close(sv[0]);
}

int main(int argc, char** argv) {
  (void)argc;
  char lib[4096];
  cudasim_path_beside(argv[0], lib, sizeof(lib));
  setenv("BRAID_CUDA_LIB", lib, 0); /* a real libcuda.so.1 runs the same on a GPU */
  param_cache_reset();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_export_import),
      cmocka_unit_test(test_fd_link),
      cmocka_unit_test(test_fd_link_reset),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
