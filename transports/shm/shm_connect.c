/*
 * Shared-memory connection setup (shm_connect.h): segments made by the
 * sender and unlinked as soon as the receiver has mapped them; optionally
 * the receiver reads large messages straight from the sender's buffer
 * (process_vm_readv), where the kernel allows it and both sides ask.
 */
#include "shm_connect.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "host.h"
#include "param.h"
#include "shm.h"

#define SHM_MAGIC 0x4d485342u /* "BSHM" */
#define SHM_VERSION 4u /* 4: names keyed by the secret; 3: slots carry the call; 2: fd_sleepers */
#define SHM_PAGE 4096
/* Slot data starts half a page past a page boundary. `rep movsb`, which
 * glibc uses for copies below about the L2 size, slows down 3-6x when the
 * destination lies 1-63 bytes after the source modulo 4 KiB (AMD Zen,
 * glibc < 2.39; a known 4K-aliasing hazard). malloc'd buffers sit at page
 * offset 16, page-aligned ones at 0: with slots at 2048 neither copy, into
 * or out of a slot, comes near that distance. */
#define SHM_DATA_SKEW 2048
/* connect_recv polls for the sender's segment, backing off from this. */
#define SHM_POLL_MIN_US 100

struct shm_params {
  int64_t nslots;
  int64_t slot_bytes;
  int64_t direct_min;
};

/* The defaults (common/param_table.h) come from measurements
 * (docs/environment.md, "Shared memory"; docs/performance.md, "Measurements
 * behind the defaults"): enough slots to
 * keep 64 KiB pipeline chunks flowing, copies batched up to SHM_COPY_BATCH (shm.c)
 * so large messages need no larger slots, and direct reads off, since
 * process_vm_readv was slower than the two pipelined copies. */
static struct shm_params shm_params;
static pthread_once_t shm_params_once = PTHREAD_ONCE_INIT;

static void shm_params_read(void) {
  struct shm_params* p = &shm_params;
  p->nslots = param_shm_nslots();
  p->slot_bytes = ALIGN_UP(param_shm_slot_bytes(), SHM_LINE); /* every slot's data line-aligned */
  p->direct_min = param_shm_direct_min();
}

static const struct shm_params* shm_params_get(void) {
  pthread_once(&shm_params_once, shm_params_read);
  return &shm_params;
}

/* Segment layout: header, slot descriptors, then the slots' data. */
static size_t shm_layout(uint32_t nslots, size_t slot_bytes, size_t* slots_off, size_t* data_off) {
  *slots_off = ALIGN_UP(sizeof(struct shm_header), SHM_LINE);
  *data_off = ALIGN_UP(*slots_off + nslots * sizeof(struct shm_slot), SHM_PAGE) + SHM_DATA_SKEW;
  return ALIGN_UP(*data_off + (size_t)nslots * slot_bytes, SHM_PAGE);
}

/* Open the peer's bell pipe through /proc, so that we can wake it while it
 * sleeps in epoll. The inode check makes sure the fd number still names
 * that pipe. Without it (no /proc, or ptrace rules deny the peer's fds)
 * the peer naps and looks again instead.
 *
 * Opened for reading too, though nothing reads it here: while this end can
 * read, the pipe always has a reader, so a ring after the peer died (it
 * may die asleep, its sleeper count still raised) fills the pipe and gets
 * EAGAIN instead of EPIPE and a SIGPIPE that would kill this process. */
static void shm_bell_open(struct transport_ctx* ctx, struct shm_conn* c) {
  const struct peer_info* p = &ctx->peers[c->base.peer];
  char path[64];
  struct stat st;
  if (p->bell_ino == 0) return;
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)c->peer_pid, (int)p->bell_fd);
  int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd >= 0 && fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) &&
      (uint64_t)st.st_ino == p->bell_ino) {
    c->peer_bell = fd;
    atomic_store(&c->hdr->fd_ringable[1 - c->side], 1);
    return;
  }
  INFO(SUB_SHM | SUB_INIT,
       "SHM : cannot open rank %d's bell %s (%s): it naps while it waits for sockets too",
       c->base.peer, path, fd < 0 ? strerror(errno) : "not its pipe");
  if (fd >= 0) close(fd);
}

static ncclResult_t shm_conn_alloc(struct transport_ctx* ctx, int peer, int side, int channel,
                                   struct shm_conn** out) {
  struct shm_conn* c = NULL;
  ncclResult_t res = braid_calloc(&c, 1, sizeof(*c));
  if (res != ncclSuccess) return res;
  c->base.ops = &shm_transport;
  c->base.peer = peer;
  c->base.is_send = side == SHM_SEND;
  c->side = side;
  c->channel = channel;
  c->peer_pid = ctx->peers[peer].pid;
  c->timeout_ms = ctx->timeout_ms;
  c->waits = ctx->waits;
  c->direct = -1;
  c->peer_bell = -1;
  int sender = side == SHM_SEND ? ctx->rank : peer;
  shm_name_make(c->name, ctx->secret, ctx->peers[sender].pid,
                transport_peer_blob(ctx, &shm_transport, sender), sender,
                side == SHM_SEND ? peer : ctx->rank, channel);
  *out = c;
  return ncclSuccess;
}

static ncclResult_t shm_conn_map(struct shm_conn* c, int fd, size_t bytes) {
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    WARN("SHM : mmap of %s (%zu bytes) failed: %s", c->name, bytes, strerror(errno));
    return ncclSystemError;
  }
  __atomic_store_n(&c->hdr, p, __ATOMIC_RELEASE); /* shm_shutdown may read it from another thread */
  c->map_bytes = bytes;
  return ncclSuccess;
}

/* The slots and data at c->nslots and c->slot_bytes: the sender's own,
 * or what the receiver checked of the header (a copy: the sender could
 * change the mapped words after the check). */
static void shm_conn_layout(struct shm_conn* c) {
  size_t slots_off, data_off;
  shm_layout(c->nslots, c->slot_bytes, &slots_off, &data_off);
  c->slots = (struct shm_slot*)((char*)c->hdr + slots_off);
  c->data = (char*)c->hdr + data_off;
}

ncclResult_t shm_connect_send(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct shm_conn* c = NULL;
  int fd = -1;
  const struct shm_params* p = shm_params_get();
  size_t slots_off, data_off;
  size_t bytes = shm_layout((uint32_t)p->nslots, (size_t)p->slot_bytes, &slots_off, &data_off);
  CHECK(shm_conn_alloc(ctx, peer, SHM_SEND, channel, &c));
  fd = shm_open(c->name, O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) FAIL(ncclSystemError, "SHM : shm_open(%s) failed: %s", c->name, strerror(errno));
  c->named = 1;
  if (ftruncate(fd, (off_t)bytes) != 0)
    FAIL(ncclSystemError, "SHM : ftruncate(%s, %zu) failed: %s", c->name, bytes, strerror(errno));
  /* Reserve the pages now: a full /dev/shm (64 MiB in a default container)
   * is then an error here instead of a SIGBUS on first touch. */
  int err = posix_fallocate(fd, 0, (off_t)bytes);
  if (err != 0)
    FAIL(ncclSystemError, "SHM : cannot reserve %zu bytes in /dev/shm for %s: %s", bytes, c->name,
         strerror(err));
  CHECK(shm_conn_map(c, fd, bytes));
  close(fd);
  fd = -1;

  struct shm_header* h = c->hdr;
  h->magic = SHM_MAGIC;
  h->version = SHM_VERSION;
  h->secret = ctx->secret;
  h->map_bytes = bytes;
  h->nslots = (uint32_t)p->nslots;
  h->slot_bytes = (uint32_t)p->slot_bytes;
  h->sender_pid = ctx->peers[ctx->rank].pid;
  h->sender_rank = ctx->rank;
  h->receiver_rank = peer;
  h->channel = channel;
  h->sender_addr = (uint64_t)(uintptr_t)h;
  c->nslots = h->nslots;
  c->slot_bytes = h->slot_bytes;
  shm_conn_layout(c);
  c->direct_min = (size_t)p->direct_min;
  shm_bell_open(ctx, c);
  atomic_store_explicit(&h->ready, 1, memory_order_release);
  INFO(SUB_SHM | SUB_INIT, "Channel %d: rank %d -> rank %d via SHM (%u slots x %zu bytes)", channel,
       ctx->rank, peer, c->nslots, c->slot_bytes);
  *out = &c->base;
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  if (c) shm_close(&c->base);
  return res;
}

/* Open and map the segment once the sender has sized it; *found says so. */
static ncclResult_t shm_segment_try_open(struct shm_conn* c, int* found) {
  ncclResult_t res = ncclSuccess;
  struct stat st;
  *found = 0;
  int fd = shm_open(c->name, O_RDWR, 0);
  if (fd < 0) {
    if (errno == ENOENT) return ncclSuccess;
    FAIL(ncclSystemError, "SHM : shm_open(%s) failed: %s", c->name, strerror(errno));
  }
  if (fstat(fd, &st) != 0) FAIL(ncclSystemError, "SHM : fstat(%s): %s", c->name, strerror(errno));
  if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) /* made by another user, or open to one */
    FAIL(ncclSystemError, "SHM : segment %s is uid %u mode %o, not this user's alone: refused",
         c->name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
  if (st.st_size < (off_t)sizeof(struct shm_header)) goto out; /* not truncated yet */
  CHECK(shm_conn_map(c, fd, (size_t)st.st_size));
  *found = 1;
out:
  close(fd);
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  return res;
}

/* The sender's part of the header, checked once: what is used after is
 * the copy, since the sender may write the mapped words at any time. */
static ncclResult_t shm_header_check(struct transport_ctx* ctx, struct shm_conn* c) {
  struct shm_header h;
  size_t slots_off, data_off;
  const char* why = NULL;
  memcpy(&h, c->hdr, offsetof(struct shm_header, ready));
  if (h.magic != SHM_MAGIC || h.version != SHM_VERSION)
    why = "not a Braid segment of this version";
  else if (h.secret != ctx->secret)
    why = "another communicator's segment";
  else if (h.sender_pid != c->peer_pid || h.sender_rank != c->base.peer ||
           h.receiver_rank != ctx->rank || h.channel != c->channel)
    why = "wrong ranks";
  else if (h.nslots < 1 || h.slot_bytes < SHM_LINE || h.slot_bytes % SHM_LINE != 0 ||
           h.map_bytes != c->map_bytes ||
           shm_layout(h.nslots, h.slot_bytes, &slots_off, &data_off) != c->map_bytes)
    why = "inconsistent layout";
  if (why) {
    WARN("SHM : segment %s from rank %d refused (%s)", c->name, c->base.peer, why);
    return ncclSystemError;
  }
  c->nslots = h.nslots;
  c->slot_bytes = h.slot_bytes;
  return ncclSuccess;
}

/* Give up on a receive connection: whatever went wrong, leave nothing
 * behind in /dev/shm. */
static void shm_recv_abandon(struct shm_conn* c) {
  if (shm_unlink(c->name) != 0 && errno != ENOENT)
    WARN("SHM : shm_unlink(%s) failed: %s", c->name, strerror(errno));
  shm_close(&c->base);
}

/* Can this process read the sender's memory? EPERM under ptrace
 * restrictions (Yama, a non-dumpable peer, a missing CAP_SYS_PTRACE). */
static int shm_direct_probe(struct shm_conn* c) {
  uint32_t v = 0;
  struct iovec local = {&v, sizeof(v)};
  struct iovec remote = {(void*)(uintptr_t)c->hdr->sender_addr, sizeof(v)};
  ssize_t n = process_vm_readv(c->peer_pid, &local, 1, &remote, 1, 0);
  if (n == (ssize_t)sizeof(v) && v == SHM_MAGIC) return 1;
  INFO(SUB_SHM | SUB_INIT, "SHM : cannot read rank %d's memory (%s): no direct reads", c->base.peer,
       n < 0 ? strerror(errno) : "wrong bytes");
  return 0;
}

/* The segment is there and ready: check it, map its layout, say we are
 * attached and unlink its name. On failure c is closed and its name gone. */
static ncclResult_t shm_recv_attach(struct transport_ctx* ctx, struct shm_conn* c) {
  ncclResult_t res = ncclSuccess;
  CHECK(shm_header_check(ctx, c));
  shm_conn_layout(c);
  struct shm_header* h = c->hdr;
  /* Direct reads copy from where the sender's slot says, in the process
   * the peer table names: only where this side asked for them too, and
   * never from this very process (a peer naming our pid would make us
   * copy our own memory into the receive). */
  c->direct_allowed =
      shm_params_get()->direct_min > 0 && c->peer_pid != getpid() && shm_direct_probe(c);
  atomic_store_explicit(&h->direct_ok, (uint32_t)c->direct_allowed, memory_order_relaxed);
  atomic_store_explicit(&h->receiver_pid, (int32_t)getpid(), memory_order_relaxed);
  shm_bell_open(ctx, c);
  atomic_store_explicit(&h->attached, 1, memory_order_release);
  /* Both sides have it mapped: nothing needs the name any more. */
  if (shm_unlink(c->name) != 0 && errno != ENOENT)
    WARN("SHM : shm_unlink(%s) failed: %s", c->name, strerror(errno));
  INFO(SUB_SHM | SUB_INIT, "Channel %d: rank %d <- rank %d via SHM (%u slots x %zu bytes%s)",
       c->channel, ctx->rank, c->base.peer, c->nslots, c->slot_bytes,
       atomic_load(&h->direct_ok) ? ", direct reads allowed" : "");
  return ncclSuccess;
fail:
  shm_recv_abandon(c);
  return res;
}

/* One look for the sender's segment: *ready once it is mapped and ready. */
static ncclResult_t shm_recv_look(struct shm_conn* c, int* ready) {
  int found = c->hdr != NULL;
  *ready = 0;
  if (!found) {
    ncclResult_t res = shm_segment_try_open(c, &found);
    if (res != ncclSuccess) return res;
  }
  *ready = found && atomic_load_explicit(&c->hdr->ready, memory_order_acquire);
  return ncclSuccess;
}

ncclResult_t shm_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct shm_conn* c = NULL;
  uint64_t deadline = braid_now_ns() + (uint64_t)MAX(ctx->timeout_ms, 0) * 1000000ull;
  unsigned sleep_us = SHM_POLL_MIN_US;
  int ready = 0;
  CHECK(shm_conn_alloc(ctx, peer, SHM_RECV, channel, &c));
  /* The sender creates the segment in its connect_send, which never waits
   * for us: poll for it, giving up when the sender is gone. */
  for (;;) {
    CHECK(shm_recv_look(c, &ready));
    if (ready) break;
    if (ctx->aborted && atomic_load(ctx->aborted))
      FAIL(ncclSystemError, "SHM : communicator aborted while waiting for rank %d's segment", peer);
    if (!shm_pid_alive(c->peer_pid))
      FAIL(ncclRemoteError, "SHM : peer rank %d (pid %d) exited before connecting", peer,
           (int)c->peer_pid);
    if (braid_now_ns() >= deadline)
      FAIL(ncclSystemError,
           "SHM : timeout waiting for rank %d's segment %s (BRAID_TIMEOUT_MS=%lld)", peer, c->name,
           (long long)ctx->timeout_ms);
    usleep(sleep_us);
    sleep_us = MIN(sleep_us * 2, SHM_POLL_MAX_US);
  }
  res = shm_recv_attach(ctx, c); /* closes c itself on failure */
  if (res == ncclSuccess) *out = &c->base;
  return res;
fail:
  if (c) shm_recv_abandon(c);
  return res;
}

ncclResult_t shm_connect_recv_try(struct transport_ctx* ctx, int peer, int channel,
                                  struct transport_conn** inout) {
  ncclResult_t res = ncclSuccess;
  struct shm_conn* c = (struct shm_conn*)*inout;
  int ready = 0;
  if (c == NULL) {
    CHECK(shm_conn_alloc(ctx, peer, SHM_RECV, channel, &c));
    *inout = &c->base;
  }
  CHECK(shm_recv_look(c, &ready));
  if (ready) {
    *inout = NULL; /* attach closes c itself on failure */
    CHECK(shm_recv_attach(ctx, c));
    *inout = &c->base;
    return ncclSuccess;
  }
  if (!shm_pid_alive(c->peer_pid))
    FAIL(ncclRemoteError, "SHM : peer rank %d (pid %d) exited before connecting", peer,
         (int)c->peer_pid);
  return ncclInProgress;
fail:
  if (*inout) shm_recv_abandon((struct shm_conn*)*inout);
  *inout = NULL;
  return res;
}

/* Ranks of one host and shared-memory domain (the same /dev/shm and pid
 * namespace); a rank with NCCL_SHM_DISABLE=1 announced domain 0. */
int shm_can_connect(const struct transport_ctx* ctx, int a, int b) {
  const struct shm_blob *ba = transport_peer_blob(ctx, &shm_transport, a),
                        *bb = transport_peer_blob(ctx, &shm_transport, b);
  return ba->domain != 0 && ctx->peers[a].host_hash == ctx->peers[b].host_hash &&
         ba->domain == bb->domain;
}

/* This rank's domain and segment tag; its first comm also sweeps what
 * dead processes of the domain left in /dev/shm. */
ncclResult_t shm_blob_make(struct transport_ctx* ctx, void* blob) {
  struct shm_blob* b = blob;
  (void)ctx;
  b->domain = param_shm_disable() ? 0 : host_shm_domain();
  b->tag = host_random64();
  transport_shm_sweep(b->domain);
  return ncclSuccess;
}
