/*
 * The status service (status_service.h): its thread, its Unix socket, and
 * the comms' control listeners it serves. The service is per process, as
 * the comm registry is: it outlives any one comm. Its thread polls without
 * the lock and serves with it, after a fresh poll(0), so that a comm
 * unregistered meanwhile is never touched.
 */
#include "status/status_service.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "comm/comm.h"
#include "core.h"
#include "hello_pool.h"
#include "host.h"
#include "param.h"
#include "comm/comm_ctrl.h"
#include "socket.h"
#include "status/status_fetch.h"
#include "status/status_gather.h"
#include "status/status_proto.h"
#include "status/status_report.h"
#include "strbuf.h"

#define STATUS_HELLO_MS 2000 /* a connection sends its whole request within this */
#define STATUS_MAX_PENDING 8 /* per listener */
#define STATUS_MAX_WORKERS 4 /* braid-status requests answered at once */
#define STATUS_REPLY_MS 2000 /* a status reply to a peer is sent within this */
#define STATUS_MAX_POLL 1024
#define STATUS_MAX_COMMS 16 /* comms of a process one answer covers */
#define STATUS_SEND_MS 2000 /* braid-status reads what it asked for within this */

struct served {
  struct ncclComm* comm;
  struct hello_pool pool;
};

struct service {
  pthread_mutex_t lock;
  pthread_mutex_t life; /* register and unregister: a start or stop is theirs alone */
  int state;            /* 0 not running, 1 running, -1 could not start (BRAID_STATUS=0...) */
  int stop;             /* the thread leaves (the last comm went) */
  pthread_t thread;
  int wake_fd;
  int unix_fd;
  struct hello_pool unix_pool;
  struct served* comms;
  int ncomms, cap;
  int workers;
  char refusal[96]; /* unix_admit's words, the service thread's */
};

static struct service g_svc = {.lock = PTHREAD_MUTEX_INITIALIZER,
                               .life = PTHREAD_MUTEX_INITIALIZER,
                               .wake_fd = -1,
                               .unix_fd = -1};

static void service_wake(void) {
  uint64_t one = 1;
  if (g_svc.wake_fd >= 0 && write(g_svc.wake_fd, &one, sizeof(one)) < 0) { /* full: awake */
  }
}

/* ---- a member's control message ---- */

/* Reply to a member's status request: this rank's snapshot, its size first. */
static void answer_status(struct ncclComm* comm, int fd, uint64_t nonce) {
  struct flight_wire* w = malloc(sizeof(*w));
  if (w == NULL) return;
  flight_snapshot(&comm->flight, w);
  uint32_t len = (uint32_t)status_wire_bytes(w);
  uint64_t seal = status_reply_seal(comm->tctx.secret, nonce, w, len);
  uint64_t deadline = socket_deadline(STATUS_REPLY_MS);
  if (socket_send_all(fd, &len, sizeof(len), deadline, NULL) == ncclSuccess &&
      socket_send_all(fd, w, len, deadline, NULL) == ncclSuccess)
    (void)socket_send_all(fd, &seal, sizeof(seal), deadline, NULL);
  free(w);
}

/* A shrink's or grow's message, for ctrl_recv: acknowledged once kept. */
static void keep_message(struct ncclComm* comm, int fd, const struct ctrl_msg* m) {
  struct ctrl_mailbox* box = &comm->mailbox;
  const char ack = CTRL_ACK;
  pthread_mutex_lock(&box->lock);
  if (box->n == CTRL_MAILBOX) { /* nobody takes them: the oldest goes */
    memmove(&box->msgs[0], &box->msgs[1], (CTRL_MAILBOX - 1) * sizeof(box->msgs[0]));
    box->n--;
  }
  box->msgs[box->n++] = *m;
  pthread_cond_broadcast(&box->cv);
  pthread_mutex_unlock(&box->lock);
  (void)send(fd, &ack, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

static void on_ctrl_hello(void* arg, int fd, const void* hello) {
  struct served* s = arg;
  struct ctrl_msg m;
  memcpy(&m, hello, sizeof(m));
  const char* why = ctrl_check(s->comm, fd, &m);
  if (why != NULL) {
    hello_pool_log_refusal(&s->pool, why);
  } else if (m.kind == CTRL_STATUS) {
    answer_status(s->comm, fd, m.epoch);
  } else {
    keep_message(s->comm, fd, &m);
  }
  close(fd);
}

/* ---- braid-status on the Unix socket ---- */

/* A target's own snapshot, if the service still serves its comm. */
static int served_snapshot(const struct status_target* t, struct flight_wire* w) {
  const struct ncclComm* comm = t->comm;
  int found = 0;
  pthread_mutex_lock(&g_svc.lock);
  for (int i = 0; i < g_svc.ncomms && !found; i++)
    if (g_svc.comms[i].comm == comm) {
      flight_snapshot(&g_svc.comms[i].comm->flight, w);
      found = 1;
    }
  pthread_mutex_unlock(&g_svc.lock);
  return found;
}

/* Copies of up to `max` of the served comms' targets (under the lock: a
 * comm is there until status_unregister, which takes the lock). */
static int status_targets(struct status_target* out, int max) {
  int n = 0;
  pthread_mutex_lock(&g_svc.lock);
  for (int i = 0; i < g_svc.ncomms && n < max; i++)
    if (status_target_make(g_svc.comms[i].comm, &out[n]) == ncclSuccess)
      out[n++].self_snapshot = served_snapshot;
  pthread_mutex_unlock(&g_svc.lock);
  return n;
}

/* Answer a braid-status request on fd, for every comm of this process. */
static void status_answer(int fd, uint32_t what) {
  struct status_target t[STATUS_MAX_COMMS];
  struct strbuf out = {0};
  int n = status_targets(t, STATUS_MAX_COMMS);
  if (n == 0)
    strbuf_printf(&out, "%s",
                  what == STATUS_JSON         ? "{\"verdict\":[\"no communicator\"]}\n"
                  : what == STATUS_PROMETHEUS ? ""
                                              : "This process has no communicator.\n");
  for (int i = 0; i < n; i++) {
    if (status_of(&t[i], what, i == 0, &out) != ncclSuccess)
      strbuf_printf(&out, "comm %d of this process: out of memory\n", i);
    status_target_free(&t[i]);
  }
  if (out.s) (void)socket_send_all(fd, out.s, out.len, socket_deadline(STATUS_SEND_MS), NULL);
  strbuf_free(&out);
}

struct worker {
  int fd;
  struct status_request req;
};

static void* worker_main(void* arg) {
  struct worker* w = arg;
  status_answer(w->fd, w->req.what);
  close(w->fd);
  free(w);
  pthread_mutex_lock(&g_svc.lock);
  g_svc.workers--;
  pthread_mutex_unlock(&g_svc.lock);
  return NULL;
}

/* Only this user may ask (the status tells what the job does): checked
 * before the connection may send anything. */
static const char* unix_admit(int fd) {
  struct ucred cred;
  socklen_t n = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &n) != 0)
    return "a connection whose credentials cannot be read";
  if (cred.uid == geteuid()) return NULL;
  snprintf(g_svc.refusal, sizeof(g_svc.refusal), "another user (uid %u, pid %d)",
           (unsigned)cred.uid, (int)cred.pid);
  return g_svc.refusal;
}

static void on_unix_hello(void* arg, int fd, const void* hello) {
  struct worker* w = NULL;
  pthread_t t;
  (void)arg;
  struct status_request req;
  memcpy(&req, hello, sizeof(req));
  if (req.magic != STATUS_MAGIC || req.version != STATUS_VERSION ||
      g_svc.workers >= STATUS_MAX_WORKERS || (w = malloc(sizeof(*w))) == NULL) {
    hello_pool_log_refusal(&g_svc.unix_pool, "not a status request, or too many at once");
    close(fd);
    return;
  }
  *w = (struct worker){fd, req};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &attr, worker_main, w) == 0) {
    g_svc.workers++;
  } else {
    close(fd);
    free(w);
  }
  pthread_attr_destroy(&attr);
}

/* ---- the thread ---- */

/* Every fd to watch: the wake, the Unix pool, each comm's pool (under
 * the lock). Returns how many, and the earliest pending deadline. */
static int gather_fds(struct pollfd* p, int* timeout_ms) {
  int n = 0;
  p[n++] = (struct pollfd){g_svc.wake_fd, POLLIN, 0};
  *timeout_ms = hello_pool_timeout_ms(&g_svc.unix_pool, 1000);
  n += hello_pool_pollfds(&g_svc.unix_pool, p + n);
  for (int i = 0; i < g_svc.ncomms && n + 1 + STATUS_MAX_PENDING <= STATUS_MAX_POLL; i++) {
    *timeout_ms = MIN(*timeout_ms, hello_pool_timeout_ms(&g_svc.comms[i].pool, 1000));
    n += hello_pool_pollfds(&g_svc.comms[i].pool, p + n);
  }
  return n;
}

/* Serve one pool after a fresh look at its fds (under the lock). */
static void serve_pool(struct hello_pool* pool, hello_pool_done_fn done, void* arg) {
  struct pollfd p[1 + STATUS_MAX_PENDING];
  int n = hello_pool_pollfds(pool, p);
  if (poll(p, (nfds_t)n, 0) >= 0) hello_pool_service(pool, p, n, done, arg);
}

static void* service_main(void* arg) {
  struct pollfd* p = arg; /* STATUS_MAX_POLL of them, the thread's for its life */
  for (;;) {
    int timeout;
    pthread_mutex_lock(&g_svc.lock);
    int n = gather_fds(p, &timeout), stop = g_svc.stop;
    pthread_mutex_unlock(&g_svc.lock);
    if (stop) break;
    if (poll(p, (nfds_t)n, timeout) < 0 && errno != EINTR) continue; /* a closed fd: look again */
    if (p[0].revents & POLLIN) {
      uint64_t v;
      (void)read(g_svc.wake_fd, &v, sizeof(v));
    }
    pthread_mutex_lock(&g_svc.lock);
    serve_pool(&g_svc.unix_pool, on_unix_hello, NULL);
    for (int i = 0; i < g_svc.ncomms; i++)
      serve_pool(&g_svc.comms[i].pool, on_ctrl_hello, &g_svc.comms[i]);
    pthread_mutex_unlock(&g_svc.lock);
  }
  free(p);
  return NULL;
}

/* The Unix socket: an abstract name (nothing in the file system), its
 * random part unknown before it is bound, so nobody can take it first. */
static int service_listen(void) {
  struct sockaddr_un a;
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  int n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, STATUS_PREFIX "%d-%016llx",
                   (int)getpid(), (unsigned long long)host_random64());
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
  if (fd >= 0 && bind(fd, (struct sockaddr*)&a, len) == 0 && listen(fd, 16) == 0) return fd;
  if (fd >= 0) close(fd);
  return -1;
}

static void service_close_fds(void) {
  if (g_svc.unix_fd >= 0) hello_pool_free(&g_svc.unix_pool);
  if (g_svc.wake_fd >= 0) close(g_svc.wake_fd);
  if (g_svc.unix_fd >= 0) close(g_svc.unix_fd);
  g_svc.wake_fd = g_svc.unix_fd = -1;
}

/* A forked child has none of its parent's threads, nor its comms: its own
 * first comm starts its own service. */
static void service_prefork(void) {
  pthread_mutex_lock(&g_svc.lock);
}
static void service_postfork_parent(void) {
  pthread_mutex_unlock(&g_svc.lock);
}
static void service_postfork_child(void) {
  g_svc.state = 0;
  g_svc.ncomms = 0;
  g_svc.workers = 0;
  g_svc.stop = 0;
  service_close_fds(); /* the parent's socket: this process does not answer on it */
  pthread_mutex_unlock(&g_svc.lock);
}
static void service_atfork(void) {
  pthread_atfork(service_prefork, service_postfork_parent, service_postfork_child);
}

/* With the process's first comm, under both locks. */
static void service_start(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, service_atfork);
  g_svc.state = -1;
  g_svc.stop = 0;
  if (!param_status()) return;
  g_svc.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  g_svc.unix_fd = service_listen();
  if (g_svc.wake_fd < 0 || g_svc.unix_fd < 0 ||
      hello_pool_init(&g_svc.unix_pool, "Status socket", g_svc.unix_fd,
                      sizeof(struct status_request), STATUS_HELLO_MS,
                      STATUS_MAX_PENDING) != ncclSuccess) {
    INFO(SUB_INIT, "Status service: cannot start (%s): braid-status cannot ask this process",
         strerror(errno));
    service_close_fds();
    return;
  }
  g_svc.unix_pool.admit = unix_admit;
  struct pollfd* fds = calloc(STATUS_MAX_POLL, sizeof(*fds));
  if (fds && pthread_create(&g_svc.thread, NULL, service_main, fds) == 0) {
    g_svc.state = 1;
    INFO(SUB_INIT, "Status service: pid %d answers braid-status", (int)getpid());
  } else {
    free(fds);
    service_close_fds();
  }
}

/* With the process's last comm (life held, not the lock): the process is
 * left as it was before its first comm, no thread, no fd. */
static void service_stop(void) {
  pthread_mutex_lock(&g_svc.lock);
  g_svc.stop = 1;
  pthread_mutex_unlock(&g_svc.lock);
  service_wake();
  pthread_join(g_svc.thread, NULL);
  pthread_mutex_lock(&g_svc.lock);
  service_close_fds();
  g_svc.state = 0;
  pthread_mutex_unlock(&g_svc.lock);
}

void status_register(struct ncclComm* comm) {
  struct ctrl_mailbox* box = &comm->mailbox;
  pthread_mutex_lock(&g_svc.life);
  pthread_mutex_lock(&g_svc.lock);
  if (g_svc.state == 0) service_start();
  if (g_svc.state == 1 && comm->ctrl_fd >= 0 && g_svc.ncomms == g_svc.cap &&
      braid_realloc(&g_svc.comms, (size_t)(g_svc.cap ? 2 * g_svc.cap : 8), sizeof(*g_svc.comms)) ==
          ncclSuccess)
    g_svc.cap = g_svc.cap ? 2 * g_svc.cap : 8;
  if (g_svc.state == 1 && comm->ctrl_fd >= 0 && g_svc.ncomms < g_svc.cap) {
    struct served* s = &g_svc.comms[g_svc.ncomms];
    if (hello_pool_init(&s->pool, "Control listener", comm->ctrl_fd, sizeof(struct ctrl_msg),
                        CTRL_HELLO_MS, STATUS_MAX_PENDING) == ncclSuccess) {
      s->comm = comm;
      g_svc.ncomms++;
      pthread_mutex_lock(&box->lock);
      box->served = 1;
      pthread_mutex_unlock(&box->lock);
    }
  }
  int idle = g_svc.state == 1 && g_svc.ncomms == 0; /* it could serve none: no thread kept */
  pthread_mutex_unlock(&g_svc.lock);
  if (idle)
    service_stop();
  else
    service_wake();
  pthread_mutex_unlock(&g_svc.life);
}

void status_unregister(struct ncclComm* comm) {
  pthread_mutex_lock(&g_svc.life);
  pthread_mutex_lock(&g_svc.lock);
  for (int i = 0; i < g_svc.ncomms; i++) {
    if (g_svc.comms[i].comm != comm) continue;
    hello_pool_free(&g_svc.comms[i].pool);
    g_svc.comms[i] = g_svc.comms[--g_svc.ncomms];
    break;
  }
  int last = g_svc.state == 1 && g_svc.ncomms == 0;
  pthread_mutex_unlock(&g_svc.lock);
  if (last)
    service_stop();
  else
    service_wake();
  pthread_mutex_unlock(&g_svc.life);
}
