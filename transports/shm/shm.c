/*
 * Shared-memory transport: one segment per (sender, receiver, channel), made by the sender and
 * unlinked as soon as the receiver has mapped it. Messages go through a ring of slots with
 * head/tail credits; optionally, large ones are read by the receiver straight from the sender's
 * buffer (process_vm_readv) where the kernel allows it, copied once instead of twice.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "host.h"
#include "mem_kind.h"
#include "param.h"
#include "shm_names.h"
#include "transport.h"

#define SHM_MAGIC 0x4d485342u /* "BSHM" */
#define SHM_VERSION 3u        /* 3: slots carry the call; 2: fd_sleepers, fd_ringable */
#define SHM_LINE 64
#define SHM_PAGE 4096
/* Slot data starts half a page past a page boundary. `rep movsb`, which
 * glibc uses for copies below about the L2 size, slows down 3-6x when the
 * destination lies 1-63 bytes after the source modulo 4 KiB (AMD Zen,
 * glibc < 2.39; a known 4K-aliasing hazard). malloc'd buffers sit at page
 * offset 16, page-aligned ones at 0: with slots at 2048 neither copy, into
 * or out of a slot, comes near that distance. */
#define SHM_DATA_SKEW 2048
/* A copy into or out of the ring spans up to this many bytes of slots that
 * are ready at once: glibc copies 1 MiB and more with its vector loop,
 * faster here than its `rep movsb` for smaller ones, while the other side
 * still gets the data in pieces it can copy in parallel. */
#define SHM_COPY_BATCH ((size_t)1 << 20)
/* A blocked connection asks the kernel whether its peer still lives at
 * most this often: a SIGKILLed peer rings no bell. */
#define SHM_ALIVE_CHECK_NS (50ull * 1000 * 1000)
/* connect_recv polls for the sender's segment, backing off to this. */
#define SHM_POLL_MIN_US 100
#define SHM_POLL_MAX_US 1000

enum { SHM_SEND = 0, SHM_RECV = 1 };
enum { SHM_SLOT_COPY = 1, SHM_SLOT_DIRECT = 2 };

/* Both processes touch these words at once: they must be lock-free. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "shared-memory counters need lock-free atomics");

/* The start of every segment. */
struct shm_header {
  /* Set by the sender before `ready`, read-only afterwards. */
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  uint64_t map_bytes;
  uint32_t nslots;
  uint32_t slot_bytes;
  int32_t sender_pid;
  int32_t sender_rank;
  int32_t receiver_rank;
  int32_t channel;
  uint64_t sender_addr; /* this header in the sender's address space: the direct-read probe */
  _Atomic uint32_t ready;
  /* Set by the receiver before `attached`. */
  _Atomic int32_t receiver_pid; /* for whoever inspects a segment */
  _Atomic uint32_t direct_ok;   /* its process_vm_readv probe of the sender worked */
  _Atomic uint32_t attached;
  _Atomic uint32_t closed[2]; /* [SHM_SEND], [SHM_RECV]: that side shut down or closed */
  /* The two sides write these concurrently: one cache line each. */
  alignas(SHM_LINE) _Atomic uint64_t head; /* slots produced */
  alignas(SHM_LINE) _Atomic uint64_t tail; /* slots consumed */
  alignas(SHM_LINE) _Atomic uint32_t bell; /* futex word, bumped after every head/tail move */
  _Atomic uint32_t sleepers;               /* threads that may sleep on bell */
  /* [side]: that side's threads asleep in epoll while blocked here (they
   * wait for sockets too), and whether the other side can ring their bell
   * pipe; then it does so after every bump while any sleep there. */
  _Atomic uint32_t fd_sleepers[2];
  _Atomic uint32_t fd_ringable[2];
};

/* What a slot holds; its own cache line so that the sender filling slot k+1
 * does not disturb the receiver reading slot k. */
struct shm_slot {
  alignas(SHM_LINE) uint32_t kind;
  uint32_t bytes;           /* copy: payload in this slot */
  uint64_t msg_bytes;       /* the whole message: checked against what the receiver posted */
  uint64_t seq;             /* message number */
  uint64_t addr;            /* direct: the message in the sender's address space */
  struct transport_tag tag; /* the call it belongs to: checked too */
};
_Static_assert(sizeof(struct shm_slot) == SHM_LINE, "one slot descriptor per cache line");

struct shm_msg {
  char* buf;
  size_t bytes;
  int direct;
  uint64_t ack; /* send, direct: complete once the tail reaches this slot count */
  struct transport_tag tag;
  int in_place; /* send: written straight into its slot (transport.h, send_space) */
  int lend;     /* receive: left in its slot for the reader (transport.h, lend_max) */
  int returned; /* receive, lent: the reader gave its slot back */
  uint64_t at;  /* receive, lent: its slot, counted as head and tail are */
};

struct shm_conn {
  struct transport_conn base;
  int side;
  int channel;
  pid_t peer_pid;
  char name[SHM_NAME_MAX];
  int named;        /* send: the name may still be in /dev/shm */
  _Atomic int shut; /* this side shut the connection down (maybe from an abort's thread) */
  int64_t timeout_ms;
  struct shm_header* hdr;
  struct shm_slot* slots;
  char* data;
  size_t map_bytes;
  uint32_t nslots;
  size_t slot_bytes;
  size_t direct_min;  /* send: 0 = never */
  int direct;         /* send: -1 until the receiver has attached, then its probe result */
  int direct_allowed; /* receive: this side's own say on direct reads (never the segment's) */
  struct transport_waits* waits;
  int peer_bell;     /* the peer's progress bell pipe, opened for writing; -1 if not */
  uint64_t head;     /* slots produced (the sender's own, the receiver's last look) */
  uint64_t tail;     /* slots freed (the receiver's own, the sender's last look) */
  uint64_t rd;       /* receive: slots read, copied out or lent; the tail stops at a lent one */
  uint64_t lent_lo;  /* receive: no message before this one is lent and not yet returned */
  uint32_t nlent;    /* receive: lent messages posted and not yet returned */
  uint64_t cur;      /* message now going through the slots */
  size_t cur_off;    /* bytes of it already moved */
  uint64_t alive_ns; /* next liveness check of the peer */
  struct shm_msg msgs[TRANSPORT_MAX_INFLIGHT];
};

struct shm_params {
  int64_t nslots;
  int64_t slot_bytes;
  int64_t direct_min;
};

/* The defaults (common/param_table.h) come from measurements
 * (docs/environment.md, "Shared memory"; docs/performance.md, "Measurements
 * behind the defaults"): enough slots to
 * keep 64 KiB pipeline chunks flowing, copies batched up to SHM_COPY_BATCH
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

/* Tell the other side that head or tail moved (or a flag changed). The
 * seq_cst bump before reading the sleeper counts pairs with the sleeper's
 * increment before its futex wait or its last look before epoll: one of
 * the two sees the other. A full pipe already holds a ring. */
static void shm_bell_ring(struct shm_conn* c) {
  struct shm_header* h = c->hdr;
  atomic_fetch_add(&h->bell, 1);
  if (atomic_load(&h->sleepers) > 0)
    syscall(SYS_futex, (uint32_t*)&h->bell, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
  if (c->peer_bell >= 0 && atomic_load(&h->fd_sleepers[1 - c->side]) > 0) {
    char one = 1;
    if (write(c->peer_bell, &one, 1) < 0) { /* EAGAIN: full, the peer wakes anyway */
    }
  }
}

/* Open the peer's bell pipe through /proc, so that we can wake it while it
 * sleeps in epoll. The inode check makes sure the fd number still names
 * that pipe. Without it (no /proc, or ptrace rules deny the peer's fds)
 * the peer naps and looks again instead. */
static void shm_bell_open(struct transport_ctx* ctx, struct shm_conn* c) {
  const struct peer_info* p = &ctx->peers[c->base.peer];
  char path[64];
  struct stat st;
  if (p->bell_ino == 0) return;
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)c->peer_pid, (int)p->bell_fd);
  int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
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
  shm_name_make(c->name, ctx->peers[sender].pid, transport_peer_blob(ctx, TRANSPORT_SHM, sender),
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

static void shm_close(struct transport_conn* base);

static ncclResult_t shm_connect_send(struct transport_ctx* ctx, int peer, int channel,
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

static ncclResult_t shm_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                                     struct transport_conn** out) {
  ncclResult_t res = ncclSuccess;
  struct shm_conn* c = NULL;
  uint64_t deadline = braid_now_ns() + (uint64_t)MAX(ctx->timeout_ms, 0) * 1000000ull;
  unsigned sleep_us = SHM_POLL_MIN_US;
  CHECK(shm_conn_alloc(ctx, peer, SHM_RECV, channel, &c));
  /* The sender creates the segment in its connect_send, which never waits
   * for us: poll for it, giving up when the sender is gone. */
  for (;;) {
    int found = c->hdr != NULL;
    if (!found) CHECK(shm_segment_try_open(c, &found));
    if (found && atomic_load_explicit(&c->hdr->ready, memory_order_acquire)) break;
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
       channel, ctx->rank, peer, c->nslots, c->slot_bytes,
       atomic_load(&h->direct_ok) ? ", direct reads allowed" : "");
  *out = &c->base;
  return ncclSuccess;
fail:
  /* Whatever went wrong, leave nothing behind in /dev/shm. */
  if (c && shm_unlink(c->name) != 0 && errno != ENOENT)
    WARN("SHM : shm_unlink(%s) failed: %s", c->name, strerror(errno));
  if (c) shm_close(&c->base);
  return res;
}

/* A message lends from one slot (a direct read has no slot to lend), from
 * a ring that holds the receiver's TRANSPORT_LEND_SPAN messages past the
 * oldest lent one and one more; lent slots alone never fill it. */
static size_t shm_lend_max(const struct transport_conn* base) {
  const struct shm_conn* c = (const struct shm_conn*)base;
  if (c->side != SHM_RECV || c->direct_allowed || c->nslots <= TRANSPORT_LEND_SPAN ||
      c->nlent + 1 >= c->nslots)
    return 0;
  return c->slot_bytes;
}

static const void* shm_lent(const struct transport_conn* base, uint64_t seq) {
  const struct shm_conn* c = (const struct shm_conn*)base;
  const struct shm_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  return c->data + (m->at % c->nslots) * c->slot_bytes;
}

/* Free the slots read so far, up to the first one still lent, and tell
 * the sender if that moved the tail. */
static void shm_recv_free(struct shm_conn* c) {
  uint64_t tail = c->rd;
  for (; c->lent_lo < c->cur; c->lent_lo++) {
    const struct shm_msg* m = &c->msgs[c->lent_lo % TRANSPORT_MAX_INFLIGHT];
    if (m->lend && !m->returned) {
      tail = m->at;
      break;
    }
  }
  if (tail == c->tail) return;
  c->tail = tail;
  atomic_store_explicit(&c->hdr->tail, c->tail, memory_order_release);
  shm_bell_ring(c);
}

static ncclResult_t shm_lend_return(struct transport_conn* base, uint64_t seq) {
  struct shm_conn* c = (struct shm_conn*)base;
  struct shm_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  if (seq < c->lent_lo || seq >= c->cur || !m->lend || m->returned) {
    WARN("SHM : message %" PRIu64 " from rank %d is not lent", seq, base->peer);
    return ncclInternalError;
  }
  m->returned = 1;
  c->nlent--;
  shm_recv_free(c);
  return ncclSuccess;
}

/* The slot the next message goes into, if it is free and nothing is
 * queued before it. */
static void* shm_send_space(struct transport_conn* base, size_t bytes) {
  struct shm_conn* c = (struct shm_conn*)base;
  if (c->side != SHM_SEND || c->cur != base->posted || bytes > c->slot_bytes) return NULL;
  c->tail = atomic_load_explicit(&c->hdr->tail, memory_order_acquire);
  if (c->head - c->tail >= c->nslots) return NULL;
  return c->data + (c->head % c->nslots) * c->slot_bytes;
}

static ncclResult_t shm_post(struct transport_conn* base, const struct transport_buf* b,
                             const struct transport_tag* tag) {
  struct shm_conn* c = (struct shm_conn*)base;
  uint64_t seq = base->posted;
  if (!transport_moves(base, b)) return ncclInternalError;
  if (seq - base->completed >= TRANSPORT_MAX_INFLIGHT) {
    WARN("SHM : too many messages in flight %s rank %d", c->side == SHM_SEND ? "to" : "from",
         base->peer);
    return ncclInternalError;
  }
  if (c->side == SHM_SEND &&
      atomic_load_explicit(&c->hdr->closed[SHM_RECV], memory_order_acquire)) {
    WARN("SHM : rank %d closed its receiving connection (it failed or aborted)", base->peer);
    return ncclRemoteError;
  }
  if (c->side == SHM_RECV && seq - c->lent_lo >= TRANSPORT_MAX_INFLIGHT) {
    WARN("SHM : too many messages from rank %d in flight while message %" PRIu64 " is lent",
         base->peer, c->lent_lo);
    return ncclInternalError;
  }
  size_t lend_max = b->lend ? shm_lend_max(base) : 0;
  if (b->lend && (lend_max == 0 || b->bytes > lend_max)) {
    WARN("SHM : cannot lend a %zu-byte message from rank %d", b->bytes, base->peer);
    return ncclInternalError;
  }
  if (b->in_place && b->ptr != shm_send_space(base, b->bytes)) {
    WARN("SHM : a %zu-byte message to rank %d is not in the slot it goes into", b->bytes,
         base->peer);
    return ncclInternalError;
  }
  struct shm_msg* m = &c->msgs[seq % TRANSPORT_MAX_INFLIGHT];
  m->buf = b->ptr;
  m->in_place = b->in_place;
  m->bytes = b->bytes;
  m->direct = 0;
  m->ack = 0;
  m->lend = b->lend;
  m->returned = 0;
  m->at = 0;
  c->nlent += (uint32_t)b->lend;
  if (tag)
    m->tag = *tag;
  else
    memset(&m->tag, 0, sizeof(m->tag));
  base->posted++;
  return ncclSuccess;
}

/* Read directly only once the receiver has attached and said it can. */
static int shm_send_direct_ok(struct shm_conn* c, size_t bytes) {
  if (c->direct_min == 0 || bytes < c->direct_min) return 0;
  if (c->direct < 0 && atomic_load_explicit(&c->hdr->attached, memory_order_acquire))
    c->direct = (int)atomic_load_explicit(&c->hdr->direct_ok, memory_order_relaxed);
  return c->direct > 0;
}

/* A copied message is done once in the slots, a direct one once the
 * receiver has released its slot: that release is the acknowledgement. */
static void shm_send_complete(struct shm_conn* c, int* moved) {
  struct transport_conn* b = &c->base;
  while (b->completed < c->cur) {
    const struct shm_msg* m = &c->msgs[b->completed % TRANSPORT_MAX_INFLIGHT];
    if (m->direct && c->tail < m->ack) break; /* the receiver still reads from it */
    b->completed++;
    *moved = 1;
  }
}

/* How many slots one copy may fill or empty at once. */
static uint32_t shm_copy_span(const struct shm_conn* c, uint64_t avail, uint64_t idx, size_t left) {
  uint64_t k = MIN(avail, c->nslots - idx);        /* up to the end of the ring */
  k = MIN(k, MAX(DIV_UP(left, c->slot_bytes), 1)); /* and of the message */
  return (uint32_t)MAX(MIN(k, MAX(SHM_COPY_BATCH / c->slot_bytes, 1)), 1);
}

/* One move of the sending side: complete what is done, then fill slots. */
static ncclResult_t shm_send_step(struct shm_conn* c, int* moved) {
  ncclResult_t res = ncclSuccess;
  struct shm_header* h = c->hdr;
  c->tail = atomic_load_explicit(&h->tail, memory_order_acquire);
  shm_send_complete(c, moved);
  uint64_t nfree = c->nslots - (c->head - c->tail);
  if (c->cur == c->base.posted || nfree == 0) return ncclSuccess;

  struct shm_msg* m = &c->msgs[c->cur % TRANSPORT_MAX_INFLIGHT];
  uint64_t idx = c->head % c->nslots;
  uint32_t k = 1;
  if (c->cur_off == 0) m->direct = !m->in_place && shm_send_direct_ok(c, m->bytes);
  if (m->in_place) { /* the writer filled slot idx (shm_send_space) */
    c->slots[idx] =
        (struct shm_slot){SHM_SLOT_COPY, (uint32_t)m->bytes, m->bytes, c->cur, 0, m->tag};
    c->cur_off = m->bytes;
  } else if (m->direct) {
    c->slots[idx] =
        (struct shm_slot){SHM_SLOT_DIRECT, 0, m->bytes, c->cur, (uintptr_t)m->buf, m->tag};
    m->ack = c->head + 1;
    c->cur_off = m->bytes;
  } else {
    size_t left = m->bytes - c->cur_off;
    k = shm_copy_span(c, nfree, idx, left);
    size_t n = MIN(left, (size_t)k * c->slot_bytes);
    CHECK(mem_copy(c->data + idx * c->slot_bytes, m->buf + c->cur_off, n));
    for (uint32_t j = 0; j < k; j++) { /* a 0-byte message still takes its one slot */
      size_t piece = MIN(c->slot_bytes, n - j * c->slot_bytes);
      c->slots[idx + j] =
          (struct shm_slot){SHM_SLOT_COPY, (uint32_t)piece, m->bytes, c->cur, 0, m->tag};
    }
    c->cur_off += n;
  }
  if (c->cur_off >= m->bytes) {
    c->cur++;
    c->cur_off = 0;
  }
  c->head += k;
  atomic_store_explicit(&h->head, c->head, memory_order_release);
  shm_bell_ring(c);
  *moved += (int)k;
  shm_send_complete(c, moved);
fail:
  return res;
}

/* Has the peer shut down, closed, or died? Unless forced, its death is
 * asked of the kernel at most every SHM_ALIVE_CHECK_NS. */
static int shm_peer_gone(struct shm_conn* c, int* dead, int force) {
  *dead = 0;
  if (atomic_load_explicit(&c->hdr->closed[!c->side], memory_order_acquire)) return 1;
  uint64_t now = braid_now_ns();
  if (!force && now < c->alive_ns) return 0;
  c->alive_ns = now + SHM_ALIVE_CHECK_NS;
  *dead = !shm_pid_alive(c->peer_pid);
  return *dead;
}

static ncclResult_t shm_recv_direct(struct shm_conn* c, struct shm_msg* m,
                                    const struct shm_slot* s) {
  size_t piece = MIN(SHM_COPY_BATCH, m->bytes - c->cur_off);
  struct iovec local = {m->buf + c->cur_off, piece};
  struct iovec remote = {(void*)(uintptr_t)(s->addr + c->cur_off), piece};
  ssize_t n = process_vm_readv(c->peer_pid, &local, 1, &remote, 1, 0);
  if (n > 0) {
    c->cur_off += (size_t)n;
    return ncclSuccess;
  }
  int err = n < 0 ? errno : EFAULT, dead = 0;
  /* A peer that failed may have freed the buffer before we read it. */
  if (err == ESRCH || shm_peer_gone(c, &dead, 1)) {
    WARN("SHM : peer rank %d (pid %d) exited or closed while its message was read", c->base.peer,
         (int)c->peer_pid);
    return ncclRemoteError;
  }
  WARN("SHM : reading %zu bytes of message %" PRIu64 " from rank %d failed: %s", piece, s->seq,
       c->base.peer, strerror(err));
  return ncclSystemError;
}

/* Does slot `idx` hold the piece of message `seq` at `off` as posted here? */
static int shm_slot_matches(const struct shm_conn* c, uint64_t idx, const struct shm_msg* m,
                            uint64_t seq, size_t off) {
  const struct shm_slot* s = &c->slots[idx];
  return s->kind == SHM_SLOT_COPY && s->seq == seq && s->msg_bytes == m->bytes &&
         s->bytes == MIN(c->slot_bytes, m->bytes - off);
}

/* One move of the receiving side: empty slots, or read directly. */
static ncclResult_t shm_recv_step(struct shm_conn* c, int* moved) {
  struct shm_header* h = c->hdr;
  struct transport_conn* b = &c->base;
  if (c->cur == b->posted) return ncclSuccess;
  if (c->rd == c->head) c->head = atomic_load_explicit(&h->head, memory_order_acquire);
  if (c->rd == c->head) return ncclSuccess;

  struct shm_msg* m = &c->msgs[c->cur % TRANSPORT_MAX_INFLIGHT];
  uint64_t idx = c->rd % c->nslots;
  const struct shm_slot* s = &c->slots[idx];
  uint32_t k = 1;
  ncclResult_t res =
      transport_check_message(b, s->seq, s->msg_bytes, &s->tag, c->cur, m->bytes, &m->tag);
  if (res != ncclSuccess) return res;
  if (s->kind == SHM_SLOT_DIRECT && !c->direct_allowed) {
    WARN("SHM : rank %d sent a direct read, which this rank did not allow", b->peer);
    return ncclInternalError;
  } else if (s->kind == SHM_SLOT_DIRECT) {
    if (c->cur_off < m->bytes && (res = shm_recv_direct(c, m, s)) != ncclSuccess) return res;
    *moved = 1;
    if (c->cur_off < m->bytes) return ncclSuccess; /* the slot stays ours until the last byte */
  } else if (m->lend) { /* at most one slot (shm_lend_max): whole once its slot is in */
    if (!shm_slot_matches(c, idx, m, c->cur, 0)) {
      WARN("SHM : bad slot from rank %d (kind %u, %u bytes) for a lent %zu-byte message", b->peer,
           s->kind, s->bytes, m->bytes);
      return ncclInternalError;
    }
    m->at = c->rd;
    c->cur_off = m->bytes;
  } else if (shm_slot_matches(c, idx, m, c->cur, c->cur_off)) {
    /* each slot's size as this side reckons it (the match said the slot
     * agrees): never a second read of what the sender may have changed */
    uint32_t span = shm_copy_span(c, c->head - c->rd, idx, m->bytes - c->cur_off);
    size_t n = MIN(c->slot_bytes, m->bytes - c->cur_off);
    for (; k < span && shm_slot_matches(c, idx + k, m, c->cur, c->cur_off + n); k++)
      n += MIN(c->slot_bytes, m->bytes - c->cur_off - n);
    if ((res = mem_copy(m->buf + c->cur_off, c->data + idx * c->slot_bytes, n)) != ncclSuccess)
      return res;
    c->cur_off += n;
  } else {
    WARN("SHM : bad slot from rank %d (kind %u, %u bytes at offset %zu of a %zu-byte message)",
         b->peer, s->kind, s->bytes, c->cur_off, m->bytes);
    return ncclInternalError;
  }
  c->rd += k;
  *moved += (int)k;
  if (c->cur_off >= m->bytes) {
    c->cur++;
    c->cur_off = 0;
    b->completed++;
  }
  shm_recv_free(c);
  return ncclSuccess;
}

static ncclResult_t shm_progress(struct transport_conn* base, int* progressed) {
  struct shm_conn* c = (struct shm_conn*)base;
  ncclResult_t res = ncclSuccess;
  uint32_t budget = c->nslots; /* slots moved per call at most: other connections wait */
  uint32_t seen = 0;
  int armed = 0, gone = 0, dead = 0, moved_any = 0;
  if (c->shut) return ncclRemoteError; /* whoever shut it down has said why */
  for (;;) {
    int moved = 0;
    if (c->side == SHM_SEND)
      CHECK(shm_send_step(c, &moved));
    else
      CHECK(shm_recv_step(c, &moved));
    if (moved) {
      *progressed = moved_any = 1;
      armed = gone = 0;
      if ((uint32_t)moved >= budget) return ncclSuccess;
      budget -= (uint32_t)moved;
      continue;
    }
    if (base->completed == base->posted) return ncclSuccess; /* idle, not blocked */
    /* Blocked. Read the bell and look once more: a move after this read
     * changes the bell, so a sleep on `seen` cannot miss it. */
    if (!armed) {
      seen = atomic_load(&c->hdr->bell);
      armed = 1;
      continue;
    }
    if (gone) {
      if (dead)
        WARN("SHM : peer rank %d (pid %d) exited", base->peer, (int)c->peer_pid);
      else
        WARN("SHM : rank %d closed its %s connection (it failed or aborted)", base->peer,
             c->side == SHM_SEND ? "receiving" : "sending");
      return ncclRemoteError;
    }
    /* What moved in this call is reported first; the next call fails. Its
     * last moves came before it went: look once more before failing. */
    if (!moved_any && shm_peer_gone(c, &dead, 0)) {
      gone = 1;
      continue;
    }
    transport_wait_on_futex(
        c->waits, &c->hdr->bell, &c->hdr->sleepers,
        atomic_load(&c->hdr->fd_ringable[c->side]) ? &c->hdr->fd_sleepers[c->side] : NULL, seen);
    return ncclSuccess;
  }
fail:
  return res;
}

/* The peer sees the flag at its next blocked look, woken by the bell. */
static void shm_shutdown(struct transport_conn* base) {
  struct shm_conn* c = (struct shm_conn*)base;
  struct shm_header* hdr = __atomic_load_n(&c->hdr, __ATOMIC_ACQUIRE);
  atomic_store(&c->shut, 1);
  if (hdr == NULL) return;
  atomic_store_explicit(&hdr->closed[c->side], 1, memory_order_release);
  shm_bell_ring(c);
}

/* A send is complete once its bytes are in the slots, and the process may
 * destroy its comm and exit right after: a graceful close (no shutdown
 * came first) waits until the receiver has taken every slot, or closed, or
 * died, so nothing sent is lost with the segment. Bounded by the timeout. */
static void shm_send_drain(struct shm_conn* c) {
  uint64_t deadline = braid_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
  int dead;
  if (c->side != SHM_SEND || c->shut || c->hdr == NULL) return;
  while (atomic_load_explicit(&c->hdr->tail, memory_order_acquire) < c->head) {
    if (shm_peer_gone(c, &dead, 1)) return;
    if (braid_now_ns() >= deadline) {
      WARN("SHM : closing with %" PRIu64 " slots rank %d never took (BRAID_TIMEOUT_MS=%lld)",
           c->head - atomic_load(&c->hdr->tail), c->base.peer, (long long)c->timeout_ms);
      return;
    }
    usleep(SHM_POLL_MAX_US);
  }
}

static void shm_close(struct transport_conn* base) {
  struct shm_conn* c = (struct shm_conn*)base;
  shm_send_drain(c);
  if (c->hdr) {
    atomic_store_explicit(&c->hdr->closed[c->side], 1, memory_order_release);
    shm_bell_ring(c);
    munmap(c->hdr, c->map_bytes);
  }
  if (c->peer_bell >= 0) close(c->peer_bell);
  /* The receiver unlinks when it attaches; this covers one that never did. */
  if (c->named && shm_unlink(c->name) != 0 && errno != ENOENT)
    WARN("SHM : shm_unlink(%s) failed: %s", c->name, strerror(errno));
  free(c);
}

/* Ranks of one host and shared-memory domain (the same /dev/shm and pid
 * namespace); a rank with NCCL_SHM_DISABLE=1 announced domain 0. */
static int shm_can_connect(const struct transport_ctx* ctx, int a, int b) {
  const struct shm_blob *ba = transport_peer_blob(ctx, TRANSPORT_SHM, a),
                        *bb = transport_peer_blob(ctx, TRANSPORT_SHM, b);
  return ba->domain != 0 && ctx->peers[a].host_hash == ctx->peers[b].host_hash &&
         ba->domain == bb->domain;
}

/* This rank's domain and segment tag; its first comm also sweeps what
 * dead processes of the domain left in /dev/shm. */
static ncclResult_t shm_blob_make(struct transport_ctx* ctx, void* blob) {
  struct shm_blob* b = blob;
  (void)ctx;
  b->domain = param_shm_disable() ? 0 : host_shm_domain();
  b->tag = host_random64();
  transport_shm_sweep(b->domain);
  return ncclSuccess;
}

const struct transport shm_transport = {
    .name = "SHM",
    .id = TRANSPORT_SHM,
    .caps = TRANSPORT_CAP_HOST_MEM | TRANSPORT_CAP_WAKE_FUTEX,
    .can_connect = shm_can_connect,
    .blob_bytes = sizeof(struct shm_blob),
    .blob_make = shm_blob_make,
    .connect_send = shm_connect_send,
    .connect_recv = shm_connect_recv,
    .post = shm_post,
    .lend_max = shm_lend_max,
    .send_space = shm_send_space,
    .lent = shm_lent,
    .lend_return = shm_lend_return,
    .progress = shm_progress,
    .shutdown = shm_shutdown,
    .close = shm_close,
};
