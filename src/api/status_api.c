/*
 * The status API (braid.h): a comm's status and recorder for its own
 * process, and braid-status's two ways in: asking a process of this user
 * over its status socket, and reading the dumps ranks left behind.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "braid.h"
#include "comm/comm.h"
#include "core.h"
#include "status/flight.h"
#include "status/flight_json.h"
#include "socket.h"
#include "status/status_dumps.h"
#include "status/status_gather.h"
#include "status/status_proto.h"
#include "status/status_report.h"
#include "strbuf.h"

#define ASK_CONNECT_MS 2000 /* the process takes the request within this */
#define ASK_ANSWER_MS 30000 /* and answers within this (a gather is ~1 s a comm) */

static ncclResult_t status_what_of(braidStatusFormat_t format, uint32_t* what, const char* fn) {
  switch (format) {
    case braidStatusText:
      *what = STATUS_VERDICT;
      return ncclSuccess;
    case braidStatusJson:
      *what = STATUS_JSON;
      return ncclSuccess;
    case braidStatusPrometheus:
      *what = STATUS_PROMETHEUS;
      return ncclSuccess;
  }
  WARN("%s : format %d is none of braidStatusText, braidStatusJson, braidStatusPrometheus", fn,
       (int)format);
  return ncclInvalidArgument;
}

static ncclResult_t text_out(struct strbuf* b, char** text) {
  if (b->failed) {
    strbuf_free(b);
    WARN("Out of memory for a status");
    return ncclSystemError;
  }
  *text = strbuf_take(b);
  return *text ? ncclSuccess : ncclSystemError;
}

/* The caller holds the comm for the whole gather. */
static int held_snapshot(const struct status_target* t, struct flight_wire* w) {
  flight_snapshot(&t->held->flight, w);
  return 1;
}

BRAID_API(ncclResult_t, braidCommStatus, ncclComm_t comm, braidStatusFormat_t format, char** text);
ncclResult_t braidCommStatus(ncclComm_t comm, braidStatusFormat_t format, char** text) {
  struct status_target t;
  struct strbuf out = {0};
  uint32_t what;
  ncclResult_t res = comm_call_hold(comm, "braidCommStatus");
  if (res != ncclSuccess) return res;
  if (text == NULL) FAIL(ncclInvalidArgument, "braidCommStatus : text is NULL");
  CHECK(status_what_of(format, &what, "braidCommStatus"));
  CHECK(status_target_make(comm, &t));
  t.held = comm;
  t.self_snapshot = held_snapshot;
  res = status_of(&t, what, 1, &out);
  status_target_free(&t);
  if (res == ncclSuccess) res = text_out(&out, text);
fail:
  strbuf_free(&out);
  comm_call_leave(comm);
  return res;
}

BRAID_API(ncclResult_t, braidCommRecorder, ncclComm_t comm, char** text);
ncclResult_t braidCommRecorder(ncclComm_t comm, char** text) {
  struct strbuf out = {0};
  struct flight_wire* w = NULL;
  ncclResult_t res = comm_call_hold(comm, "braidCommRecorder");
  if (res != ncclSuccess) return res;
  if (text == NULL) FAIL(ncclInvalidArgument, "braidCommRecorder : text is NULL");
  CHECK(braid_calloc(&w, 1, sizeof(*w)));
  flight_snapshot(&comm->flight, w);
  flight_json(w, NULL, &out);
  res = text_out(&out, text);
fail:
  free(w);
  comm_call_leave(comm);
  return res;
}

/* The status socket of process pid: its abstract name from /proc/net/unix
 * (the random part is known only once bound). 0 when found. */
static int status_socket_of(int pid, struct sockaddr_un* a, socklen_t* len) {
  char want[64], line[512];
  int found = -1;
  snprintf(want, sizeof(want), " @" STATUS_PREFIX "%d-", pid);
  FILE* f = fopen("/proc/net/unix", "re");
  if (f == NULL) return -1;
  while (found != 0 && fgets(line, sizeof(line), f)) {
    char* at = strstr(line, want);
    if (at == NULL) continue;
    at += 2; /* past " @" */
    at[strcspn(at, " \n")] = '\0';
    size_t name = strlen(at);
    if (name + 1 >= sizeof(a->sun_path)) continue;
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    memcpy(a->sun_path + 1, at, name);
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + name);
    found = 0;
  }
  fclose(f);
  return found;
}

/* What the process answers, copied to fd until it closes. */
static ncclResult_t ask_copy(int sock, int pid, int fd) {
  char buf[4096];
  uint64_t deadline = socket_deadline(ASK_ANSWER_MS);
  size_t total = 0;
  for (;;) {
    struct pollfd p = {sock, POLLIN, 0};
    uint64_t now = braid_now_ns();
    if (now >= deadline) {
      WARN("braidStatusAsk : process %d did not finish its answer in %d s", pid,
           ASK_ANSWER_MS / 1000);
      return ncclSystemError;
    }
    if (poll(&p, 1, (int)((deadline - now) / 1000000u) + 1) <= 0) continue;
    ssize_t got = recv(sock, buf, sizeof(buf), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break; /* closed (or reset): all said */
    total += (size_t)got;
    if (write(fd, buf, (size_t)got) != got) {
      WARN("braidStatusAsk : cannot write the answer: %s", strerror(errno));
      return ncclSystemError;
    }
  }
  if (total == 0) {
    WARN("braidStatusAsk : process %d refused the request (another user's?)", pid);
    return ncclSystemError;
  }
  return ncclSuccess;
}

BRAID_API(ncclResult_t, braidStatusAsk, int pid, braidStatusFormat_t format, int fd);
ncclResult_t braidStatusAsk(int pid, braidStatusFormat_t format, int fd) {
  struct sockaddr_un a;
  socklen_t len;
  uint32_t what;
  int sock = -1;
  ncclResult_t res = status_what_of(format, &what, "braidStatusAsk");
  if (res != ncclSuccess) return res;
  if (status_socket_of(pid, &a, &len) != 0)
    FAIL(ncclInvalidArgument,
         "braidStatusAsk : process %d has no Braid status socket (not a Braid process with a "
         "communicator, BRAID_STATUS=0, or gone)",
         pid);
  sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0 || connect(sock, (struct sockaddr*)&a, len) != 0)
    FAIL(ncclSystemError, "braidStatusAsk : cannot connect to process %d: %s", pid,
         strerror(errno));
  struct status_request req = {STATUS_MAGIC, STATUS_VERSION, what, 0};
  CHECK(socket_send_all(sock, &req, sizeof(req), socket_deadline(ASK_CONNECT_MS), NULL));
  CHECK(ask_copy(sock, pid, fd));
fail:
  if (sock >= 0) close(sock);
  return res;
}

BRAID_API(ncclResult_t, braidStatusFromDumps, const char* dir, braidStatusFormat_t format, int fd);
ncclResult_t braidStatusFromDumps(const char* dir, braidStatusFormat_t format, int fd) {
  struct status_dumps d = {0};
  struct strbuf out = {0};
  uint32_t what;
  ncclResult_t res = status_what_of(format, &what, "braidStatusFromDumps");
  if (res != ncclSuccess) return res;
  if (dir == NULL) FAIL(ncclInvalidArgument, "braidStatusFromDumps : dir is NULL");
  CHECK(status_dumps_read(dir, &d));
  for (int i = 0; i < d.njobs; i++) status_report(&d.jobs[i], what, i == 0, &out);
  if (out.failed) FAIL(ncclSystemError, "braidStatusFromDumps : out of memory");
  if (out.len && write(fd, out.s, out.len) != (ssize_t)out.len)
    FAIL(ncclSystemError, "braidStatusFromDumps : cannot write: %s", strerror(errno));
fail:
  strbuf_free(&out);
  status_dumps_free(&d);
  return res;
}
