/*
 * The control channel (comm_ctrl.h): listener, one-message sends, and a
 * receive that serves its listener through a hello pool until the
 * awaited message comes or the deadline passes.
 */
#include "comm/comm_ctrl.h"

#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core.h"
#include "hello_pool.h"
#include "param.h"
#include "siphash.h"
#include "socket.h"
#include "socket_peer.h"

#define CTRL_MAX_PENDING 8
#define CTRL_KEY_TWEAK 0x636f6e74726f6c00ull /* "control": its keys apart from other uses */

ncclResult_t ctrl_listen(struct ncclComm* comm, union socket_addr* where) {
  if (where->sa.sa_family == AF_INET)
    where->sin.sin_port = 0;
  else
    where->sin6.sin6_port = 0;
  return socket_listen(where, &comm->ctrl_fd);
}

/* The keyed hash of m (its proof field taken as 0). */
static uint64_t ctrl_proof(uint64_t secret, const struct ctrl_msg* m) {
  struct ctrl_msg c = *m;
  c.proof = 0;
  return siphash24(secret, secret ^ CTRL_KEY_TWEAK, &c, sizeof(c));
}

void ctrl_msg_seal(struct ctrl_msg* m, uint64_t secret) {
  m->proof = ctrl_proof(secret, m);
}

/* One message to `peer` on a fresh connection from this rank's control
 * address, and its answer: the peer took it. */
static ncclResult_t ctrl_send(struct ncclComm* comm, int peer, const struct ctrl_msg* msg,
                              uint64_t deadline_ns) {
  ncclResult_t res = ncclSuccess;
  union socket_addr addr, mine;
  char ack = 0;
  int fd = -1;
  if (socket_addr_from_wire(&comm->peers[peer].ctrl, &addr) != 0 ||
      socket_addr_from_wire(&comm->ctrl_addr, &mine) != 0)
    FAIL(ncclInternalError, "Rank %d: rank %d or itself published no control address", comm->rank,
         peer);
  CHECK(socket_connect_from(&addr, &mine, deadline_ns, &comm->closing, &fd));
  CHECK(socket_send_all(fd, msg, sizeof(*msg), deadline_ns, &comm->closing));
  CHECK(socket_recv_all(fd, &ack, 1, deadline_ns, &comm->closing));
  if (ack != CTRL_ACK)
    FAIL(ncclInternalError, "Rank %d: rank %d answered %d", comm->rank, peer, ack);
fail:
  if (fd >= 0) close(fd);
  if (res != ncclSuccess)
    WARN("Rank %d: rank %d did not take a control message (is it alive, and in the same call?)",
         comm->rank, peer);
  return res;
}

ncclResult_t ctrl_send_id(struct ncclComm* comm, uint32_t kind, uint64_t epoch,
                          const ncclUniqueId* id, const unsigned char* skip) {
  ncclResult_t res = ncclSuccess;
  struct ctrl_msg m;
  memset(&m, 0, sizeof(m));
  m = (struct ctrl_msg){CTRL_MAGIC, kind, 0, epoch, comm->rank, 0, *id};
  ctrl_msg_seal(&m, comm->tctx.secret);
  uint64_t deadline = socket_deadline(param_timeout_ms());
  for (int r = 0; r < comm->nranks; r++)
    if (r != comm->rank && !(skip && skip[r])) CHECK(ctrl_send(comm, r, &m, deadline));
fail:
  return res;
}

struct ctrl_wait {
  struct ncclComm* comm;
  uint32_t kind;
  uint64_t epoch;
  int from;
  int got;
  struct hello_pool pool;
  struct ctrl_msg* out;
};

/* Why connection fd is not from member `from` (NULL: it is): from the
 * address that rank published, and on this host from its process. */
static const char* ctrl_stranger(const struct ncclComm* comm, int fd, int from) {
  union socket_addr addr;
  if (socket_addr_from_wire(&comm->peers[from].ctrl, &addr) != 0) return "a rank without address";
  if (!socket_peer_from(fd, &addr)) return "not from the address of the rank it names";
  if (socket_peer_local(fd) && !socket_peer_held_by(fd, comm->peers[from].pid))
    return "not from the process of the rank it names";
  return NULL;
}

const char* ctrl_check(const struct ncclComm* comm, int fd, const struct ctrl_msg* m) {
  if (m->magic != CTRL_MAGIC) return "not a control message";
  if (m->from < 0 || m->from >= comm->nranks || m->from == comm->rank) return "not from a peer";
  if (m->proof != ctrl_proof(comm->tctx.secret, m)) return "not from this communicator";
  return ctrl_stranger(comm, fd, m->from);
}

/* Why a member's message is not the awaited one, NULL when it is. */
static const char* ctrl_unwanted(const struct ctrl_wait* w, const struct ctrl_msg* m) {
  if (m->kind != w->kind || (w->from >= 0 && m->from != w->from)) return "another request";
  if (m->epoch != w->epoch) return "an earlier request";
  return NULL;
}

/* Why a message is not the awaited one, NULL when it is. */
static const char* ctrl_mismatch(const struct ctrl_wait* w, int fd, const struct ctrl_msg* m) {
  const char* why = ctrl_check(w->comm, fd, m);
  return why ? why : ctrl_unwanted(w, m);
}

static void ctrl_hello_done(void* arg, int fd, const void* hello) {
  struct ctrl_wait* w = arg;
  struct ctrl_msg m;
  const char ack = CTRL_ACK;
  memcpy(&m, hello, sizeof(m));
  const char* why = w->got ? "a second answer" : ctrl_mismatch(w, fd, &m);
  if (why == NULL && send(fd, &ack, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1)
    why = "its sender left before the answer";
  close(fd);
  if (why != NULL) {
    hello_pool_log_refusal(&w->pool, why);
    return;
  }
  memcpy(w->out, &m, sizeof(m));
  w->got = 1;
}

/* The awaited message from the comm's mailbox, kept there by the status
 * service (which serves the listener); others are dropped with a line. */
static ncclResult_t ctrl_recv_mailbox(struct ctrl_wait* w, uint64_t deadline_ns) {
  struct ctrl_mailbox* box = &w->comm->mailbox;
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&box->lock);
  while (!w->got) {
    int kept = 0;
    for (int i = 0; i < box->n; i++) {
      const struct ctrl_msg* m = &box->msgs[i];
      const char* why = w->got ? "" : ctrl_unwanted(w, m);
      if (why == NULL) {
        *w->out = *m, w->got = 1;
      } else if (m->kind != w->kind || m->epoch > w->epoch) { /* a later call's: kept */
        box->msgs[kept++] = *m;
      } else if (*why) {
        INFO(SUB_INIT, "Rank %d: control message of rank %d dropped: %s", w->comm->rank, m->from,
             why);
      }
    }
    box->n = kept;
    if (w->got) break;
    if (atomic_load(&w->comm->closing)) {
      WARN("Rank %d: the communicator was aborted or destroyed during the call", w->comm->rank);
      res = ncclInvalidUsage;
      break;
    }
    if (braid_now_ns() >= deadline_ns) {
      WARN("Rank %d: no word from rank %d on the control channel within BRAID_TIMEOUT_MS",
           w->comm->rank, w->from);
      res = ncclRemoteError;
      break;
    }
    braid_cond_wait_ms(&box->cv, &box->lock, 100); /* closing seen in 0.1 s */
  }
  pthread_mutex_unlock(&box->lock);
  return res;
}

ncclResult_t ctrl_recv(struct ncclComm* comm, uint32_t kind, uint64_t epoch, int from,
                       struct ctrl_msg* out, uint64_t deadline_ns) {
  ncclResult_t res = ncclSuccess;
  struct pollfd p[1 + CTRL_MAX_PENDING];
  struct ctrl_wait w = {comm, kind, epoch, from, 0, {0}, out};
  if (comm->mailbox.served) return ctrl_recv_mailbox(&w, deadline_ns);
  CHECK(hello_pool_init(&w.pool, "Control listener", comm->ctrl_fd, sizeof(struct ctrl_msg),
                        CTRL_HELLO_MS, CTRL_MAX_PENDING));
  while (!w.got) {
    uint64_t now = braid_now_ns();
    if (atomic_load(&comm->closing)) {
      WARN("Rank %d: the communicator was aborted or destroyed during the call", comm->rank);
      res = ncclInvalidUsage;
      break;
    }
    if (now >= deadline_ns) {
      WARN("Rank %d: no word from rank %d on the control channel within BRAID_TIMEOUT_MS",
           comm->rank, from);
      res = ncclRemoteError;
      break;
    }
    int n = hello_pool_pollfds(&w.pool, p);
    int cap = (int)MIN((deadline_ns - now) / 1000000ull + 1, 100ull); /* closing seen in 0.1 s */
    if (poll(p, (nfds_t)n, hello_pool_timeout_ms(&w.pool, cap)) > 0)
      hello_pool_service(&w.pool, p, n, ctrl_hello_done, &w);
  }
  hello_pool_free(&w.pool);
fail:
  return res;
}
