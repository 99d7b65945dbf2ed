/*
 * The bootstrap root: one thread that reads every connection's hello side
 * by side (hello_pool), registers the ranks of its block that hold the job
 * key, and when all have come sends the table and the data secret down the
 * relay tree (bootstrap_relay.h): whole to the tree's first ranks, and to
 * the others the rank that relays it. With several roots, root b > 0 first
 * hands its block to root 0 and gets the whole table and the secret back;
 * root 0 waits for its own block and every other root's.
 *
 * Whatever makes the job ambiguous fails it loudly for every rank the root
 * has seen: a rank registering twice (two jobs with one address and key),
 * a rank 0 that found our address taken (two jobs), ranks that disagree on
 * nranks, a registered rank that died. After such a failure the root stays
 * a little (ROOT_LINGER_MS) to tell late ranks so, instead of letting them
 * wait for the timeout. Hellos without the key are strangers: refused, and
 * the job goes on.
 */
#include "bootstrap/bootstrap_root.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_relay.h"
#include "core.h"
#include "hello_pool.h"
#include "host.h"
#include "param.h"

/* A connection has this long to send its whole hello. */
#define ROOT_HELLO_MS 2000
/* And another root this long for its block's entries after its hello
 * (16,384 entries are 2.5 MB: 20 ms at 1 Gbit/s). */
#define ROOT_BLOCK_MS 10000
/* Connections that have not sent a whole hello yet, at most. */
#define ROOT_MAX_PENDING 64
/* How long a failed root keeps telling late ranks why. */
#define ROOT_LINGER_MS 10000
/* Poll slices: the owner's stop is seen this fast. */
#define ROOT_SLICE_MS 100

struct bootstrap_root {
  _Atomic int refs; /* the thread's, and its owner's when it has one */
  _Atomic int stop; /* the owner let go: stop waiting for ranks */
  int wake[2];      /* the owner's stop wakes the thread's poll */
  pthread_t thread; /* joined by its owner, detached without one */
  int listen_fd;
  uint64_t key;
  uint64_t deadline_ns;
  int nranks;      /* expected: given, or learned from the first hello */
  int nroots;      /* the job's roots, 0 until the first hello */
  int index;       /* which of them this is */
  int first, size; /* its block of ranks */
  int expect;      /* entries it waits for: its block's, and root 0 every block's */
  uint64_t up_key; /* root 0's key and address, for index > 0 */
  struct socket_wire_addr up;
  int nregistered; /* entries accepted */
  int* fds;        /* per rank, -1 until registered; root 0: root b at b's first rank */
  struct peer_info* table;
  const char* failure;  /* set once the job failed: every later hello is told */
  _Atomic int conflict; /* the failure was a collision or disagreement, for the owner */
  enum root_status failure_status;
  struct bootstrap_counts counts; /* what it sent and received, for the log */
  struct hello_pool pool;
  struct pollfd* pfds; /* room for the pool and every rank */
};

static void root_unref(struct bootstrap_root* st) {
  if (atomic_fetch_sub(&st->refs, 1) != 1) return;
  hello_pool_free(&st->pool);
  if (st->fds)
    for (int r = 0; r < st->nranks; r++)
      if (st->fds[r] >= 0) close(st->fds[r]);
  free(st->fds);
  free(st->table);
  free(st->pfds);
  if (st->listen_fd >= 0) close(st->listen_fd);
  for (int i = 0; i < 2; i++)
    if (st->wake[i] >= 0) close(st->wake[i]);
  free(st);
}

const char* bootstrap_hello_stranger(const struct root_hello* h, uint64_t key) {
  if (h->magic != BOOTSTRAP_MAGIC) return "not a Braid rank";
  if (h->version != BOOTSTRAP_VERSION) return "another Braid protocol version";
  if (h->key != key) return "wrong job key: another job on this address?";
  return NULL;
}

/* Why a hello's roots do not fit the job's (ncclCommInitRankScalable), or NULL. */
static const char* root_roots_conflict(const struct bootstrap_root* st,
                                       const struct root_hello* h) {
  if (h->nroots < 1 || h->nroots > h->nranks || h->root_index < 0 || h->root_index >= h->nroots)
    return "a hello claims impossible roots";
  if (st->nroots != 0 && (h->nroots != st->nroots || h->root_index != st->index))
    return "ranks disagree on the job's ids";
  if (st->nroots > 1 && st->index > 0 &&
      (h->first_key != st->up_key || memcmp(&h->first, &st->up, sizeof(st->up)) != 0))
    return "ranks disagree on the job's first id";
  int block = bootstrap_block_of(h->rank, h->nranks, h->nroots);
  if (h->flags & ROOT_HELLO_BLOCK)
    return h->root_index == 0 && block > 0 &&
                   bootstrap_block_first(block, h->nranks, h->nroots) == h->rank
               ? NULL
               : "a block that no root holds";
  return block == h->root_index ? NULL : "a rank came to another block's root (ids differ?)";
}

/* Why a key holder's hello makes the job ambiguous, or NULL. */
static const char* root_hello_conflict(const struct bootstrap_root* st,
                                       const struct root_hello* h) {
  if (h->flags & ROOT_HELLO_COLLISION)
    return "another rank 0 with this job's key found the address taken: two jobs share "
           "NCCL_COMM_ID and job key";
  if (h->nranks < 1 || h->nranks > BOOTSTRAP_MAX_RANKS) return "a rank claims an impossible nranks";
  if (st->nranks != 0 && h->nranks != st->nranks) return "ranks disagree on nranks";
  if (h->rank < 0 || h->rank >= h->nranks) return "a rank claims a rank out of range";
  const char* why = root_roots_conflict(st, h);
  if (why) return why;
  if (st->fds && st->fds[h->rank] >= 0)
    return "a rank registered twice: two jobs share NCCL_COMM_ID and job key";
  return NULL;
}

/* Answer one connection and close it (best effort: it may be gone). */
static void root_reply_close(int fd, enum root_status status) {
  struct root_reply r = {.magic = BOOTSTRAP_MAGIC, .status = (uint32_t)status};
  if (send(fd, &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT) < 0) { /* gone: nothing to tell */
  }
  close(fd);
}

/* The job failed: tell every registered rank, and later ones, why. */
static void root_fail(struct bootstrap_root* st, enum root_status status, const char* why) {
  if (st->failure) return;
  st->failure = why;
  st->failure_status = status;
  if (status == ROOT_CONFLICT) atomic_store(&st->conflict, 1);
  if (st->nregistered > 0 || status == ROOT_CONFLICT)
    WARN("Bootstrap root: %s; failing the bootstrap of all %d registered ranks", why,
         st->nregistered);
  else /* nobody came yet: an id given up (a grow that never happened), not a failure */
    INFO(SUB_BOOTSTRAP, "Bootstrap root: %s; no rank had registered", why);
  for (int r = 0; st->fds && r < st->nranks; r++)
    if (st->fds[r] >= 0) root_reply_close(st->fds[r], status), st->fds[r] = -1;
}

/* The tables for nranks ranks, none registered yet. All or nothing: the
 * root sizes itself at the first hello when fds is still NULL. */
static ncclResult_t root_size(struct bootstrap_root* st, int nranks) {
  ncclResult_t res = ncclSuccess;
  int* fds = NULL;
  CHECK(braid_calloc(&fds, (size_t)nranks, sizeof(*fds)));
  CHECK(braid_calloc(&st->table, (size_t)nranks, sizeof(*st->table)));
  CHECK(braid_calloc(&st->pfds, 2 + ROOT_MAX_PENDING + (size_t)nranks, sizeof(*st->pfds)));
  for (int r = 0; r < nranks; r++) fds[r] = -1;
  st->fds = fds;
  st->nranks = nranks;
  return ncclSuccess;
fail:
  free(fds);
  free(st->table);
  free(st->pfds);
  st->table = NULL;
  st->pfds = NULL;
  return res;
}

/* The first hello tells the root which it is and which ranks it waits for. */
static void root_learn(struct bootstrap_root* st, const struct root_hello* h) {
  if (st->nroots != 0) return;
  st->nroots = h->nroots;
  st->index = h->root_index;
  st->first = bootstrap_block_first(st->index, st->nranks, st->nroots);
  st->size = bootstrap_block_size(st->index, st->nranks, st->nroots);
  st->expect = st->index == 0 ? st->nranks : st->size;
  st->up_key = h->first_key;
  st->up = h->first;
}

/* Root b's entries after its block hello: each must be the rank it claims.
 * Root b sends them with the hello, so they come at once or never: the
 * read has ROOT_BLOCK_MS, not the whole bootstrap's time, while every
 * other hello waits for this one thread. */
static ncclResult_t root_read_block(struct bootstrap_root* st, int fd, int first) {
  ncclResult_t res = ncclSuccess;
  int size = bootstrap_block_size(bootstrap_block_of(first, st->nranks, st->nroots), st->nranks,
                                  st->nroots);
  size_t bytes = sizeof(*st->table) * (size_t)size;
  uint64_t deadline = MIN(st->deadline_ns, socket_deadline(ROOT_BLOCK_MS));
  CHECK(socket_recv_all(fd, st->table + first, bytes, deadline, &st->stop));
  for (int i = 0; i < size; i++)
    if (st->table[first + i].rank != first + i)
      FAIL(ncclRemoteError, "Bootstrap root: the block of rank %d holds rank %d's entry at %d",
           first, st->table[first + i].rank, first + i);
  st->counts.bytes_in += bytes;
  st->nregistered += size;
fail:
  return res;
}

static ncclResult_t root_register(struct bootstrap_root* st, int fd, const struct root_hello* h) {
  if (st->fds == NULL && root_size(st, h->nranks) != ncclSuccess) return ncclSystemError;
  root_learn(st, h);
  st->fds[h->rank] = fd;
  if (h->flags & ROOT_HELLO_BLOCK) return root_read_block(st, fd, h->rank);
  st->table[h->rank] = h->info;
  st->nregistered++;
  TRACE(SUB_BOOTSTRAP, "Bootstrap root: rank %d/%d registered", h->rank, st->nranks);
  return ncclSuccess;
}

/* A whole hello arrived on fd (hello_pool's callback). */
static void root_on_hello(void* arg, int fd, const void* bytes) {
  struct bootstrap_root* st = arg;
  struct root_hello h;
  memcpy(&h, bytes, sizeof(h));
  const char* why = bootstrap_hello_stranger(&h, st->key);
  st->counts.msgs_in++;
  st->counts.bytes_in += sizeof(h);
  if (why) {
    hello_pool_log_refusal(&st->pool, why);
    root_reply_close(fd, ROOT_REFUSED);
    return;
  }
  if (st->failure) { /* a late rank of the failed job */
    root_reply_close(fd, st->failure_status);
    return;
  }
  if ((why = root_hello_conflict(st, &h)) != NULL) {
    root_reply_close(fd, ROOT_CONFLICT);
    root_fail(st, ROOT_CONFLICT, why);
    return;
  }
  if (root_register(st, fd, &h) != ncclSuccess) {
    if (st->fds == NULL || st->fds[h.rank] != fd) root_reply_close(fd, ROOT_FAILED);
    root_fail(st, ROOT_FAILED, "out of memory, or another root's block could not be read");
  }
}

/* A registered rank never speaks again before the reply, so readability
 * means it closed: it died, and the job cannot complete. */
static int root_poll_ranks(struct bootstrap_root* st, struct pollfd* p, int n) {
  for (int r = 0; st->fds && r < st->nranks; r++)
    if (st->fds[r] >= 0) p[n++] = (struct pollfd){st->fds[r], POLLIN, 0};
  return n;
}

static int root_any_rank_gone(const struct pollfd* p, int from, int n) {
  for (int i = from; i < n; i++)
    if (p[i].revents) return 1;
  return 0;
}

/* One poll of the listener, the pending hellos and the registered ranks
 * (before the first hello sizes the tables, a small array serves). */
static ncclResult_t root_poll_once(struct bootstrap_root* st) {
  struct pollfd small[2 + ROOT_MAX_PENDING];
  struct pollfd* p = st->pfds ? st->pfds : small;
  int n = hello_pool_pollfds(&st->pool, p), npool = n;
  if (st->failure == NULL) n = root_poll_ranks(st, p, n);
  p[n++] = (struct pollfd){st->wake[0], POLLIN, 0};
  if (poll(p, (nfds_t)n, hello_pool_timeout_ms(&st->pool, ROOT_SLICE_MS)) < 0 && errno != EINTR) {
    WARN("Bootstrap root: poll failed: %s", strerror(errno));
    return ncclSystemError;
  }
  if (root_any_rank_gone(p, npool, n - 1))
    root_fail(st, ROOT_FAILED, "a registered rank closed its connection (died?)");
  hello_pool_service(&st->pool, p, npool, root_on_hello, st);
  return ncclSuccess;
}

static int root_complete(const struct bootstrap_root* st) {
  return st->nroots != 0 && st->nregistered == st->expect && st->failure == NULL;
}

/* Wait for every rank, or fail; a failed root then lingers for late ranks. */
static void root_serve(struct bootstrap_root* st) {
  uint64_t linger_end = 0;
  for (;;) {
    uint64_t now = braid_now_ns();
    if (root_complete(st)) return;
    if (atomic_load(&st->stop)) { /* no lingering: the address is free for the next job at once */
      root_fail(st, ROOT_FAILED, "its own rank left (aborted or failed) before all ranks came");
      return;
    }
    if (st->failure == NULL && now >= st->deadline_ns)
      root_fail(st, ROOT_FAILED, "timeout before all ranks came (BRAID_TIMEOUT_MS)");
    if (st->failure && linger_end == 0)
      linger_end = MIN(st->deadline_ns, now + (uint64_t)ROOT_LINGER_MS * 1000000ull);
    if (st->failure && now >= linger_end) return;
    if (root_poll_once(st) != ncclSuccess) root_fail(st, ROOT_FAILED, "poll failed");
  }
}

/* Is rank i's process the one the root runs in? */
static int root_rank_is_here(const struct bootstrap_root* st, int i, uint64_t host) {
  return st->table[i].pid == (int32_t)getpid() && st->table[i].host_hash == host;
}

/* One answer; the table follows when `table` is set. */
static void root_send(struct bootstrap_root* st, int fd, const struct root_reply* r, int table,
                      int rank) {
  size_t bytes = sizeof(struct peer_info) * (size_t)st->nranks;
  if (socket_send_all(fd, r, sizeof(*r), st->deadline_ns, NULL) != ncclSuccess ||
      (table && socket_send_all(fd, st->table, bytes, st->deadline_ns, NULL) != ncclSuccess)) {
    WARN("Bootstrap root: could not answer rank %d", rank);
    return;
  }
  st->counts.msgs_out++;
  st->counts.bytes_out += sizeof(*r) + (table ? bytes : 0);
}

/* Every rank of the block gets the data secret, and the table or the rank
 * that relays it - the ranks of this process last: once they have theirs,
 * their init returns and the process may exit, taking the root with it,
 * while others still wait. */
static void root_send_tables(struct bootstrap_root* st, uint64_t secret) {
  int fanout = (int)param_bootstrap_fanout();
  struct root_reply r = {BOOTSTRAP_MAGIC, ROOT_OK, secret, st->nranks, -1, fanout, 0};
  uint64_t host = host_hash();
  for (int here = 0; here < 2; here++)
    for (int j = 0; j < st->size; j++) {
      int i = st->first + j, parent = relay_parent(j, fanout);
      if (root_rank_is_here(st, i, host) != here) continue;
      r.parent = parent < 0 ? -1 : st->first + parent;
      root_send(st, st->fds[i], &r, parent < 0, i);
    }
}

/* Root 0: every other root gets the whole table and the secret. */
static void root_answer_blocks(struct bootstrap_root* st, uint64_t secret) {
  struct root_reply r = {BOOTSTRAP_MAGIC, ROOT_OK, secret, st->nranks, -1, 1, 0};
  for (int b = 1; b < st->nroots; b++) {
    int first = bootstrap_block_first(b, st->nranks, st->nroots);
    root_send(st, st->fds[first], &r, 1, first);
  }
}

/* Root b > 0: hand the block to root 0; the whole table and the secret
 * come back, or the reason the job failed. */
static ncclResult_t root_ask_first(struct bootstrap_root* st, uint64_t* secret,
                                   enum root_status* status) {
  ncclResult_t res = ncclSuccess;
  union socket_addr addr;
  int fd = -1;
  struct root_hello h = {.magic = BOOTSTRAP_MAGIC,
                         .version = BOOTSTRAP_VERSION,
                         .key = st->up_key,
                         .rank = st->first,
                         .nranks = st->nranks,
                         .flags = ROOT_HELLO_BLOCK,
                         .nroots = st->nroots};
  struct root_reply r;
  size_t block = sizeof(*st->table) * (size_t)st->size;
  *status = ROOT_FAILED;
  if (socket_addr_from_wire(&st->up, &addr) != 0)
    FAIL(ncclInvalidArgument, "Bootstrap root %d: the first id's address is unusable", st->index);
  CHECK(socket_connect(&addr, st->deadline_ns, &st->stop, &fd));
  CHECK(socket_send_all(fd, &h, sizeof(h), st->deadline_ns, &st->stop));
  CHECK(socket_send_all(fd, st->table + st->first, block, st->deadline_ns, &st->stop));
  CHECK(socket_recv_all(fd, &r, sizeof(r), st->deadline_ns, &st->stop));
  st->counts.msgs_out++, st->counts.bytes_out += sizeof(h) + block;
  if (r.magic != BOOTSTRAP_MAGIC || r.status != ROOT_OK || r.nranks != st->nranks) {
    *status = r.magic == BOOTSTRAP_MAGIC && r.status == ROOT_CONFLICT ? ROOT_CONFLICT : ROOT_FAILED;
    FAIL(ncclRemoteError, "Bootstrap root %d: root 0 failed the job (status %u)", st->index,
         r.status);
  }
  CHECK(socket_recv_all(fd, st->table, sizeof(*st->table) * (size_t)st->nranks, st->deadline_ns,
                        &st->stop));
  for (int i = 0; i < st->nranks; i++)
    if (st->table[i].rank != i) FAIL(ncclRemoteError, "Bootstrap root: corrupt entry %d", i);
  st->counts.msgs_in++;
  st->counts.bytes_in += sizeof(r) + sizeof(*st->table) * (size_t)st->nranks;
  *secret = r.data_secret;
fail:
  if (fd >= 0) close(fd);
  return res;
}

/* All have come: answer them, through root 0 when this is another root. */
static void root_finish(struct bootstrap_root* st) {
  uint64_t secret = host_random64();
  enum root_status status;
  if (st->index > 0 && root_ask_first(st, &secret, &status) != ncclSuccess) {
    root_fail(st, status, "root 0 failed or could not be reached");
    return;
  }
  if (st->index == 0) root_answer_blocks(st, secret);
  root_send_tables(st, secret);
  INFO(SUB_BOOTSTRAP,
       "Bootstrap root %d of %d: served %d ranks; %llu messages (%llu bytes) in, %llu (%llu) out",
       st->index, st->nroots, st->size, (unsigned long long)st->counts.msgs_in,
       (unsigned long long)st->counts.bytes_in, (unsigned long long)st->counts.msgs_out,
       (unsigned long long)st->counts.bytes_out);
}

static void* root_main(void* arg) {
  struct bootstrap_root* st = arg;
  root_serve(st);
  if (root_complete(st)) root_finish(st);
  root_unref(st); /* closing tells ranks still waiting that bootstrap failed */
  return NULL;
}

ncclResult_t bootstrap_root_start(union socket_addr* addr, uint64_t key, int nranks,
                                  struct bootstrap_root** out, int* listen_err) {
  ncclResult_t res = ncclSuccess;
  struct bootstrap_root* st = NULL;
  int err = 0;
  CHECK(braid_calloc(&st, 1, sizeof(*st)));
  atomic_init(&st->refs, out ? 2 : 1);
  st->listen_fd = st->wake[0] = st->wake[1] = -1;
  if (pipe2(st->wake, O_CLOEXEC | O_NONBLOCK) != 0)
    FAIL(ncclSystemError, "Bootstrap: pipe failed: %s", strerror(errno));
  st->key = key;
  st->deadline_ns = socket_deadline(param_timeout_ms());
  if (socket_try_listen(addr, &st->listen_fd, &err) != ncclSuccess) {
    if (listen_err == NULL) {
      char buf[SOCKET_ADDR_STRLEN];
      WARN("Bootstrap: cannot listen on %s: %s", socket_addr_str(addr, buf, sizeof(buf)),
           strerror(err));
    }
    res = ncclSystemError;
    goto fail;
  }
  CHECK(hello_pool_init(&st->pool, "Bootstrap root", st->listen_fd, sizeof(struct root_hello),
                        ROOT_HELLO_MS, ROOT_MAX_PENDING));
  if (nranks > 0) CHECK(root_size(st, nranks));
  /* Without `out` the thread holds the only reference and may free st at
   * once: its id goes to a local, never through st. */
  pthread_t thread;
  if (pthread_create(&thread, NULL, root_main, st) != 0)
    FAIL(ncclSystemError, "Bootstrap: cannot start the root thread");
  if (out == NULL) {
    pthread_detach(thread);
    return ncclSuccess;
  }
  st->thread = thread;
  *out = st;
  return ncclSuccess;
fail:
  if (listen_err) *listen_err = err;
  if (st) atomic_store(&st->refs, 1), root_unref(st);
  return res;
}

/* Joined, so that when this returns the address is free again: a job
 * that aborts its init (its own rank closing on the root is part of that)
 * can be started anew on the same NCCL_COMM_ID. A root that found two
 * jobs, or ranks that disagree, stays a little to tell late ranks why. */
void bootstrap_root_release(struct bootstrap_root* root) {
  char one = 1;
  if (root == NULL) return;
  if (atomic_load(&root->conflict)) {
    pthread_detach(root->thread);
    root_unref(root);
    return;
  }
  atomic_store(&root->stop, 1);
  if (write(root->wake[1], &one, 1) < 0) { /* full: it is awake already */
  }
  pthread_join(root->thread, NULL);
  root_unref(root);
}

void bootstrap_root_wait(struct bootstrap_root* root, struct bootstrap_counts* counts) {
  pthread_join(root->thread, NULL);
  *counts = root->counts;
  root_unref(root);
}

void bootstrap_root_detach(struct bootstrap_root* root) {
  if (root == NULL) return;
  pthread_detach(root->thread);
  root_unref(root); /* the thread's reference frees it when it is done */
}
