/*
 * One rank's snapshot fetched over its comm's control channel
 * (status_gather.h): connect from this rank's control address (the peer
 * checks it, as for any control message), send a member's sealed request
 * with a fresh nonce, read the length, the snapshot and its seal. Every
 * step is non-blocking: a round drives many fetches at once.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "comm/comm_ctrl.h"
#include "core.h"
#include "host.h"
#include "siphash.h"
#include "status/status_fetch.h"

#define STATUS_KEY_TWEAK 0x7374617475730000ull /* "status": its keys apart from other uses */

size_t status_wire_bytes(const struct flight_wire* w) {
  return offsetof(struct flight_wire, entries) + (size_t)w->nentries * sizeof(w->entries[0]);
}

uint64_t status_reply_seal(uint64_t secret, uint64_t nonce, const void* snapshot, size_t bytes) {
  return siphash24(secret ^ STATUS_KEY_TWEAK, nonce, snapshot, bytes);
}

static void fetch_fail(struct status_fetch* f, struct status_rank* out, const char* why, int err) {
  if (f->fd >= 0) close(f->fd);
  f->fd = -1;
  f->stage = FETCH_FAILED;
  out->answered = 0;
  snprintf(out->why, sizeof(out->why), "%s%s%s", why, err ? ": " : "", err ? strerror(err) : "");
}

static const char* refusal(int err) {
  return err == ECONNREFUSED ? "gone (connection refused)" : "unreachable";
}

void status_fetch_open(const struct status_target* t, int r, uint64_t deadline_ns,
                       struct status_fetch* f, struct status_rank* out) {
  union socket_addr to, from;
  memset(f, 0, sizeof(*f));
  memset(out, 0, sizeof(*out));
  f->fd = -1;
  f->rank = r;
  f->deadline_ns = deadline_ns;
  f->stage = FETCH_CONNECTING;
  if (socket_addr_from_wire(&t->ctrl[r], &to) != 0 || socket_addr_from_wire(&t->mine, &from) != 0)
    return fetch_fail(f, out, "has no control address", 0);
  if (from.sa.sa_family == AF_INET) /* the peer checks the address, not the port */
    from.sin.sin_port = 0;
  else
    from.sin6.sin6_port = 0;
  f->fd = socket(to.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (f->fd < 0 || bind(f->fd, &from.sa, socket_addr_len(&from)) != 0)
    return fetch_fail(f, out, "cannot be asked: no socket", errno);
  if (connect(f->fd, &to.sa, socket_addr_len(&to)) != 0 && errno != EINPROGRESS)
    return fetch_fail(f, out, refusal(errno), errno == ECONNREFUSED ? 0 : errno);
}

/* The connection is up: the request, sealed as a member's message. */
static void fetch_ask(const struct status_target* t, struct status_fetch* f,
                      struct status_rank* out) {
  int err = 0;
  socklen_t n = sizeof(err);
  struct ctrl_msg m;
  if (getsockopt(f->fd, SOL_SOCKET, SO_ERROR, &err, &n) != 0 || err != 0)
    return fetch_fail(f, out, refusal(err), err == ECONNREFUSED ? 0 : err);
  memset(&m, 0, sizeof(m));
  m.magic = CTRL_MAGIC;
  m.kind = CTRL_STATUS;
  m.from = t->rank;
  m.epoch = f->nonce = host_random64(); /* the reply's seal covers it: no replay */
  ctrl_msg_seal(&m, t->secret);
  if (send(f->fd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
    return fetch_fail(f, out, "gone (the request was not taken)", errno);
  f->stage = FETCH_LENGTH;
}

/* The reply is whole: its length in range, its seal right, its rank. */
static void fetch_check(const struct status_target* t, struct status_fetch* f,
                        struct status_rank* out) {
  struct flight_wire* w = &out->w;
  if (status_reply_seal(t->secret, f->nonce, w, f->len) != f->seal)
    return fetch_fail(f, out, "answered with a wrong seal (not a member, or corrupted)", 0);
  if (w->magic != FLIGHT_WIRE_MAGIC || w->version != FLIGHT_WIRE_VERSION || w->rank != f->rank ||
      w->nranks != t->nranks || w->nentries > FLIGHT_WIRE_ENTRIES || status_wire_bytes(w) != f->len)
    return fetch_fail(f, out, "answered what is not its recorder (another Braid version?)", 0);
  w->host[sizeof(w->host) - 1] = '\0';
  w->last_error[sizeof(w->last_error) - 1] = '\0';
  close(f->fd);
  f->fd = -1;
  f->stage = FETCH_DONE;
  out->answered = 1;
}

static void fetch_read(const struct status_target* t, struct status_fetch* f,
                       struct status_rank* out) {
  char* dst = f->stage == FETCH_LENGTH ? (char*)&f->len
              : f->stage == FETCH_BODY ? (char*)&out->w
                                       : (char*)&f->seal;
  size_t want = f->stage == FETCH_LENGTH ? sizeof(f->len)
                : f->stage == FETCH_BODY ? f->len
                                         : sizeof(f->seal);
  ssize_t k = recv(f->fd, dst + f->got, want - f->got, MSG_DONTWAIT);
  if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
    return fetch_fail(f, out, k == 0 ? "closed the connection (refused the request?)" : "reset",
                      k < 0 ? errno : 0);
  if (k < 0) return;
  f->got += (size_t)k;
  if (f->got < want) return;
  f->got = 0;
  if (f->stage == FETCH_LENGTH) {
    if (f->len < offsetof(struct flight_wire, entries) || f->len > sizeof(out->w))
      return fetch_fail(f, out, "answered what is not its recorder (another Braid version?)", 0);
    f->stage = FETCH_BODY;
  } else if (f->stage == FETCH_BODY) {
    f->stage = FETCH_SEAL;
  } else {
    fetch_check(t, f, out);
  }
}

void status_fetch_step(const struct status_target* t, struct status_fetch* f, short revents,
                       struct status_rank* out) {
  if (revents == 0) return;
  if (f->stage == FETCH_CONNECTING)
    fetch_ask(t, f, out);
  else
    fetch_read(t, f, out);
}

void status_fetch_expire(struct status_fetch* f, struct status_rank* out) {
  if (f->stage == FETCH_CONNECTING)
    fetch_fail(f, out, "took no connection within the round (its host down, or a link cut?)", 0);
  else if (f->stage < FETCH_DONE)
    fetch_fail(f, out, "sent no answer within the round", 0);
}
