/*
 * The bootstrap's fan-out (bootstrap_relay.h): blocks of ranks per root,
 * the relay tree inside a block, and the relay itself.
 */
#include "bootstrap/bootstrap_relay.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "hello_pool.h"
#include "siphash.h"
#include "socket.h"

#define RELAY_TABLE_TWEAK 0x7461626c65000000ull  /* "table": its keys apart from other uses */
#define RELAY_HEADER_TWEAK 0x72656c6179000000ull /* "relay" */
#define RELAY_HELLO_MS 2000                      /* a connection sends its whole header */
#define RELAY_MAX_PENDING 16
#define RELAY_SLICE_MS 100 /* an abort is seen this fast */

/* ---- blocks: the larger ones first ---- */

int bootstrap_block_first(int block, int nranks, int nroots) {
  int base = nranks / nroots, rem = nranks % nroots;
  return block * base + MIN(block, rem);
}

int bootstrap_block_size(int block, int nranks, int nroots) {
  return nranks / nroots + (block < nranks % nroots);
}

int bootstrap_block_of(int rank, int nranks, int nroots) {
  int base = nranks / nroots, rem = nranks % nroots, big = rem * (base + 1);
  return rank < big ? rank / (base + 1) : rem + (rank - big) / base;
}

/* ---- the tree ---- */

int relay_parent(int j, int fanout) {
  return j < fanout ? -1 : j / fanout - 1;
}

int relay_first_child(int j, int fanout) {
  return fanout * (j + 1);
}

/* ---- the keyed hashes ---- */

static uint64_t table_mac(uint64_t secret, const struct peer_info* all, int nranks) {
  return siphash24(secret, secret ^ RELAY_TABLE_TWEAK, all, sizeof(*all) * (size_t)nranks);
}

static uint64_t header_proof(uint64_t secret, const struct relay_header* h) {
  struct relay_header c = *h;
  c.proof = 0;
  return siphash24(secret, secret ^ RELAY_HEADER_TWEAK, &c, sizeof(c));
}

/* ---- receiving ---- */

struct relay_wait {
  struct hello_pool* pool;
  int parent, rank, nranks;
  uint64_t secret;
  int fd; /* the parent's connection once its header came, else -1 */
  struct relay_header h;
};

static const char* relay_header_wrong(const struct relay_wait* w, const struct relay_header* h) {
  if (h->magic != RELAY_MAGIC || h->version != BOOTSTRAP_VERSION) return "not a Braid relay";
  if (h->proof != header_proof(w->secret, h)) return "a relay header without this job's proof";
  if (h->from != w->parent || h->to != w->rank || h->nranks != w->nranks)
    return "a relay for another rank or job";
  return NULL;
}

/* A whole header came on fd (hello_pool's callback). */
static void relay_on_header(void* arg, int fd, const void* bytes) {
  struct relay_wait* w = arg;
  struct relay_header h;
  memcpy(&h, bytes, sizeof(h));
  const char* why = w->fd >= 0 ? "a second relay" : relay_header_wrong(w, &h);
  if (why) {
    hello_pool_log_refusal(w->pool, why);
    close(fd);
    return;
  }
  w->fd = fd;
  w->h = h;
}

/* The table after a checked header: the sender holds the secret, so a
 * table that fails now is a failure, not a stranger to ignore. */
static ncclResult_t relay_read_table(struct relay_wait* w, struct peer_info* all,
                                     uint64_t deadline_ns, _Atomic int* aborted) {
  ncclResult_t res = ncclSuccess;
  size_t bytes = sizeof(*all) * (size_t)w->nranks;
  CHECK(socket_recv_all(w->fd, all, bytes, deadline_ns, aborted));
  if (table_mac(w->secret, all, w->nranks) != w->h.table_mac)
    FAIL(ncclRemoteError, "Bootstrap: rank %d: the table relayed by rank %d fails its hash",
         w->rank, w->parent);
fail:
  return res;
}

static ncclResult_t relay_poll(struct relay_wait* w, uint64_t deadline_ns) {
  struct pollfd p[1 + RELAY_MAX_PENDING];
  int n = hello_pool_pollfds(w->pool, p);
  uint64_t now = braid_now_ns();
  uint64_t left_ms = now < deadline_ns ? (deadline_ns - now) / 1000000ull + 1 : 0;
  int ms = hello_pool_timeout_ms(w->pool, (int)MIN(left_ms, RELAY_SLICE_MS));
  if (poll(p, (nfds_t)n, ms) < 0 && errno != EINTR) {
    WARN("Bootstrap: poll failed: %s", strerror(errno));
    return ncclSystemError;
  }
  hello_pool_service(w->pool, p, n, relay_on_header, w);
  return ncclSuccess;
}

ncclResult_t bootstrap_relay_recv(int ctrl_fd, int parent, int rank, int nranks, uint64_t secret,
                                  struct peer_info* all, uint64_t deadline_ns, _Atomic int* aborted,
                                  struct bootstrap_counts* counts) {
  ncclResult_t res = ncclSuccess;
  struct hello_pool pool;
  struct relay_wait w = {&pool, parent, rank, nranks, secret, -1, {0}};
  CHECK(hello_pool_init(&pool, "Bootstrap relay", ctrl_fd, sizeof(struct relay_header),
                        RELAY_HELLO_MS, RELAY_MAX_PENDING));
  while (w.fd < 0) {
    if (aborted && atomic_load(aborted))
      FAIL(ncclSystemError, "Bootstrap: rank %d aborted waiting for the table from rank %d", rank,
           parent);
    if (braid_now_ns() >= deadline_ns)
      FAIL(ncclSystemError,
           "Bootstrap: rank %d waited for the peer table from rank %d until the timeout "
           "(BRAID_TIMEOUT_MS): rank %d died or hangs in its init",
           rank, parent, parent);
    CHECK(relay_poll(&w, deadline_ns));
  }
  CHECK(relay_read_table(&w, all, deadline_ns, aborted));
  counts->msgs_in++;
  counts->bytes_in += sizeof(w.h) + sizeof(*all) * (size_t)nranks;
fail:
  if (w.fd >= 0) close(w.fd);
  hello_pool_free(&pool);
  return res;
}

/* ---- sending ---- */

static ncclResult_t relay_send_one(const struct relay_header* h, const struct peer_info* all,
                                   uint64_t deadline_ns, _Atomic int* aborted) {
  ncclResult_t res = ncclSuccess;
  union socket_addr addr;
  int fd = -1;
  if (socket_addr_from_wire(&all[h->to].ctrl, &addr) != 0)
    FAIL(ncclRemoteError, "Bootstrap: rank %d published no usable control address", h->to);
  CHECK(socket_connect(&addr, deadline_ns, aborted, &fd));
  CHECK(socket_send_all(fd, h, sizeof(*h), deadline_ns, aborted));
  CHECK(socket_send_all(fd, all, sizeof(*all) * (size_t)h->nranks, deadline_ns, aborted));
fail:
  if (fd >= 0) close(fd);
  return res;
}

void bootstrap_relay_send(int rank, int nranks, const struct peer_info* all, uint64_t secret,
                          int first, int size, int fanout, uint64_t deadline_ns,
                          _Atomic int* aborted, struct bootstrap_counts* counts) {
  int c = relay_first_child(rank - first, fanout);
  if (c >= size) return; /* a leaf: nothing to hash */
  struct relay_header h = {
      RELAY_MAGIC, BOOTSTRAP_VERSION, rank, 0, nranks, 0, table_mac(secret, all, nranks), 0};
  for (int end = MIN(c + fanout, size); c < end; c++) {
    h.to = first + c;
    h.proof = header_proof(secret, &h);
    if (relay_send_one(&h, all, deadline_ns, aborted) != ncclSuccess) {
      WARN("Bootstrap: rank %d could not relay the peer table to rank %d (died?)", rank, h.to);
      continue;
    }
    counts->msgs_out++;
    counts->bytes_out += sizeof(h) + sizeof(*all) * (size_t)nranks;
  }
}
