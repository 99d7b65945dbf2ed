/*
 * The shared-memory transport between two forked processes: data through the slot ring with
 * wrap-around and credits, lent receives, sends in place, direct reads on and off, and every
 * way a peer can fail.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core.h"
#include "host.h"
#include "shm/shm_names.h"
#include "transport.h"
#include "transport_table.h"

/* No wait in these tests lasts longer: a hang fails instead of stalling. */
#define DEADLINE_MS 30000
#define SLOT 4096
#define WINDOW 8

enum { SENDER = 0, RECEIVER = 1 };

/* What the parent and both children share: the peer table, and flags that
 * order the steps of a test across processes. */
struct pair_shared {
  struct peer_info peers[2];
  _Atomic int table_ready;
  _Atomic int flag[8];
};

static struct pair_shared* sh;
static int g_mode; /* the variant of a parametrized test, set before fork */
static uint64_t child_deadline;
static struct transport_waits child_waits;
static _Atomic int child_aborted;
/* How long a blocked child sleeps at most: short where it must notice a
 * dead peer (nothing wakes it then), long where only a lost wake-up could
 * make it sleep that long, so that one shows as a stall. */
static long child_sleep_ns = 20 * 1000 * 1000;

/* ---- the children's side: no cmocka here, a failure exits non-zero */

static void child_fail(int line, const char* what) {
  fprintf(stderr, "test_shm.c:%d: child %d: check failed: %s\n", line, (int)getpid(), what);
  _exit(1);
}
#define CHILD_CHECK(cond)                     \
  do {                                        \
    if (!(cond)) child_fail(__LINE__, #cond); \
  } while (0)

static void flag_set(int i, int v) {
  atomic_store(&sh->flag[i], v);
}

static void flag_wait(int i, int v) {
  while (atomic_load(&sh->flag[i]) < v) {
    CHILD_CHECK(braid_now_ns() < child_deadline);
    usleep(200);
  }
}

/* Parameters are read once per process, so each child sets its own. */
static void child_params(const char* nslots, const char* slot_bytes, const char* direct_min) {
  setenv("BRAID_SHM_NSLOTS", nslots, 1);
  setenv("BRAID_SHM_SLOT_BYTES", slot_bytes, 1);
  setenv("BRAID_SHM_DIRECT_MIN", direct_min, 1);
}

static void child_ctx(int rank, struct transport_ctx* ctx) {
  child_deadline = braid_now_ns() + DEADLINE_MS * 1000000ull;
  while (!atomic_load(&sh->table_ready)) usleep(100);
  memset(ctx, 0, sizeof(*ctx));
  ctx->rank = rank;
  ctx->nranks = 2;
  ctx->secret = 0x5eedf00dull;
  ctx->peers = sh->peers;
  ctx->listen_fd = -1;
  ctx->epoll_fd = -1;
  ctx->timeout_ms = DEADLINE_MS;
  ctx->aborted = &child_aborted;
  ctx->waits = &child_waits;
}

/* One pass of a progress loop like the engine's: progress, and when the
 * connection says it is blocked, sleep on the futex word it named. */
static ncclResult_t child_step(struct transport_conn* c, int* progressed) {
  struct transport_waits* w = &child_waits;
  int dummy = 0;
  if (progressed == NULL) progressed = &dummy;
  *progressed = 0;
  w->nfutex = w->nfd = 0;
  ncclResult_t r = c->ops->progress(c, progressed);
  CHILD_CHECK(braid_now_ns() < child_deadline);
  if (r != ncclSuccess || *progressed) return r;
  if (w->nfutex > 0) {
    struct timespec ts = {child_sleep_ns / 1000000000, child_sleep_ns % 1000000000};
    atomic_fetch_add(w->futex[0].sleepers, 1);
    syscall(SYS_futex, (uint32_t*)w->futex[0].word, FUTEX_WAIT, w->futex[0].seen, &ts, NULL, 0);
    atomic_fetch_sub(w->futex[0].sleepers, 1);
  } else {
    sched_yield();
  }
  return ncclSuccess;
}

static ncclResult_t child_drive(struct transport_conn* c) {
  ncclResult_t r = ncclSuccess;
  while (r == ncclSuccess && c->completed < c->posted) r = child_step(c, NULL);
  return r;
}

static unsigned char pattern(uint64_t msg, size_t i) {
  return (unsigned char)(msg * 131u + i * 7u + (i >> 9) + 1u);
}

static void fill(unsigned char* p, size_t bytes, uint64_t msg) {
  for (size_t i = 0; i < bytes; i++) p[i] = pattern(msg, i);
}

static void verify(const unsigned char* p, size_t bytes, size_t cap, uint64_t msg) {
  for (size_t i = 0; i < bytes; i++)
    if (p[i] != pattern(msg, i)) {
      fprintf(stderr, "message %llu (%zu bytes): byte %zu is %u, expected %u\n",
              (unsigned long long)msg, bytes, i, p[i], pattern(msg, i));
      child_fail(__LINE__, "received bytes differ");
    }
  if (bytes < cap) CHILD_CHECK(p[bytes] == 0xEE); /* nothing written past the message */
}

/* Stream `n` messages of sizes size_of(i), at most WINDOW in flight, with
 * the data checked byte for byte on the receiving side. */
static void child_stream(struct transport_conn* c, int is_send, uint64_t n,
                         size_t (*size_of)(uint64_t), size_t cap) {
  unsigned char* pool[WINDOW];
  for (int i = 0; i < WINDOW; i++) CHILD_CHECK((pool[i] = malloc(cap + 1)) != NULL);
  uint64_t base = c->posted, next = 0, done = 0;
  while (done < n) {
    while (next < n && next - done < WINDOW) {
      unsigned char* b = pool[next % WINDOW];
      size_t bytes = size_of(next);
      if (is_send)
        fill(b, bytes, next);
      else
        memset(b, 0xEE, cap + 1);
      CHILD_CHECK(transport_post_host(c, b, bytes, NULL) == ncclSuccess);
      next++;
    }
    CHILD_CHECK(child_step(c, NULL) == ncclSuccess);
    for (; done < c->completed - base; done++)
      if (!is_send) verify(pool[done % WINDOW], size_of(done), cap, done);
  }
  for (int i = 0; i < WINDOW; i++) free(pool[i]);
}

static ncclResult_t child_connect(struct transport_ctx* ctx, int rank, struct transport_conn** c) {
  return rank == SENDER ? shm_transport.connect_send(ctx, RECEIVER, 0, c)
                        : shm_transport.connect_recv(ctx, SENDER, 0, c);
}

/* The usual start of a child: a ring of `nslots` slots of SLOT bytes,
 * direct reads off, connected on channel 0; with `sleep_long`, a blocked
 * side sleeps up to 2 s (only a lost wake-up would make it wait that
 * long, so that one shows as a stall). */
static struct transport_conn* child_open(int rank, const char* nslots, int sleep_long,
                                         struct transport_ctx* ctx) {
  struct transport_conn* c = NULL;
  child_params(nslots, "4096", "0");
  child_ctx(rank, ctx);
  if (sleep_long) child_sleep_ns = 2000 * 1000 * 1000l;
  CHILD_CHECK(child_connect(ctx, rank, &c) == ncclSuccess);
  return c;
}

/* ---- the parent's side */

typedef void (*child_fn)(int rank);
typedef void (*parent_fn)(pid_t pid[2]);

/* Wait for a child until the deadline; -1 (after killing it) if it hangs. */
static int child_wait(pid_t pid, uint64_t deadline) {
  int status;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r < 0) return -2;
    if (braid_now_ns() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(1000);
  }
}

/* Our segments left in /dev/shm: names start with "braid-<creator pid>-"
 * and the tag of shm domain 1 (transports/shm/shm_names.c), so that a
 * stranger's segment whose creator had one of our pids does not count. */
static int shm_leftovers(pid_t pid[2]) {
  int n = 0;
  DIR* d = opendir("/dev/shm");
  if (d == NULL) return 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL)
    for (int r = 0; r < 2; r++) {
      char prefix[32];
      snprintf(prefix, sizeof(prefix), "braid-%d-00000001-", (int)pid[r]);
      if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
        fprintf(stderr, "left behind: /dev/shm/%s\n", e->d_name);
        n++;
      }
    }
  closedir(d);
  return n;
}

/* Fork the sender and the receiver, give them the peer table, let the
 * parent act in between if asked, and expect both to exit cleanly, but for
 * a `victim` the parent kills (-1: none). The survivor is waited for first
 * so that a victim the parent left unreaped stays a zombie meanwhile. */
static int g_victim_reaped;

static void pair_run(child_fn sender, child_fn receiver, parent_fn parent, int victim) {
  child_fn fn[2] = {sender, receiver};
  pid_t pid[2];
  sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  assert_true(sh != MAP_FAILED);
  g_victim_reaped = 0;
  for (int r = 0; r < 2; r++) {
    pid[r] = fork();
    assert_true(pid[r] >= 0);
    if (pid[r] == 0) {
      fn[r](r);
      _exit(0);
    }
  }
  for (int r = 0; r < 2; r++) {
    sh->peers[r].rank = r;
    sh->peers[r].pid = pid[r];
    sh->peers[r].host_hash = 1;
    *(struct shm_blob*)transport_blob_put(&sh->peers[r], &shm_transport) =
        (struct shm_blob){.domain = 1, .tag = host_random64()};
  }
  atomic_store(&sh->table_ready, 1);
  if (parent) parent(pid);
  uint64_t deadline = braid_now_ns() + (DEADLINE_MS + 10000) * 1000000ull;
  int rc[2] = {0, 0};
  int first = victim == SENDER ? RECEIVER : SENDER;
  rc[first] = child_wait(pid[first], deadline);
  if (!(victim == !first && g_victim_reaped)) rc[!first] = child_wait(pid[!first], deadline);
  int left = shm_leftovers(pid);
  munmap(sh, sizeof(*sh));
  for (int r = 0; r < 2; r++)
    assert_int_equal(rc[r], r == victim && !g_victim_reaped ? 128 + SIGKILL : 0);
  assert_int_equal(left, 0);
}

/* ---- wrap-around: sizes around the slot size, far more than the ring holds */

static size_t wrap_size(uint64_t i) {
  static const size_t sizes[] = {
      0, 1, 7, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT, 3 * SLOT + 5, 12345, 2, 2 * SLOT, 65536 + 17};
  return sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
}

static void wrap_child(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = child_open(rank, "4", 1, &ctx);
  child_stream(c, rank == SENDER, 600, wrap_size, 65536 + 17); /* ~5 MB through a 16 KiB ring */
  c->ops->close(c);
}

static void test_wraparound(void** state) {
  (void)state;
  pair_run(wrap_child, wrap_child, NULL, -1);
}

/* ---- credits: a full ring stalls the sender, without error, until drained */

static size_t credit_size(uint64_t i) {
  return i < 2 ? 3 * SLOT : SLOT;
}

static void credit_sender(int rank) {
  struct transport_ctx ctx;
  static unsigned char bufs[16][3 * SLOT];
  struct transport_conn* c = child_open(rank, "4", 0, &ctx);
  for (uint64_t i = 0; i < 16; i++) {
    fill(bufs[i], credit_size(i), i);
    CHILD_CHECK(transport_post_host(c, bufs[i], credit_size(i), NULL) == ncclSuccess);
  }
  /* 4 slots: message 0 (3 slots) fits, message 1 gets one slot in. */
  int progressed = 1;
  child_sleep_ns = 1000 * 1000; /* nothing wakes a stalled sender: keep the stall short */
  for (int pass = 0; pass < 100; pass++) CHILD_CHECK(child_step(c, &progressed) == ncclSuccess);
  child_sleep_ns = 20 * 1000 * 1000;
  CHILD_CHECK(c->completed == 1);
  CHILD_CHECK(progressed == 0);
  CHILD_CHECK(child_waits.nfutex == 1); /* blocked: it named what would wake it */
  flag_set(1, 1);                       /* the receiver may drain now */
  CHILD_CHECK(child_drive(c) == ncclSuccess);
  CHILD_CHECK(c->completed == 16);
  flag_wait(2, 1);
  c->ops->close(c);
}

static void credit_receiver(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = child_open(rank, "4", 0, &ctx);
  flag_wait(1, 1);
  child_stream(c, 0, 16, credit_size, 3 * SLOT);
  flag_set(2, 1);
  c->ops->close(c);
}

static void test_credits(void** state) {
  (void)state;
  pair_run(credit_sender, credit_receiver, NULL, -1);
}

/* ---- direct reads: large messages read from the sender's buffer, or not */

enum { DIRECT_ON, DIRECT_OFF_PARAM, DIRECT_OFF_PROBE };

static const unsigned char probe_marker[8] = "braidpv";

/* Can the receiver read the sender's memory? Both are forks of one
 * parent, so the marker has the same address in both. */
static int child_can_read(pid_t pid) {
  char got[sizeof(probe_marker)] = {0};
  struct iovec l = {got, sizeof(got)}, r = {(void*)probe_marker, sizeof(got)};
  return process_vm_readv(pid, &l, 1, &r, 1, 0) == (ssize_t)sizeof(got) &&
         memcmp(got, probe_marker, sizeof(got)) == 0;
}

static size_t direct_size(uint64_t i) {
  static const size_t sizes[] = {(1 << 20) + 3, 100, 65536, 65535, (5 << 20) + 1, 0, 300000};
  return sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
}

static void direct_child(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = NULL;
  child_params("4", "65536", g_mode == DIRECT_OFF_PARAM ? "0" : "64K");
  if (g_mode == DIRECT_OFF_PROBE && rank == SENDER)
    CHILD_CHECK(prctl(PR_SET_DUMPABLE, 0) == 0); /* ptrace checks now refuse readers... */
  if (g_mode == DIRECT_OFF_PROBE && rank == RECEIVER) {
    /* ...that lack CAP_SYS_PTRACE, which root must drop to be refused */
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    CHILD_CHECK(syscall(SYS_capget, &h, d) == 0);
    d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    CHILD_CHECK(syscall(SYS_capset, &h, d) == 0);
  }
  child_ctx(rank, &ctx);
  CHILD_CHECK(child_connect(&ctx, rank, &c) == ncclSuccess);
  if (rank == RECEIVER) {
    /* The probe result this test expects the transport to have found. */
    int can = child_can_read(sh->peers[SENDER].pid);
    if (g_mode == DIRECT_OFF_PROBE) CHILD_CHECK(!can);
    flag_set(0, can ? 1 : 2);
    flag_wait(1, 1);
  } else {
    flag_wait(0, 1);
    /* 128 KiB fits in the 256 KiB ring: a copy completes alone, a direct
     * read waits for the receiver, which does not read yet. */
    static unsigned char b[128 << 10];
    fill(b, sizeof(b), 0);
    CHILD_CHECK(transport_post_host(c, b, sizeof(b), NULL) == ncclSuccess);
    child_sleep_ns = 1000 * 1000;
    for (int pass = 0; pass < 100; pass++) CHILD_CHECK(child_step(c, NULL) == ncclSuccess);
    child_sleep_ns = 20 * 1000 * 1000;
    int direct = g_mode == DIRECT_ON && atomic_load(&sh->flag[0]) == 1;
    if (g_mode == DIRECT_ON && !direct)
      fprintf(stderr, "note: process_vm_readv refused here, direct path not exercised\n");
    CHILD_CHECK(c->completed == (direct ? 0u : 1u));
    flag_set(1, 1);
  }
  /* Message 0 above, then a stream around the threshold, bytes checked. */
  if (rank == RECEIVER) {
    static unsigned char b[(128 << 10) + 1];
    memset(b, 0xEE, sizeof(b));
    CHILD_CHECK(transport_post_host(c, b, 128 << 10, NULL) == ncclSuccess);
    CHILD_CHECK(child_drive(c) == ncclSuccess);
    verify(b, 128 << 10, sizeof(b), 0);
  } else {
    CHILD_CHECK(child_drive(c) == ncclSuccess);
  }
  child_stream(c, rank == SENDER, 40, direct_size, (5 << 20) + 1);
  flag_set(2 + rank, 1);
  flag_wait(3 - rank, 1); /* the receiver reads from the sender's buffers: both finish first */
  c->ops->close(c);
}

static void test_direct_on(void** state) {
  (void)state;
  g_mode = DIRECT_ON;
  pair_run(direct_child, direct_child, NULL, -1);
}

static void test_direct_off_param(void** state) {
  (void)state;
  g_mode = DIRECT_OFF_PARAM;
  pair_run(direct_child, direct_child, NULL, -1);
}

static void test_direct_off_probe(void** state) {
  (void)state;
  g_mode = DIRECT_OFF_PROBE;
  pair_run(direct_child, direct_child, NULL, -1);
}

/* ---- shutdown: the other side's blocked progress fails with ncclRemoteError */

static void shutdown_child(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = NULL;
  static unsigned char b[16][SLOT];
  int victim = g_mode; /* the side that waits and must see the error */
  child_params("2", "4096", "0");
  child_ctx(rank, &ctx);
  CHILD_CHECK(child_connect(&ctx, rank, &c) == ncclSuccess);
  if (rank == victim) {
    /* Receiver: one message arrives, the next never will. Sender: more
     * messages than the ring holds. Either way: blocked, no error yet. */
    int n = rank == RECEIVER ? 2 : 6;
    for (int i = 0; i < n; i++)
      CHILD_CHECK(transport_post_host(c, b[i], SLOT, NULL) == ncclSuccess);
    while (c->completed < (rank == RECEIVER ? 1u : 2u))
      CHILD_CHECK(child_step(c, NULL) == ncclSuccess);
    for (int pass = 0; pass < 20; pass++) CHILD_CHECK(child_step(c, NULL) == ncclSuccess);
    CHILD_CHECK(child_waits.nfutex == 1);
    flag_set(0, 1);
    CHILD_CHECK(child_drive(c) == ncclRemoteError);
    flag_set(1, 1);
  } else {
    if (rank == SENDER) {
      CHILD_CHECK(transport_post_host(c, b[0], SLOT, NULL) == ncclSuccess);
      CHILD_CHECK(child_drive(c) == ncclSuccess);
    }
    flag_wait(0, 1);
    c->ops->shutdown(c);
    int progressed = 0;
    CHILD_CHECK(c->ops->progress(c, &progressed) == ncclRemoteError); /* and it stays shut */
    flag_wait(1, 1);
  }
  c->ops->close(c);
}

static void test_shutdown_sender(void** state) {
  (void)state;
  g_mode = RECEIVER;
  pair_run(shutdown_child, shutdown_child, NULL, -1);
}

static void test_shutdown_receiver(void** state) {
  (void)state;
  g_mode = SENDER;
  pair_run(shutdown_child, shutdown_child, NULL, -1);
}

/* ---- SIGKILL: the survivor's wait ends in ncclRemoteError, never a hang */

enum { KILL_RECV_WAITS, KILL_SEND_FULL, KILL_SEND_DIRECT, KILL_BEFORE_SEGMENT, KILL_BEFORE_ATTACH };

static void child_pause(void) {
  for (;;) pause();
}

static void kill_sender(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = NULL;
  static unsigned char b[8][1 << 20];
  child_params("4", "4096", g_mode == KILL_SEND_DIRECT ? "64K" : "0");
  child_ctx(rank, &ctx);
  if (g_mode == KILL_BEFORE_SEGMENT) { /* never creates its segment */
    flag_set(0, 1);
    child_pause();
  }
  CHILD_CHECK(child_connect(&ctx, rank, &c) == ncclSuccess);
  fill(b[0], SLOT, 0);
  switch (g_mode) {
    case KILL_RECV_WAITS:
    case KILL_BEFORE_ATTACH:
      CHILD_CHECK(transport_post_host(c, b[0], SLOT, NULL) == ncclSuccess);
      CHILD_CHECK(child_drive(c) == ncclSuccess);
      flag_set(0, 1);
      child_pause();
      break;
    case KILL_SEND_FULL:
    case KILL_SEND_DIRECT:
      if (g_mode == KILL_SEND_DIRECT) flag_wait(0, 1); /* attached: direct allowed now */
      for (int i = 0; i < 8; i++)
        CHILD_CHECK(transport_post_host(c, b[i], g_mode == KILL_SEND_DIRECT ? sizeof(b[i]) : SLOT,
                                        NULL) == ncclSuccess);
      for (int pass = 0; pass < 20; pass++) CHILD_CHECK(child_step(c, NULL) == ncclSuccess);
      CHILD_CHECK(c->completed < 8);
      flag_set(1, 1);
      CHILD_CHECK(child_drive(c) == ncclRemoteError);
      break;
  }
  c->ops->close(c);
}

static void kill_receiver(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = NULL;
  static unsigned char b[2][SLOT + 1];
  child_params("4", "4096", "0");
  child_ctx(rank, &ctx);
  if (g_mode == KILL_BEFORE_SEGMENT) {
    flag_wait(0, 1);
    flag_set(1, 1);
    CHILD_CHECK(child_connect(&ctx, rank, &c) == ncclRemoteError);
    return;
  }
  if (g_mode == KILL_BEFORE_ATTACH) flag_wait(2, 1); /* the parent has killed the sender */
  CHILD_CHECK(child_connect(&ctx, rank, &c) == ncclSuccess);
  switch (g_mode) {
    case KILL_RECV_WAITS:
    case KILL_BEFORE_ATTACH:
      /* What the sender wrote before it died still arrives. */
      memset(b, 0xEE, sizeof(b));
      CHILD_CHECK(transport_post_host(c, b[0], SLOT, NULL) == ncclSuccess);
      CHILD_CHECK(transport_post_host(c, b[1], SLOT, NULL) == ncclSuccess);
      while (c->completed < 1) CHILD_CHECK(child_step(c, NULL) == ncclSuccess);
      verify(b[0], SLOT, SLOT + 1, 0);
      flag_set(1, 1);
      CHILD_CHECK(child_drive(c) == ncclRemoteError);
      break;
    case KILL_SEND_FULL:
    case KILL_SEND_DIRECT:
      flag_set(0, 1);
      child_pause();
  }
  c->ops->close(c);
}

static int kill_victim(void) {
  return g_mode == KILL_SEND_FULL || g_mode == KILL_SEND_DIRECT ? RECEIVER : SENDER;
}

/* Kill the victim once the survivor waits. */
static void kill_parent(pid_t pid[2]) {
  int victim = kill_victim();
  int flag = g_mode == KILL_BEFORE_ATTACH ? 0 : 1;
  uint64_t deadline = braid_now_ns() + DEADLINE_MS * 1000000ull;
  while (atomic_load(&sh->flag[flag]) < 1 && braid_now_ns() < deadline) usleep(200);
  usleep(20000); /* let the survivor settle into its wait */
  kill(pid[victim], SIGKILL);
  /* The receiver-waits case leaves a zombie until the end: the survivor
   * must tell it from a live peer. */
  if (g_mode != KILL_RECV_WAITS) {
    int status;
    waitpid(pid[victim], &status, 0);
    g_victim_reaped = 1;
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  }
  atomic_store(&sh->flag[2], 1);
}

static void kill_run(int mode) {
  g_mode = mode;
  pair_run(kill_sender, kill_receiver, kill_parent, kill_victim());
}

static void test_kill_receiver_waits(void** state) {
  (void)state;
  kill_run(KILL_RECV_WAITS);
}
static void test_kill_sender_full(void** state) {
  (void)state;
  kill_run(KILL_SEND_FULL);
}
static void test_kill_sender_direct(void** state) {
  (void)state;
  kill_run(KILL_SEND_DIRECT);
}
static void test_kill_before_segment(void** state) {
  (void)state;
  kill_run(KILL_BEFORE_SEGMENT);
}
static void test_kill_before_attach(void** state) {
  (void)state;
  kill_run(KILL_BEFORE_ATTACH);
}

/* ---- connect and schedule mistakes */

static void misc_sender(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = NULL;
  static unsigned char b[100];
  child_params("4", "4096", "0");
  child_ctx(rank, &ctx);
  /* A segment nobody attaches is unlinked by close. */
  CHILD_CHECK(shm_transport.connect_send(&ctx, RECEIVER, 1, &c) == ncclSuccess);
  c->ops->close(c);
  /* 100 bytes where the receiver posts 200. */
  CHILD_CHECK(child_connect(&ctx, rank, &c) == ncclSuccess);
  CHILD_CHECK(transport_post_host(c, b, sizeof(b), NULL) == ncclSuccess);
  CHILD_CHECK(child_drive(c) == ncclSuccess);
  flag_wait(0, 1);
  c->ops->close(c);
}

static void misc_receiver(int rank) {
  struct transport_ctx ctx;
  static unsigned char b[200];
  struct transport_conn* c = child_open(rank, "4", 0, &ctx);
  CHILD_CHECK(transport_post_host(c, b, sizeof(b), NULL) == ncclSuccess);
  CHILD_CHECK(child_drive(c) == ncclInvalidUsage); /* "Message truncated", not internal */
  CHILD_CHECK(c->mismatch == TRANSPORT_OTHER_SIZE);
  c->ops->close(c);
  /* Nobody sends on channel 1 from now on: time out, or see the abort. */
  ctx.timeout_ms = 200;
  CHILD_CHECK(shm_transport.connect_recv(&ctx, SENDER, 1, &c) == ncclSystemError);
  ctx.timeout_ms = DEADLINE_MS;
  atomic_store(&child_aborted, 1);
  CHILD_CHECK(shm_transport.connect_recv(&ctx, SENDER, 1, &c) == ncclSystemError);
  flag_set(0, 1);
}

static void test_mismatch_timeout_abort(void** state) {
  (void)state;
  pair_run(misc_sender, misc_receiver, NULL, -1);
}

/* ---- lent receives: read in the ring, the ring held until returned */

enum { LEND_N = 40 };

static size_t lend_size(uint64_t i) {
  static const size_t sizes[] = {SLOT, 1, 3 * SLOT + 5, 0, SLOT - 1, 100};
  return sizes[i % (sizeof(sizes) / sizeof(sizes[0]))];
}

static void lend_sender(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = child_open(rank, "17", 1, &ctx);
  CHILD_CHECK(c->ops->lend_max(c) == 0); /* a sender lends nothing */
  child_stream(c, 1, LEND_N, lend_size, 3 * SLOT + 5);
  flag_wait(0, 1);
  c->ops->close(c);
}

/* Messages of at most a slot are lent, the others copied; up to three
 * lent ones are held at once and returned oldest last, so that copied
 * messages pass the held slots and the ring wraps around them. */
static void lend_receiver(int rank) {
  struct transport_ctx ctx;
  static unsigned char buf[3 * SLOT + 6];
  uint64_t held[3];
  int nheld = 0;
  struct transport_conn* c = child_open(rank, "17", 1, &ctx);
  CHILD_CHECK(c->ops->lend_max(c) == SLOT);
  struct transport_buf big = {.bytes = SLOT + 1, .mem = TRANSPORT_CAP_HOST_MEM, .lend = 1};
  CHILD_CHECK(c->ops->post(c, &big, NULL) == ncclInternalError); /* longer than a slot */
  CHILD_CHECK(c->posted == 0);
  for (uint64_t i = 0; i < LEND_N; i++) {
    size_t bytes = lend_size(i);
    int lend = bytes <= SLOT;
    struct transport_buf b = {
        .ptr = lend ? NULL : buf, .bytes = bytes, .mem = TRANSPORT_CAP_HOST_MEM, .lend = lend};
    memset(buf, 0xEE, sizeof(buf));
    CHILD_CHECK(c->ops->post(c, &b, NULL) == ncclSuccess);
    CHILD_CHECK(child_drive(c) == ncclSuccess);
    if (!lend) {
      verify(buf, bytes, sizeof(buf), i);
      continue;
    }
    verify(c->ops->lent(c, i), bytes, bytes, i);
    held[nheld++] = i;
    if (nheld < 3) continue;
    /* the held ones still read as they arrived; give them back, newest first */
    for (int k = nheld - 1; k >= 0; k--) {
      verify(c->ops->lent(c, held[k]), lend_size(held[k]), lend_size(held[k]), held[k]);
      CHILD_CHECK(c->ops->lend_return(c, held[k]) == ncclSuccess);
    }
    CHILD_CHECK(c->ops->lend_return(c, held[0]) == ncclInternalError); /* not twice */
    nheld = 0;
  }
  for (int k = 0; k < nheld; k++) CHILD_CHECK(c->ops->lend_return(c, held[k]) == ncclSuccess);
  flag_set(0, 1);
  c->ops->close(c);
}

static void test_lend(void** state) {
  (void)state;
  pair_run(lend_sender, lend_receiver, NULL, -1);
}

/* A ring too small to hold the receiver's lending span lends nothing. */
static void lend_small_child(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = child_open(rank, "4", 0, &ctx);
  CHILD_CHECK(c->ops->lend_max(c) == 0);
  if (rank == RECEIVER) {
    struct transport_buf b = {.bytes = 8, .mem = TRANSPORT_CAP_HOST_MEM, .lend = 1};
    CHILD_CHECK(c->ops->post(c, &b, NULL) == ncclInternalError);
    flag_set(0, 1);
  } else {
    flag_wait(0, 1);
  }
  c->ops->close(c);
}

static void test_lend_small_ring(void** state) {
  (void)state;
  pair_run(lend_small_child, lend_small_child, NULL, -1);
}

/* ---- sends in place: written straight into the slot the peer reads */

enum { IN_PLACE_N = 60 };

static size_t in_place_size(uint64_t i) {
  return i % 3 == 2 ? 3 * SLOT + 5 : (i % 2 ? SLOT : 17); /* copied ones in between */
}

static void in_place_sender(int rank) {
  struct transport_ctx ctx;
  static unsigned char buf[3 * SLOT + 5];
  struct transport_conn* c = child_open(rank, "4", 1, &ctx);
  CHILD_CHECK(c->ops->send_space(c, SLOT + 1) == NULL); /* more than a slot */
  for (uint64_t i = 0; i < IN_PLACE_N; i++) {
    size_t bytes = in_place_size(i);
    if (bytes > SLOT) { /* copied; nothing may be written in place behind it */
      fill(buf, bytes, i);
      CHILD_CHECK(transport_post_host(c, buf, bytes, NULL) == ncclSuccess);
      CHILD_CHECK(c->ops->send_space(c, 8) == NULL);
      CHILD_CHECK(child_drive(c) == ncclSuccess);
      continue;
    }
    unsigned char* space;
    while ((space = c->ops->send_space(c, bytes)) == NULL) /* the ring is full */
      CHILD_CHECK(child_step(c, NULL) == ncclSuccess);
    fill(space, bytes, i);
    struct transport_buf wrong = {
        .ptr = space + 64, .bytes = bytes, .mem = TRANSPORT_CAP_HOST_MEM, .in_place = 1};
    CHILD_CHECK(c->ops->post(c, &wrong, NULL) == ncclInternalError);
    struct transport_buf b = {
        .ptr = space, .bytes = bytes, .mem = TRANSPORT_CAP_HOST_MEM, .in_place = 1};
    CHILD_CHECK(c->ops->post(c, &b, NULL) == ncclSuccess);
    CHILD_CHECK(child_drive(c) == ncclSuccess);
  }
  flag_wait(0, 1);
  c->ops->close(c);
}

static void in_place_receiver(int rank) {
  struct transport_ctx ctx;
  struct transport_conn* c = child_open(rank, "4", 1, &ctx);
  CHILD_CHECK(c->ops->send_space(c, 8) == NULL); /* a receiver has no room to give */
  child_stream(c, 0, IN_PLACE_N, in_place_size, 3 * SLOT + 5);
  flag_set(0, 1);
  c->ops->close(c);
}

static void test_send_in_place(void** state) {
  (void)state;
  pair_run(in_place_sender, in_place_receiver, NULL, -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_wraparound),
      cmocka_unit_test(test_credits),
      cmocka_unit_test(test_lend),
      cmocka_unit_test(test_lend_small_ring),
      cmocka_unit_test(test_send_in_place),
      cmocka_unit_test(test_direct_on),
      cmocka_unit_test(test_direct_off_param),
      cmocka_unit_test(test_direct_off_probe),
      cmocka_unit_test(test_shutdown_sender),
      cmocka_unit_test(test_shutdown_receiver),
      cmocka_unit_test(test_kill_receiver_waits),
      cmocka_unit_test(test_kill_sender_full),
      cmocka_unit_test(test_kill_sender_direct),
      cmocka_unit_test(test_kill_before_segment),
      cmocka_unit_test(test_kill_before_attach),
      cmocka_unit_test(test_mismatch_timeout_abort),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
