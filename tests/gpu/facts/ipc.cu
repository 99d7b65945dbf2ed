/*
 * Cross-process device memory on one GPU, the CUDA IPC transport's facts:
 * a cuMem allocation exported as a POSIX file descriptor (passed over a unix
 * socket, and fetched with pidfd_getfd), a legacy cuIpcGetMemHandle
 * allocation, and an interprocess event ordering a second process's stream
 * after the first's kernel. The processes fork before CUDA starts.
 */
#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "facts.h"

#define BYTES (2u << 20)
#define WORDS 1024u

struct msg {
  int kind; /* 1 vmm fd, 2 legacy handle, 3 event handle, 4 reply */
  int fd_number;
  int status; /* reply: 0 ok, else which check failed */
  unsigned seen;
  double import_us;
  CUipcMemHandle mem;
  CUipcEventHandle ev;
};

/* A message header over one struct msg, with room for one descriptor. */
static void msg_header(struct msghdr* h, struct iovec* iov, char* ctl, size_t ctl_len) {
  memset(h, 0, sizeof *h);
  memset(ctl, 0, ctl_len);
  h->msg_iov = iov;
  h->msg_iovlen = 1;
  h->msg_control = ctl;
  h->msg_controllen = ctl_len;
}

/* Sends m, and fd with it (SCM_RIGHTS) when fd >= 0. */
static void send_msg(int sock, const struct msg* m, int fd) {
  struct iovec iov = {(void*)m, sizeof *m};
  char ctl[CMSG_SPACE(sizeof(int))];
  struct msghdr h;
  msg_header(&h, &iov, ctl, sizeof ctl);
  if (fd >= 0) {
    struct cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  } else {
    h.msg_control = NULL;
    h.msg_controllen = 0;
  }
  if (sendmsg(sock, &h, 0) != (ssize_t)sizeof *m) {
    perror("sendmsg");
    exit(2);
  }
}

/* Receives one message; returns the descriptor that came with it, or -1. */
static int recv_msg(int sock, struct msg* m) {
  struct iovec iov = {(void*)m, sizeof *m};
  char ctl[CMSG_SPACE(sizeof(int))];
  struct msghdr h;
  msg_header(&h, &iov, ctl, sizeof ctl);
  if (recvmsg(sock, &h, MSG_WAITALL) != (ssize_t)sizeof *m) {
    perror("recvmsg");
    exit(2);
  }
  struct cmsghdr* c = CMSG_FIRSTHDR(&h);
  int fd = -1;
  if (c && c->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

static unsigned first_word(CUdeviceptr p) {
  unsigned w = 0;
  CU(cuMemcpyDtoH(&w, p, sizeof w));
  return w;
}

static CUmemAllocationProp fd_prop(int dev) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

/* Reserve, map and open for read/write an imported or created handle. */
static CUdeviceptr map_handle(CUmemGenericAllocationHandle h, int dev) {
  CUdeviceptr p;
  CUmemAccessDesc acc;
  memset(&acc, 0, sizeof acc);
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU(cuMemAddressReserve(&p, BYTES, 0, 0, 0));
  CU(cuMemMap(p, BYTES, 0, h, 0));
  CU(cuMemSetAccess(p, BYTES, &acc, 1));
  return p;
}

__global__ void spin_then_write(unsigned* p, unsigned v, long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  p[0] = v;
}

#define BW_BYTES (1ull << 30)

/* Device-to-device copy bandwidth, bytes read plus written per second, from
 * a buffer another process exported into one of ours, against a copy
 * between two of our own: what the CUDA IPC transport can reach on one GPU. */
static double copy_gbps(CUdeviceptr dst, CUdeviceptr src, CUstream s) {
  CUevent a, b;
  CU(cuEventCreate(&a, 0));
  CU(cuEventCreate(&b, 0));
  CU(cuMemcpyDtoDAsync(dst, src, BW_BYTES, s)); /* warm-up */
  CU(cuEventRecord(a, s));
  for (int i = 0; i < 10; i++) CU(cuMemcpyDtoDAsync(dst, src, BW_BYTES, s));
  CU(cuEventRecord(b, s));
  CU(cuEventSynchronize(b));
  float ms = 0;
  CU(cuEventElapsedTime(&ms, a, b));
  CU(cuEventDestroy(a));
  CU(cuEventDestroy(b));
  return 2.0 * BW_BYTES * 10 / (ms / 1e3) / 1e9;
}

static void measure_copy_bandwidth(CUipcMemHandle h, CUstream s, struct msg* r) {
  CUdeviceptr peer = 0, mine, mine2;
  if (cuIpcOpenMemHandle(&peer, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS) {
    r->status = 600;
    return;
  }
  CU(cuMemAlloc(&mine, BW_BYTES));
  CU(cuMemAlloc(&mine2, BW_BYTES));
  CU(cuMemsetD32(mine2, 0x3f800000u, BW_BYTES / 4));
  double from_peer = copy_gbps(mine, peer, s), to_peer = copy_gbps(peer, mine, s),
         local = copy_gbps(mine, mine2, s);
  printf(
      "ipc copy bandwidth (1 GiB, read+write bytes): from the peer's buffer %.0f GB/s, into it "
      "%.0f GB/s, "
      "between two own buffers %.0f GB/s\n",
      from_peer, to_peer, local);
  fflush(stdout);
  CU(cuMemFree(mine));
  CU(cuMemFree(mine2));
  CU(cuIpcCloseMemHandle(peer));
}

/* The importer: opens each handle, checks the exporter's pattern, writes its
 * own and replies. */
static int child(int sock) {
  struct msg m, r;
  RT(cudaFree(0));
  int clk = 0;
  RT(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0));

  /* 1: the cuMem fd, over SCM_RIGHTS, and again through pidfd_getfd. */
  int fd = recv_msg(sock, &m);
  memset(&r, 0, sizeof r);
  r.kind = 4;
  double t0 = now_us();
  CUmemGenericAllocationHandle h;
  CUresult e =
      cuMemImportFromShareableHandle(&h, (void*)(long)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (e != CUDA_SUCCESS) {
    r.status = 100 + (int)e;
  } else {
    CUdeviceptr p = map_handle(h, 0);
    r.import_us = now_us() - t0;
    r.seen = first_word(p);
    CU(cuMemsetD32(p, 0xC1D0C1D0u, WORDS));
    CU(cuCtxSynchronize());
    CU(cuMemUnmap(p, BYTES));
    CU(cuMemAddressFree(p, BYTES));
    CU(cuMemRelease(h));
  }
  close(fd);
  send_msg(sock, &r, -1);

  recv_msg(sock, &m); /* pidfd_getfd of the exporter's own descriptor number */
  memset(&r, 0, sizeof r);
  r.kind = 4;
  int pidfd = (int)syscall(SYS_pidfd_open, getppid(), 0);
  int fd2 = pidfd >= 0 ? (int)syscall(SYS_pidfd_getfd, pidfd, m.fd_number, 0) : -1;
  if (fd2 < 0) {
    r.status = 200 + errno;
  } else if (cuMemImportFromShareableHandle(
                 &h, (void*)(long)fd2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != CUDA_SUCCESS) {
    r.status = 300;
  } else {
    CUdeviceptr p = map_handle(h, 0);
    r.seen = first_word(p);
    CU(cuMemUnmap(p, BYTES));
    CU(cuMemAddressFree(p, BYTES));
    CU(cuMemRelease(h));
  }
  if (fd2 >= 0) close(fd2);
  if (pidfd >= 0) close(pidfd);
  send_msg(sock, &r, -1);

  /* 2: the legacy handle. */
  recv_msg(sock, &m);
  memset(&r, 0, sizeof r);
  r.kind = 4;
  CUdeviceptr lp = 0;
  t0 = now_us();
  e = cuIpcOpenMemHandle(&lp, m.mem, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  r.import_us = now_us() - t0;
  if (e != CUDA_SUCCESS) {
    r.status = 400 + (int)e;
    send_msg(sock, &r, -1);
    return 1;
  }
  r.seen = first_word(lp);
  CU(cuMemsetD32(lp, 0xB0B0B0B0u, WORDS));
  CU(cuCtxSynchronize());
  send_msg(sock, &r, -1);

  /* 3: the event: a kernel here spins 100 ms then writes; the exporter's
   * stream waits on the event recorded after it. */
  recv_msg(sock, &m);
  memset(&r, 0, sizeof r);
  r.kind = 4;
  CUevent ev;
  e = cuIpcOpenEventHandle(&ev, m.ev);
  if (e != CUDA_SUCCESS) {
    r.status = 500 + (int)e;
    send_msg(sock, &r, -1);
    return 1;
  }
  CUstream s;
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  spin_then_write<<<1, 1, 0, (cudaStream_t)s>>>((unsigned*)lp, 0xE7E7E7E7u, (long long)clk * 100);
  LAUNCHED();
  CU(cuEventRecord(ev, s));
  send_msg(sock, &r, -1); /* recorded, not finished */
  CU(cuStreamSynchronize(s));
  recv_msg(sock, &m); /* the exporter has read: now the bandwidth phase */
  memset(&r, 0, sizeof r);
  r.kind = 4;
  measure_copy_bandwidth(m.mem, s, &r);
  send_msg(sock, &r, -1);
  recv_msg(sock, &m); /* done; now close */
  CU(cuIpcCloseMemHandle(lp));
  CU(cuEventDestroy(ev));
  CU(cuStreamDestroy(s));
  return 0;
}

static void parent(int sock, pid_t pid) {
  struct msg m, r;
  RT(cudaFree(0));
  CUdevice dev;
  CU(cuCtxGetDevice(&dev));

  /* 1: cuMem with a POSIX fd. */
  CUmemAllocationProp prop = fd_prop(dev);
  size_t gran = 0;
  CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  FACT("cuMem granularity (minimum)", "%zu bytes", gran);
  CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  FACT("cuMem granularity (recommended)", "%zu bytes", gran);
  CUmemGenericAllocationHandle h;
  CU(cuMemCreate(&h, BYTES, &prop, 0));
  CUdeviceptr p = map_handle(h, dev);
  CU(cuMemsetD32(p, 0xC0FFEE00u, WORDS));
  CU(cuCtxSynchronize());
  int fd = -1;
  CU(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  memset(&m, 0, sizeof m);
  m.kind = 1;
  send_msg(sock, &m, fd);
  recv_msg(sock, &r);
  FACT("cuMem POSIX fd over SCM_RIGHTS opens in a second process",
       "%s (status %d), importer saw 0x%x (want 0xc0ffee00), import+map %.1f us, importer's write "
       "seen here: 0x%x",
       r.status == 0 && r.seen == 0xC0FFEE00u ? "yes" : "NO", r.status, r.seen, r.import_us,
       first_word(p));
  m.kind = 1;
  m.fd_number = fd;
  send_msg(sock, &m, -1);
  recv_msg(sock, &r);
  FACT("cuMem POSIX fd through pidfd_getfd", "%s (status %d; 2xx = errno+200), saw 0x%x",
       r.status == 0 && r.seen == 0xC1D0C1D0u ? "yes" : "NO", r.status, r.seen);
  close(fd);
  CU(cuMemUnmap(p, BYTES));
  CU(cuMemAddressFree(p, BYTES));
  CU(cuMemRelease(h));

  /* 2: legacy IPC. */
  CUdeviceptr lp;
  CU(cuMemAlloc(&lp, BYTES));
  CU(cuMemsetD32(lp, 0xAAAA5555u, WORDS));
  CU(cuCtxSynchronize());
  memset(&m, 0, sizeof m);
  m.kind = 2;
  CU(cuIpcGetMemHandle(&m.mem, lp));
  send_msg(sock, &m, -1);
  recv_msg(sock, &r);
  FACT("legacy cuIpcGetMemHandle opens in a second process",
       "%s (status %d), importer saw 0x%x (want 0xaaaa5555), open %.1f us, importer's write seen "
       "here: 0x%x",
       r.status == 0 && r.seen == 0xAAAA5555u ? "yes" : "NO", r.status, r.seen, r.import_us,
       first_word(lp));

  /* 3: interprocess event. */
  CUevent ev;
  CU(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS));
  memset(&m, 0, sizeof m);
  m.kind = 3;
  CU(cuIpcGetEventHandle(&m.ev, ev));
  send_msg(sock, &m, -1);
  recv_msg(sock, &r);
  if (r.status == 0) {
    CUstream s;
    unsigned* hostw;
    CU(cuMemHostAlloc((void**)&hostw, 64, 0));
    CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    double t0 = now_us();
    CU(cuStreamWaitEvent(s, ev, 0));
    CU(cuMemcpyDtoHAsync(hostw, lp, 4, s));
    CU(cuStreamSynchronize(s));
    FACT("interprocess event orders this stream after the other process's kernel",
         "%s: read 0x%x (want 0xe7e7e7e7, written after a 100 ms spin), waited %.1f ms",
         hostw[0] == 0xE7E7E7E7u ? "yes" : "NO", hostw[0], (now_us() - t0) / 1000);
    CU(cuStreamDestroy(s));
    CU(cuMemFreeHost(hostw));
  } else {
    FACT("interprocess event", "open failed in the importer, status %d", r.status);
  }
  CUdeviceptr big;
  CU(cuMemAlloc(&big, BW_BYTES));
  CU(cuMemsetD32(big, 0x40000000u, BW_BYTES / 4));
  CU(cuCtxSynchronize());
  memset(&m, 0, sizeof m);
  m.kind = 5;
  CU(cuIpcGetMemHandle(&m.mem, big));
  send_msg(sock, &m, -1);
  recv_msg(sock, &r);
  if (r.status) FACT("ipc copy bandwidth", "importer failed, status %d", r.status);
  send_msg(sock, &m, -1);
  int st = 0;
  waitpid(pid, &st, 0);
  FACT("ipc importer exit", "%d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  CU(cuEventDestroy(ev));
  CU(cuMemFree(big));
  CU(cuMemFree(lp));
}

int main(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("socketpair");
    return 2;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    return child(sv[1]);
  }
  close(sv[1]);
  parent(sv[0], pid);
  return 0;
}
