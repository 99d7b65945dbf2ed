/*
 * The control channel (comm_ctrl.h): listener, one-message sends, and a
 * receive that serves its listener through a hello pool until the
 * awaited message comes or the deadline passes.
 */
#include "comm_ctrl.h"

#include <poll.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "core.h"
#include "hello_pool.h"
#include "param.h"
#include "socket.h"

#define CTRL_HELLO_MS 5000 /* a connection sends its whole message within this */
#define CTRL_MAX_PENDING 8

ncclResult_t ctrl_listen(struct ncclComm* comm, union socket_addr* where) {
  if (where->sa.sa_family == AF_INET)
    where->sin.sin_port = 0;
  else
    where->sin6.sin6_port = 0;
  return socket_listen(where, &comm->ctrl_fd);
}

ncclResult_t ctrl_send(struct ncclComm* comm, int peer, const struct ctrl_msg* msg,
                       uint64_t deadline_ns) {
  ncclResult_t res = ncclSuccess;
  union socket_addr addr;
  int fd = -1;
  if (socket_addr_from_wire(&comm->peers[peer].ctrl, &addr) != 0)
    FAIL(ncclInternalError, "Rank %d: rank %d published no control address", comm->rank, peer);
  CHECK(socket_connect(&addr, deadline_ns, NULL, &fd));
  CHECK(socket_send_all(fd, msg, sizeof(*msg), deadline_ns, NULL));
fail:
  if (fd >= 0) close(fd);
  if (res != ncclSuccess)
    WARN("Rank %d: could not reach rank %d's control listener (is it alive?)", comm->rank, peer);
  return res;
}

ncclResult_t ctrl_send_id(struct ncclComm* comm, uint32_t kind, uint64_t epoch,
                          const ncclUniqueId* id, const unsigned char* skip) {
  ncclResult_t res = ncclSuccess;
  struct ctrl_msg m;
  memset(&m, 0, sizeof(m));
  m = (struct ctrl_msg){CTRL_MAGIC, kind, comm->tctx.secret, epoch, comm->rank, 0, *id};
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
  struct hello_pool* pool;
  struct ctrl_msg* out;
};

/* Why a message is not the awaited one, NULL when it is. */
static const char* ctrl_mismatch(const struct ctrl_wait* w, const struct ctrl_msg* m) {
  if (m->magic != CTRL_MAGIC) return "not a control message";
  if (m->secret != w->comm->tctx.secret) return "not from this communicator";
  if (m->kind != w->kind || (w->from >= 0 && m->from != w->from)) return "another request";
  if (m->epoch != w->epoch) return "an earlier request";
  return NULL;
}

static void ctrl_hello_done(void* arg, int fd, const void* hello) {
  struct ctrl_wait* w = arg;
  const struct ctrl_msg* m = hello;
  const char* why = ctrl_mismatch(w, m);
  close(fd);
  if (why != NULL) {
    hello_pool_log_refusal(w->pool, why);
    return;
  }
  if (!w->got) memcpy(w->out, m, sizeof(*m));
  w->got = 1;
}

ncclResult_t ctrl_recv(struct ncclComm* comm, uint32_t kind, uint64_t epoch, int from,
                       struct ctrl_msg* out, uint64_t deadline_ns) {
  ncclResult_t res = ncclSuccess;
  struct hello_pool pool;
  struct pollfd p[1 + CTRL_MAX_PENDING];
  struct ctrl_wait w = {comm, kind, epoch, from, 0, &pool, out};
  CHECK(hello_pool_init(&pool, "Control listener", comm->ctrl_fd, sizeof(struct ctrl_msg),
                        CTRL_HELLO_MS, CTRL_MAX_PENDING));
  while (!w.got) {
    uint64_t now = braid_now_ns();
    if (now >= deadline_ns) {
      WARN("Rank %d: no word from rank %d on the control channel within BRAID_TIMEOUT_MS",
           comm->rank, from);
      res = ncclRemoteError;
      break;
    }
    int n = hello_pool_pollfds(&pool, p);
    int cap = (int)MIN((deadline_ns - now) / 1000000ull + 1, 100ull);
    if (poll(p, (nfds_t)n, hello_pool_timeout_ms(&pool, cap)) > 0)
      hello_pool_service(&pool, p, n, ctrl_hello_done, &w);
  }
  hello_pool_free(&pool);
fail:
  return res;
}
