/*
 * A fake NCCL net plugin for the tests (as fakeverbs fakes libibverbs):
 * built once per interface version (FAKENET_VERSION 8..12, one library
 * each, libnccl-net-fake<v>.so), its network is Unix-domain sockets in the
 * abstract namespace, and it behaves as a strict plugin does: messages
 * match receives in posting order, a receive smaller than its message
 * fails, every buffer must lie in a registration of its comm, at most
 * FAKENET_MAX_REQS requests per comm (one more gets a NULL request: "try
 * again"), and a device's largest message is small (FAKENET_MAX_BYTES),
 * so hosts must cut.
 *
 * FAKENET_FAULT injects the failures a real plugin shows, one at a time:
 *   init, devices, props, listen, connect, accept, regmr, isend, irecv,
 *   test       that call fails (ncclSystemError)
 *   stall      test never completes a message
 *   die        a message's send closes its connection first
 *   badsize    a completed receive reports more bytes than were posted
 *   baddev     the device is not host-driven
 * FAKENET_FAULT_AFTER=N lets the first N calls of that kind succeed.
 * FAKENET_MAX_MR=N refuses a registration of more than N bytes, as a NIC
 * with a limit on a region does; fakenet_refusals() counts them.
 * FAKENET_CUDA=1 makes its devices take CUDA device memory (NCCL_PTR_CUDA),
 * which the simulated driver keeps in host memory the fake reads and
 * writes; fakenet_stats() says how many such registrations and flushes it
 * saw, and fakenet_traffic() how many bytes its requests posted on device
 * memory and on host memory (the latter without requests of
 * FAKENET_FRAME_MAX bytes or less: the transport's frames), for a test
 * that dlopens it too.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "net/net_abi.h"

#ifndef FAKENET_VERSION
#define FAKENET_VERSION 12
#endif
#define FAKENET_NDEVS 2 /* two NICs on one network: ranks of a host spread over them */
#define FAKENET_MAX_REQS 16
#define FAKENET_MAX_BYTES 100000
#define FAKENET_MAGIC 0x46414b45u /* "FAKE" */

struct fk_handle {
  uint32_t magic;
  uint32_t pad;
  uint64_t name;
};

struct fk_mr {
  uint32_t magic;
  int cuda; /* device memory: reached through the simulated driver's DMA view */
  char* base;
  size_t size;
  uint64_t buffer_id; /* cuda: the allocation registered (a NIC pins its pages) */
};

struct fk_comm;
struct fk_req {
  struct fk_comm* comm;
  int used;
  int is_send;
  char* buf;
  size_t size; /* send: its size; receive: room */
  size_t done; /* bytes moved, the 8-byte length first */
  uint64_t len;
  int complete;
};

struct fk_comm {
  int fd;
  int is_send;
  struct fk_req reqs[FAKENET_MAX_REQS]; /* in posting order from head */
  int head, count;
  int driven; /* the first `driven` from head are complete */
};

struct fk_listen {
  int fd;
};

static _Atomic long g_cuda_regs, g_flushes;     /* fakenet_stats */
static _Atomic long g_cuda_bytes, g_host_bytes; /* fakenet_traffic */
static _Atomic long g_refusals;                 /* fakenet_refusals */
#define FAKENET_FRAME_MAX 256

static int fk_cuda(void) {
  const char* v = getenv("FAKENET_CUDA");
  return v && strcmp(v, "1") == 0;
}

__attribute__((visibility("default"))) void fakenet_stats(long* cuda_regs, long* flushes) {
  *cuda_regs = atomic_load(&g_cuda_regs);
  *flushes = atomic_load(&g_flushes);
}
__attribute__((visibility("default"))) void fakenet_traffic(long* cuda_bytes, long* host_bytes) {
  *cuda_bytes = atomic_load(&g_cuda_bytes);
  *host_bytes = atomic_load(&g_host_bytes);
}
__attribute__((visibility("default"))) void fakenet_refusals(long* too_big, long* unused) {
  *too_big = atomic_load(&g_refusals);
  *unused = 0;
}

/* FAKENET_MAX_MR: a registration larger than it is refused. */
static int fk_too_big(size_t size) {
  const char* v = getenv("FAKENET_MAX_MR");
  if (v == NULL || size <= (size_t)atol(v)) return 0;
  atomic_fetch_add(&g_refusals, 1);
  return 1;
}
static _Atomic long g_calls[16];

enum {
  FAULT_NONE,
  FAULT_INIT,
  FAULT_DEVICES,
  FAULT_PROPS,
  FAULT_LISTEN,
  FAULT_CONNECT,
  FAULT_ACCEPT,
  FAULT_REGMR,
  FAULT_ISEND,
  FAULT_IRECV,
  FAULT_TEST,
  FAULT_STALL,
  FAULT_DIE,
  FAULT_BADSIZE,
  FAULT_BADDEV
};

static int fault_kind(long* arg) {
  static const char* const names[] = {"",        "init",   "devices", "props",   "listen",
                                      "connect", "accept", "regmr",   "isend",   "irecv",
                                      "test",    "stall",  "die",     "badsize", "baddev"};
  const char* f = getenv("FAKENET_FAULT");
  *arg = 0;
  if (f == NULL) return FAULT_NONE;
  for (int i = 1; i < (int)(sizeof(names) / sizeof(names[0])); i++) {
    size_t n = strlen(names[i]);
    if (strncmp(f, names[i], n) == 0 && (f[n] == '\0' || f[n] == ':')) {
      if (f[n] == ':') *arg = atol(f + n + 1);
      return i;
    }
  }
  return FAULT_NONE;
}

/* Whether this call of `kind` fails now. */
static int fault(int kind) {
  long arg;
  if (fault_kind(&arg) != kind) return 0;
  const char* after = getenv("FAKENET_FAULT_AFTER");
  long n = atomic_fetch_add(&g_calls[kind], 1);
  return n >= (after ? atol(after) : 0);
}

static socklen_t fk_address(uint64_t name, struct sockaddr_un* a) {
  memset(a, 0, sizeof(*a));
  a->sun_family = AF_UNIX;
  int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, "braid-fakenet-%016llx",
                   (unsigned long long)name);
  return (socklen_t)(__builtin_offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ---- setup ---- */

static ncclResult_t fk_init(void) {
  return fault(FAULT_INIT) ? ncclSystemError : ncclSuccess;
}

static ncclResult_t fk_devices(int* ndev) {
  *ndev = FAKENET_NDEVS;
  return fault(FAULT_DEVICES) ? ncclSystemError : ncclSuccess;
}

static ncclResult_t fk_listen(int dev, void* handle, void** listen_comm) {
  struct fk_handle* h = handle;
  struct fk_listen* l;
  struct sockaddr_un a;
  if ((dev < 0 || dev >= FAKENET_NDEVS) || fault(FAULT_LISTEN) ||
      (l = calloc(1, sizeof(*l))) == NULL)
    return ncclSystemError;
  l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  h->magic = FAKENET_MAGIC;
  h->name = ((uint64_t)getpid() << 24) ^ (uint64_t)(uintptr_t)l;
  if (l->fd < 0 || bind(l->fd, (struct sockaddr*)&a, fk_address(h->name, &a)) != 0 ||
      listen(l->fd, 128) != 0) {
    if (l->fd >= 0) close(l->fd);
    free(l);
    return ncclSystemError;
  }
  *listen_comm = l;
  return ncclSuccess;
}

static ncclResult_t fk_comm_new(int fd, int is_send, void** out) {
  struct fk_comm* c = calloc(1, sizeof(*c));
  if (c == NULL) return ncclSystemError;
  c->fd = fd;
  c->is_send = is_send;
  *out = c;
  return ncclSuccess;
}

static ncclResult_t fk_connect(int dev, void* handle, void** send_comm) {
  const struct fk_handle* h = handle;
  struct sockaddr_un a;
  *send_comm = NULL;
  if ((dev < 0 || dev >= FAKENET_NDEVS) || h->magic != FAKENET_MAGIC || fault(FAULT_CONNECT))
    return ncclSystemError;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, (struct sockaddr*)&a, fk_address(h->name, &a)) != 0) {
    if (fd >= 0) close(fd);
    return ncclSystemError;
  }
  return fk_comm_new(fd, 1, send_comm);
}

static ncclResult_t fk_accept(void* listen_comm, void** recv_comm) {
  struct fk_listen* l = listen_comm;
  *recv_comm = NULL;
  if (fault(FAULT_ACCEPT)) return ncclSystemError;
  int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
  if (fd < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? ncclSuccess : ncclSystemError;
  return fk_comm_new(fd, 0, recv_comm);
}

/* Device memory as a NIC's DMA sees it: the simulated driver's view
 * (BRAID_CUDA_LIB, already loaded by the library), NULL where none. */
static void* fk_sim(const char* name) {
  const char* lib = getenv("BRAID_CUDA_LIB");
  void* h = lib ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL;
  void* f = h ? dlsym(h, name) : NULL;
  if (h) dlclose(h); /* the library keeps it loaded */
  return f;
}

static void* fk_dma(void* data, size_t size) {
  void* (*dma)(uintptr_t, size_t) = (void* (*)(uintptr_t, size_t))fk_sim("cudasim_dma_addr");
  return dma ? dma((uintptr_t)data, size) : NULL;
}

/* The allocation at data now (0: none), as the driver numbers them. */
static uint64_t fk_buffer_id(void* data) {
  uint64_t (*id)(uintptr_t) = (uint64_t(*)(uintptr_t))fk_sim("cudasim_buffer_id");
  return id ? id((uintptr_t)data) : 0;
}

static ncclResult_t fk_reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  struct fk_mr* m;
  (void)comm;
  if ((type != NET_ABI_PTR_HOST && !(type == NET_ABI_PTR_CUDA && fk_cuda())) ||
      fault(FAULT_REGMR) || fk_too_big(size) || (m = calloc(1, sizeof(*m))) == NULL)
    return ncclSystemError;
  if (type == NET_ABI_PTR_CUDA) atomic_fetch_add(&g_cuda_regs, 1);
  *m = (struct fk_mr){FAKENET_MAGIC, type == NET_ABI_PTR_CUDA, data, size,
                      type == NET_ABI_PTR_CUDA ? fk_buffer_id(data) : 0};
  *mhandle = m;
  return ncclSuccess;
}

static ncclResult_t fk_dereg_mr(void* comm, void* mhandle) {
  struct fk_mr* m = mhandle;
  (void)comm;
  if (m == NULL || m->magic != FAKENET_MAGIC) return ncclInvalidArgument;
  m->magic = 0;
  free(m);
  return ncclSuccess;
}

/* ---- messages ---- */

/* A buffer the NIC may touch: inside its registration. */
static int fk_covered(const struct fk_mr* m, const char* p, size_t n) {
  return m && m->magic == FAKENET_MAGIC && p >= m->base && p + n <= m->base + m->size;
}

static ncclResult_t fk_post(struct fk_comm* c, int is_send, void* data, size_t size, void* mhandle,
                            void** request) {
  const struct fk_mr* m = mhandle;
  *request = NULL;
  if (!fk_covered(m, data, size)) {
    fprintf(stderr, "fakenet: %zu bytes at %p outside their registration\n", size, data);
    return ncclSystemError;
  }
  if (m->cuda && size > 0 && fk_buffer_id(data) != m->buffer_id) {
    fprintf(stderr, "fakenet: %p lies in another allocation than the one registered\n", data);
    return ncclSystemError; /* a real NIC would move the freed allocation's pages */
  }
  if (m->cuda && size > 0 && (data = fk_dma(data, size)) == NULL) {
    fprintf(stderr, "fakenet: device memory the NIC cannot reach\n");
    return ncclSystemError;
  }
  if (c->count == FAKENET_MAX_REQS) return ncclSuccess; /* full: try again */
  struct fk_req* r = &c->reqs[(c->head + c->count++) % FAKENET_MAX_REQS];
  *r = (struct fk_req){c, 1, is_send, data, size, 0, size, 0};
  *request = r;
  if (m->cuda)
    atomic_fetch_add(&g_cuda_bytes, (long)size);
  else if (size > FAKENET_FRAME_MAX)
    atomic_fetch_add(&g_host_bytes, (long)size);
  return ncclSuccess;
}

static ncclResult_t fk_isend_any(void* comm, void* data, size_t size, void* mhandle,
                                 void** request) {
  struct fk_comm* c = comm;
  if (!c->is_send || fault(FAULT_ISEND)) return ncclSystemError;
  if (fault(FAULT_DIE)) shutdown(c->fd, SHUT_RDWR); /* the link dies under this message */
  return fk_post(c, 1, data, size, mhandle, request);
}

static ncclResult_t fk_irecv_any(void* comm, int n, void** data, size_t size, void** mhandles,
                                 void** request) {
  struct fk_comm* c = comm;
  if (c->is_send || n != 1 || fault(FAULT_IRECV)) return ncclSystemError;
  return fk_post(c, 0, data[0], size, mhandles[0], request);
}

/* Move the head request's bytes: 1 when it completed, 0 when it would
 * block, -1 on an error. */
static int fk_step(struct fk_req* r) {
  struct fk_comm* c = r->comm;
  while (r->done < 8 + r->len) {
    ssize_t n;
    if (r->done < 8) {
      char* lenp = (char*)&r->len + r->done;
      n = r->is_send ? send(c->fd, lenp, 8 - r->done, MSG_NOSIGNAL | MSG_DONTWAIT)
                     : recv(c->fd, lenp, 8 - r->done, MSG_DONTWAIT);
      if (n > 0 && !r->is_send && r->done + (size_t)n == 8 && r->len > r->size) {
        fprintf(stderr, "fakenet: a message of %llu bytes for a receive of %zu\n",
                (unsigned long long)r->len, r->size);
        return -1;
      }
    } else {
      char* at = r->buf + (r->done - 8);
      size_t left = 8 + r->len - r->done;
      n = r->is_send ? send(c->fd, at, left, MSG_NOSIGNAL | MSG_DONTWAIT)
                     : recv(c->fd, at, left, MSG_DONTWAIT);
    }
    if (n == 0) return -1;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    r->done += (size_t)n;
  }
  return 1;
}

/* Requests complete in posting order: drive the comm's from the first
 * incomplete one until one would block. */
static ncclResult_t fk_drive(struct fk_comm* c) {
  while (c->driven < c->count) {
    struct fk_req* h = &c->reqs[(c->head + c->driven) % FAKENET_MAX_REQS];
    int s = fk_step(h);
    if (s < 0) return ncclSystemError;
    if (s == 0) break;
    h->complete = 1;
    c->driven++;
  }
  return ncclSuccess;
}

static ncclResult_t fk_test(void* request, int* done, int* sizes) {
  struct fk_req* r = request;
  struct fk_comm* c = r->comm;
  long arg;
  *done = 0;
  if (fault(FAULT_TEST)) return ncclSystemError;
  if (fault_kind(&arg) == FAULT_STALL) return ncclSuccess;
  if (fk_drive(c) != ncclSuccess) return ncclSystemError;
  if (!r->complete) return ncclSuccess;
  r->used = 0; /* tested done: free, and so is every freed one at the head */
  while (c->count > 0 && !c->reqs[c->head].used) {
    c->head = (c->head + 1) % FAKENET_MAX_REQS;
    c->count--;
    c->driven--;
  }
  *done = 1;
  if (sizes) sizes[0] = (int)r->len + (fault(FAULT_BADSIZE) ? 1 : 0);
  return ncclSuccess;
}

static ncclResult_t fk_close(void* comm) {
  struct fk_comm* c = comm;
  close(c->fd);
  free(c);
  return ncclSuccess;
}

static ncclResult_t fk_close_listen(void* listen_comm) {
  struct fk_listen* l = listen_comm;
  close(l->fd);
  free(l);
  return ncclSuccess;
}

static ncclResult_t fk_iflush(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                              void** request) {
  (void)recv_comm, (void)n, (void)data, (void)sizes, (void)mhandles;
  atomic_fetch_add(&g_flushes, 1);
  *request = NULL; /* the simulated device sees host writes at once */
  return ncclSuccess;
}

/* ---- the exported table of FAKENET_VERSION ---- */

/* Each device its own name and receive grouping, so that a report giving
 * one device's properties for another is seen. */
static char* fk_dev_name(int dev) {
  static char* const names[FAKENET_NDEVS] = {"fake0", "fake1"};
  return dev >= 0 && dev < FAKENET_NDEVS ? names[dev] : "fake?";
}

#define FK_PROPS_COMMON(p)                                                    \
  do {                                                                        \
    memset(p, 0, sizeof(*p));                                                 \
    (p)->name = fk_dev_name(dev);                                             \
    (p)->guid = 0x1234;                                                       \
    (p)->ptr_support = NET_ABI_PTR_HOST | (fk_cuda() ? NET_ABI_PTR_CUDA : 0); \
    (p)->speed_mbps = 10000;                                                  \
    (p)->latency_us = 1.0f;                                                   \
    (p)->max_comms = 65536;                                                   \
    (p)->max_recvs = 1 + 7 * (dev == 1);                                      \
    (p)->device_type = fault(FAULT_BADDEV) ? 1 : NET_ABI_DEVICE_HOST;         \
  } while (0)

#if FAKENET_VERSION == 8
static ncclResult_t v_init(net_abi_logger log) {
  (void)log;
  return fk_init();
}
static ncclResult_t v_props(int dev, struct net_abi_props_v8* p) {
  FK_PROPS_COMMON(p);
  return (dev < 0 || dev >= FAKENET_NDEVS) || fault(FAULT_PROPS) ? ncclSystemError : ncclSuccess;
}
#elif FAKENET_VERSION <= 10
#if FAKENET_VERSION == 9
static ncclResult_t v_init(net_abi_logger log) {
#else
static ncclResult_t v_init(net_abi_logger log, net_abi_profiler prof) {
  (void)prof;
#endif
  (void)log;
  return fk_init();
}
static ncclResult_t v_props(int dev, struct net_abi_props_v9* p) {
  FK_PROPS_COMMON(p);
  p->max_p2p_bytes = FAKENET_MAX_BYTES;
  p->vprops.ndevs = 1;
  return (dev < 0 || dev >= FAKENET_NDEVS) || fault(FAULT_PROPS) ? ncclSystemError : ncclSuccess;
}
#else
static ncclResult_t v_init(void** ctx, uint64_t comm_id, struct net_abi_config* config,
                           net_abi_logger log, net_abi_profiler prof) {
  (void)comm_id, (void)prof;
  if (config == NULL) return ncclInvalidArgument; /* as real plugins read it */
  (void)log;
  *ctx = calloc(1, 16);
  return *ctx ? fk_init() : ncclSystemError;
}
static ncclResult_t v_finalize(void* ctx) {
  free(ctx);
  return ncclSuccess;
}
static ncclResult_t v_props(int dev, void* props) {
#if FAKENET_VERSION == 11
  struct net_abi_props_v9* p = &((struct net_abi_props_v11*)props)->v9;
  ((struct net_abi_props_v11*)props)->max_multi_request_size = 1;
#else
  struct net_abi_props_v12* p = props;
#endif
  FK_PROPS_COMMON(p);
  p->max_p2p_bytes = FAKENET_MAX_BYTES;
  p->vprops.ndevs = 1;
  return (dev < 0 || dev >= FAKENET_NDEVS) || fault(FAULT_PROPS) ? ncclSystemError : ncclSuccess;
}
#endif

#if FAKENET_VERSION >= 11
static ncclResult_t v_listen(void* ctx, int dev, void* handle, void** listen_comm) {
  if (ctx == NULL) return ncclInvalidArgument;
  return fk_listen(dev, handle, listen_comm);
}
static ncclResult_t v_connect(void* ctx, int dev, void* handle, void** send_comm, net_abi_dh** dh) {
  (void)dh;
  if (ctx == NULL) return ncclInvalidArgument;
  return fk_connect(dev, handle, send_comm);
}
#elif FAKENET_VERSION == 10
static ncclResult_t v_connect(int dev, struct net_abi_config* config, void* handle,
                              void** send_comm, net_abi_dh** dh) {
  (void)dh;
  if (config == NULL) return ncclInvalidArgument;
  return fk_connect(dev, handle, send_comm);
}
#else
static ncclResult_t v_connect(int dev, void* handle, void** send_comm, net_abi_dh** dh) {
  (void)dh;
  return fk_connect(dev, handle, send_comm);
}
#endif
#if FAKENET_VERSION <= 10
#define v_listen fk_listen
#endif

static ncclResult_t v_accept(void* listen_comm, void** recv_comm, net_abi_dh** dh) {
  (void)dh;
  return fk_accept(listen_comm, recv_comm);
}

#if FAKENET_VERSION == 8
static ncclResult_t v_isend(void* comm, void* data, int size, int tag, void* mh, void** req) {
  (void)tag;
  return size < 0 ? ncclInvalidArgument : fk_isend_any(comm, data, (size_t)size, mh, req);
}
static ncclResult_t v_irecv(void* comm, int n, void** data, int* sizes, int* tags, void** mhs,
                            void** req) {
  (void)tags;
  return n != 1 || sizes[0] < 0 ? ncclInvalidArgument
                                : fk_irecv_any(comm, n, data, (size_t)sizes[0], mhs, req);
}
#elif FAKENET_VERSION == 9
static ncclResult_t v_isend(void* comm, void* data, size_t size, int tag, void* mh, void** req) {
  (void)tag;
  return fk_isend_any(comm, data, size, mh, req);
}
static ncclResult_t v_irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                            void** req) {
  (void)tags;
  return n != 1 ? ncclInvalidArgument : fk_irecv_any(comm, n, data, sizes[0], mhs, req);
}
#else
static ncclResult_t v_isend(void* comm, void* data, size_t size, int tag, void* mh, void* ph,
                            void** req) {
  (void)tag, (void)ph;
  return fk_isend_any(comm, data, size, mh, req);
}
static ncclResult_t v_irecv(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhs,
                            void** phs, void** req) {
  (void)tags, (void)phs;
  return n != 1 ? ncclInvalidArgument : fk_irecv_any(comm, n, data, sizes[0], mhs, req);
}
#endif

#define FK_TABLE_COMMON                                                              \
  .name = "Fake", .init = v_init, .devices = fk_devices, .get_properties = v_props,  \
  .listen = v_listen, .connect = v_connect, .accept = v_accept, .reg_mr = fk_reg_mr, \
  .dereg_mr = fk_dereg_mr, .isend = v_isend, .irecv = v_irecv, .iflush = fk_iflush,  \
  .test = fk_test, .close_send = fk_close, .close_recv = fk_close, .close_listen = fk_close_listen

#define FK_EXPORT __attribute__((visibility("default")))
#if FAKENET_VERSION == 8
FK_EXPORT const struct net_abi_v8 ncclNetPlugin_v8 = {FK_TABLE_COMMON};
#elif FAKENET_VERSION == 9
FK_EXPORT const struct net_abi_v9 ncclNetPlugin_v9 = {FK_TABLE_COMMON};
#elif FAKENET_VERSION == 10
FK_EXPORT const struct net_abi_v10 ncclNetPlugin_v10 = {FK_TABLE_COMMON};
#elif FAKENET_VERSION == 11
FK_EXPORT const struct net_abi_v11 ncclNetPlugin_v11 = {FK_TABLE_COMMON, .finalize = v_finalize};
#else
FK_EXPORT const struct net_abi_v11 ncclNetPlugin_v12 = {FK_TABLE_COMMON, .finalize = v_finalize};
#endif
