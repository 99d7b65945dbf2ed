/*
 * Bootstrap: ids, the root thread and the rank side of the peer-info
 * exchange. The root checks the secret and version of every connection,
 * refuses (and logs) strangers, and gives up at BRAID_TIMEOUT_MS.
 */
#include "bootstrap.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"
#include "param.h"

/* A rank's registration message to the root. */
struct root_hello {
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  int32_t rank;
  int32_t nranks;
  struct peer_info info;
};

/* How long the root waits for one connection's hello before refusing it,
 * so a silent stranger cannot stall the ranks behind it for long. */
#define ROOT_HELLO_MS 2000

_Static_assert(sizeof(struct bootstrap_id) <= NCCL_UNIQUE_ID_BYTES, "id too large");

uint64_t bootstrap_random64(void) {
  uint64_t v = 0;
  if (getrandom(&v, sizeof(v), 0) != sizeof(v)) v = braid_now_ns() ^ ((uint64_t)getpid() << 32);
  return v;
}

/* FNV-1a; good enough to tell hosts apart, never used for security. */
static uint64_t hash_bytes(uint64_t h, const void* data, size_t len) {
  const unsigned char* p = data;
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

uint64_t bootstrap_host_hash(void) {
  const char* forced = getenv("NCCL_HOSTID");
  char buf[512] = {0};
  if (forced) return hash_bytes(0xcbf29ce484222325ull, forced, strlen(forced));
  gethostname(buf, 255);
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    size_t n = strlen(buf);
    if (fgets(buf + n, (int)(sizeof(buf) - n), f) == NULL) buf[n] = '\0';
    fclose(f);
  }
  return hash_bytes(0xcbf29ce484222325ull, buf, strlen(buf));
}

/* Processes that see the same boot, the same /dev/shm and the same pid
 * namespace can map each other's segments and check each other's pids. */
uint64_t bootstrap_shm_domain(void) {
  char buf[512] = {0};
  struct stat st;
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (fgets(buf, (int)sizeof(buf), f) == NULL) buf[0] = '\0';
    fclose(f);
  }
  uint64_t h = hash_bytes(0xcbf29ce484222325ull, buf, strlen(buf));
  if (stat("/dev/shm", &st) == 0) {
    h = hash_bytes(h, &st.st_dev, sizeof(st.st_dev));
    h = hash_bytes(h, &st.st_ino, sizeof(st.st_ino));
  }
  if (stat("/proc/self/ns/pid", &st) == 0) h = hash_bytes(h, &st.st_ino, sizeof(st.st_ino));
  return h;
}

void bootstrap_id_encode(const struct bootstrap_id* id, ncclUniqueId* out) {
  memset(out, 0, sizeof(*out));
  memcpy(out->internal, id, sizeof(*id));
}

ncclResult_t bootstrap_id_decode(const ncclUniqueId* in, struct bootstrap_id* id) {
  union socket_addr addr;
  memcpy(id, in->internal, sizeof(*id));
  if (id->magic != BOOTSTRAP_MAGIC) {
    WARN("Invalid unique id: bad magic 0x%08x (not made by ncclGetUniqueId?)", id->magic);
    return ncclInvalidArgument;
  }
  if (id->version != BOOTSTRAP_VERSION) {
    WARN("Invalid unique id: version %u, this library speaks %u", id->version, BOOTSTRAP_VERSION);
    return ncclInvalidArgument;
  }
  if (socket_addr_from_wire(&id->root, &addr) != 0) {
    WARN("Invalid unique id: bad root address (family %u port %u)", id->root.family, id->root.port);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* ---- root ---- */

struct root_state {
  int listen_fd;
  uint64_t secret;
  uint64_t deadline_ns;
  int nranks; /* learned from the first valid hello */
  int nregistered;
  int* fds; /* per rank, -1 until registered */
  struct peer_info* table;
};

static void root_free(struct root_state* st) {
  if (st->fds)
    for (int r = 0; r < st->nranks; r++)
      if (st->fds[r] >= 0) close(st->fds[r]);
  free(st->fds);
  free(st->table);
  if (st->listen_fd >= 0) close(st->listen_fd);
  free(st);
}

/* Why a hello is refused, or NULL if it is acceptable. */
static const char* root_hello_problem(const struct root_state* st, const struct root_hello* h) {
  if (h->magic != BOOTSTRAP_MAGIC) return "bad magic";
  if (h->version != BOOTSTRAP_VERSION) return "protocol version mismatch";
  if (h->secret != st->secret) return "wrong secret";
  if (h->nranks < 1 || h->nranks > BOOTSTRAP_MAX_RANKS) return "bad nranks";
  if (st->nranks != 0 && h->nranks != st->nranks) return "nranks differs from other ranks";
  if (h->rank < 0 || h->rank >= h->nranks) return "rank out of range";
  if (st->nranks != 0 && st->fds[h->rank] >= 0) return "duplicate rank";
  return NULL;
}

static ncclResult_t root_register(struct root_state* st, int fd, const struct root_hello* h) {
  if (st->nranks == 0) {
    st->nranks = h->nranks;
    st->fds = malloc(sizeof(int) * (size_t)h->nranks);
    st->table = calloc((size_t)h->nranks, sizeof(struct peer_info));
    if (st->fds == NULL || st->table == NULL) {
      WARN("Bootstrap root: out of memory for %d ranks", h->nranks);
      return ncclSystemError;
    }
    for (int r = 0; r < h->nranks; r++) st->fds[r] = -1;
  }
  st->fds[h->rank] = fd;
  st->table[h->rank] = h->info;
  st->nregistered++;
  TRACE(SUB_BOOTSTRAP, "Bootstrap root: rank %d/%d registered", h->rank, st->nranks);
  return ncclSuccess;
}

/* Accept one connection and read its hello; strangers are logged and closed. */
static ncclResult_t root_accept_one(struct root_state* st) {
  struct root_hello h;
  int fd = accept4(st->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return ncclSuccess; /* gone before we got to it */
  uint64_t dl = MIN(socket_deadline(ROOT_HELLO_MS), st->deadline_ns);
  const char* why = NULL;
  if (socket_recv_all(fd, &h, sizeof(h), dl) != ncclSuccess)
    why = "no complete hello";
  else
    why = root_hello_problem(st, &h);
  if (why) {
    WARN("Bootstrap root: refused a connection (%s); still serving the others", why);
    close(fd);
    return ncclSuccess;
  }
  return root_register(st, fd, &h);
}

/* A registered rank never speaks again before the reply, so readability
 * means it closed: the rank died and the whole bootstrap must fail. */
static int root_any_rank_gone(struct root_state* st, struct pollfd* p, int n) {
  for (int i = 1; i < n; i++)
    if (p[i].revents) return 1;
  (void)st;
  return 0;
}

static ncclResult_t root_wait_all(struct root_state* st) {
  struct pollfd* p = NULL;
  ncclResult_t res = ncclSuccess;
  while (st->nranks == 0 || st->nregistered < st->nranks) {
    int n = 1;
    free(p);
    p = calloc((size_t)st->nregistered + 1, sizeof(*p));
    if (p == NULL) FAIL(ncclSystemError, "Bootstrap root: out of memory");
    p[0].fd = st->listen_fd;
    p[0].events = POLLIN;
    for (int r = 0; r < st->nranks; r++)
      if (st->fds[r] >= 0) p[n].fd = st->fds[r], p[n++].events = POLLIN;
    uint64_t now = braid_now_ns();
    if (now >= st->deadline_ns)
      FAIL(ncclSystemError,
           "Bootstrap root: timeout, %d of %d ranks arrived (BRAID_TIMEOUT_MS=%lld)",
           st->nregistered, st->nranks, (long long)param_timeout_ms());
    int ms = (int)MIN((st->deadline_ns - now) / 1000000ull + 1, 1000ull);
    if (poll(p, (nfds_t)n, ms) < 0 && errno != EINTR)
      FAIL(ncclSystemError, "Bootstrap root: poll failed: %s", strerror(errno));
    if (root_any_rank_gone(st, p, n))
      FAIL(ncclRemoteError, "Bootstrap root: a registered rank closed its connection (died?)");
    if (p[0].revents & POLLIN) CHECK(root_accept_one(st));
  }
fail:
  free(p);
  return res;
}

static void* root_main(void* arg) {
  struct root_state* st = arg;
  if (root_wait_all(st) == ncclSuccess) {
    size_t bytes = sizeof(struct peer_info) * (size_t)st->nranks;
    for (int r = 0; r < st->nranks; r++)
      if (socket_send_all(st->fds[r], st->table, bytes, st->deadline_ns) != ncclSuccess)
        WARN("Bootstrap root: could not send the peer table to rank %d", r);
    INFO(SUB_BOOTSTRAP, "Bootstrap root: served %d ranks", st->nranks);
  }
  root_free(st); /* closing tells waiting ranks that bootstrap failed */
  return NULL;
}

static ncclResult_t root_start(union socket_addr* addr, uint64_t secret) {
  ncclResult_t res = ncclSuccess;
  pthread_t thread;
  struct root_state* st = calloc(1, sizeof(*st));
  if (st == NULL) return ncclSystemError;
  st->listen_fd = -1;
  st->secret = secret;
  st->deadline_ns = socket_deadline(param_timeout_ms());
  CHECK(socket_listen(addr, &st->listen_fd));
  if (pthread_create(&thread, NULL, root_main, st) != 0)
    FAIL(ncclSystemError, "Bootstrap: cannot start the root thread");
  pthread_detach(thread);
  return ncclSuccess;
fail:
  root_free(st);
  return res;
}

/* With NCCL_COMM_ID every rank derives the same secret from the string. */
static uint64_t comm_id_secret(const char* s) {
  return hash_bytes(0x84222325cbf29ce4ull, s, strlen(s));
}

ncclResult_t bootstrap_new_root_id(ncclUniqueId* out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_id id = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION, 0, {0}};
  union socket_addr addr;
  CHECK(socket_local_addr(&addr, NULL, 0));
  if (addr.sa.sa_family == AF_INET)
    addr.sin.sin_port = 0;
  else
    addr.sin6.sin6_port = 0;
  id.secret = bootstrap_random64();
  CHECK(root_start(&addr, id.secret));
  socket_addr_to_wire(&addr, &id.root);
  bootstrap_id_encode(&id, out);
fail:
  return res;
}

ncclResult_t bootstrap_get_unique_id(ncclUniqueId* out) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_id id = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION, 0, {0}};
  union socket_addr addr;
  const char* env = param_read_str("NCCL_COMM_ID");
  if (env == NULL) return bootstrap_new_root_id(out);
  CHECK(socket_parse_hostport(env, &addr));
  id.secret = comm_id_secret(env);
  socket_addr_to_wire(&addr, &id.root);
  bootstrap_id_encode(&id, out);
fail:
  return res;
}

ncclResult_t bootstrap_maybe_start_root(const struct bootstrap_id* id, int rank) {
  const char* env = param_read_str("NCCL_COMM_ID");
  union socket_addr addr;
  if (env == NULL || rank != 0 || id->secret != comm_id_secret(env)) return ncclSuccess;
  socket_addr_from_wire(&id->root, &addr);
  return root_start(&addr, id->secret);
}

ncclResult_t bootstrap_exchange(const struct bootstrap_id* id, int rank, int nranks,
                                const struct peer_info* mine, struct peer_info* all,
                                uint64_t deadline_ns) {
  ncclResult_t res = ncclSuccess;
  union socket_addr root;
  char buf[SOCKET_ADDR_STRLEN];
  int fd = -1;
  struct root_hello h = {BOOTSTRAP_MAGIC, BOOTSTRAP_VERSION, id->secret, rank, nranks, *mine};
  socket_addr_from_wire(&id->root, &root);
  CHECK(socket_connect(&root, deadline_ns, &fd));
  CHECK(socket_send_all(fd, &h, sizeof(h), deadline_ns));
  res = socket_recv_all(fd, all, sizeof(struct peer_info) * (size_t)nranks, deadline_ns);
  if (res != ncclSuccess)
    FAIL(res,
         "Bootstrap: rank %d got no peer table from root %s (a rank died, timed out, or ids "
         "differ)",
         rank, socket_addr_str(&root, buf, sizeof(buf)));
  for (int r = 0; r < nranks; r++)
    if (all[r].rank != r) FAIL(ncclInternalError, "Bootstrap: corrupt peer table entry %d", r);
fail:
  if (fd >= 0) close(fd);
  return res;
}
