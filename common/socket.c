/*
 * Socket helpers: interface selection, address conversion, and blocking
 * connect/accept/send/recv that give up at a deadline instead of hanging.
 */
#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core.h"
#include "param.h"

uint64_t socket_deadline(int64_t ms) {
  return braid_now_ns() + (uint64_t)ms * 1000000ull;
}

void socket_addr_to_wire(const union socket_addr* a, struct socket_wire_addr* w) {
  memset(w, 0, sizeof(*w));
  w->family = (uint16_t)a->sa.sa_family;
  if (a->sa.sa_family == AF_INET) {
    w->port = a->sin.sin_port;
    memcpy(w->addr, &a->sin.sin_addr, 4);
  } else {
    w->port = a->sin6.sin6_port;
    w->scope = a->sin6.sin6_scope_id;
    memcpy(w->addr, &a->sin6.sin6_addr, 16);
  }
}

int socket_addr_from_wire(const struct socket_wire_addr* w, union socket_addr* a) {
  memset(a, 0, sizeof(*a));
  if (w->port == 0) return -1;
  if (w->family == AF_INET) {
    a->sin.sin_family = AF_INET;
    a->sin.sin_port = w->port;
    memcpy(&a->sin.sin_addr, w->addr, 4);
    return 0;
  }
  if (w->family == AF_INET6) {
    a->sin6.sin6_family = AF_INET6;
    a->sin6.sin6_port = w->port;
    a->sin6.sin6_scope_id = w->scope;
    memcpy(&a->sin6.sin6_addr, w->addr, 16);
    return 0;
  }
  return -1;
}

socklen_t socket_addr_len(const union socket_addr* a) {
  return a->sa.sa_family == AF_INET6 ? sizeof(a->sin6) : sizeof(a->sin);
}

const char* socket_addr_str(const union socket_addr* a, char* buf, size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a->sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &a->sin.sin_addr, host, sizeof(host));
    snprintf(buf, len, "%s<%u>", host, ntohs(a->sin.sin_port));
  } else if (a->sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &a->sin6.sin6_addr, host, sizeof(host));
    snprintf(buf, len, "[%s]<%u>", host, ntohs(a->sin6.sin6_port));
  } else {
    snprintf(buf, len, "<unknown family %d>", a->sa.sa_family);
  }
  return buf;
}

int socket_ifname_match(const char* spec, const char* ifname) {
  int exclude = 0, exact = 0;
  if (*spec == '^') exclude = 1, spec++;
  if (*spec == '=') exact = 1, spec++;
  int hit = 0;
  while (*spec && !hit) {
    size_t len = strcspn(spec, ",");
    if (len > 0)
      hit = exact ? (strlen(ifname) == len && strncmp(ifname, spec, len) == 0)
                  : strncmp(ifname, spec, len) == 0;
    spec += len;
    if (*spec == ',') spec++;
  }
  return exclude ? !hit : hit;
}

ncclResult_t socket_parse_hostport(const char* s, union socket_addr* out) {
  ncclResult_t res = ncclSuccess;
  char host[256];
  const char* colon = strrchr(s, ':');
  if (colon == NULL || colon == s || strlen(colon + 1) == 0)
    FAIL(ncclInvalidArgument, "Invalid address '%s': expected host:port", s);
  size_t hlen = (size_t)(colon - s);
  if (hlen >= sizeof(host)) FAIL(ncclInvalidArgument, "Invalid address '%s': host too long", s);
  memcpy(host, s, hlen);
  host[hlen] = '\0';
  if (host[0] == '[' && host[hlen - 1] == ']') {
    memmove(host, host + 1, hlen - 2);
    host[hlen - 2] = '\0';
  }
  char* end;
  long port = strtol(colon + 1, &end, 10);
  if (*end != '\0' || port <= 0 || port > 65535)
    FAIL(ncclInvalidArgument, "Invalid port in address '%s'", s);
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, NULL, &hints, &ai);
  if (rc != 0 || ai == NULL)
    FAIL(ncclInvalidArgument, "Cannot resolve host '%s': %s", host, gai_strerror(rc));
  memset(out, 0, sizeof(*out));
  memcpy(out, ai->ai_addr, MIN(ai->ai_addrlen, sizeof(*out)));
  freeaddrinfo(ai);
  if (out->sa.sa_family == AF_INET)
    out->sin.sin_port = htons((uint16_t)port);
  else
    out->sin6.sin6_port = htons((uint16_t)port);
fail:
  return res;
}

/* First address of an interface accepted by `spec` and the family filter.
 * IPv6 link-local addresses are taken only when IPv6 is asked for. */
static int find_interface(const char* spec, int family, union socket_addr* addr, char* ifname,
                          size_t iflen) {
  struct ifaddrs *list, *it;
  int found = 0;
  if (getifaddrs(&list) != 0) return 0;
  for (it = list; it && !found; it = it->ifa_next) {
    if (it->ifa_addr == NULL || !(it->ifa_flags & IFF_UP)) continue;
    int fam = it->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (family != AF_UNSPEC && fam != family) continue;
    if (family == AF_UNSPEC && fam == AF_INET6) continue; /* prefer IPv4 by default */
    if (!socket_ifname_match(spec, it->ifa_name)) continue;
    memset(addr, 0, sizeof(*addr));
    memcpy(addr, it->ifa_addr, fam == AF_INET ? sizeof(addr->sin) : sizeof(addr->sin6));
    snprintf(ifname, iflen, "%s", it->ifa_name);
    found = 1;
  }
  freeifaddrs(list);
  return found;
}

static struct {
  pthread_once_t once;
  ncclResult_t res;
  union socket_addr addr;
  char ifname[IF_NAMESIZE + 1];
} g_local = {PTHREAD_ONCE_INIT, ncclSuccess, {{0}}, ""};

static int parse_family(const char* s) {
  if (s == NULL) return AF_UNSPEC;
  if (strcasecmp(s, "AF_INET") == 0 || strcmp(s, "4") == 0) return AF_INET;
  if (strcasecmp(s, "AF_INET6") == 0 || strcmp(s, "6") == 0) return AF_INET6;
  WARN("Unknown NCCL_SOCKET_FAMILY %s, ignoring it", s);
  return AF_UNSPEC;
}

static void choose_local_addr(void) {
  const char* spec = param_socket_ifname();
  int family = parse_family(param_socket_family());
  char* ifn = g_local.ifname;
  size_t n = sizeof(g_local.ifname);
  int ok;
  if (spec) {
    ok = find_interface(spec, family, &g_local.addr, ifn, n);
  } else {
    /* NCCL's default: anything but docker and loopback, then loopback. */
    ok = find_interface("^docker,lo", family, &g_local.addr, ifn, n) ||
         find_interface("lo", family, &g_local.addr, ifn, n);
    if (!ok && family == AF_UNSPEC) ok = find_interface("", AF_INET6, &g_local.addr, ifn, n);
  }
  if (!ok) {
    WARN("No usable network interface found (NCCL_SOCKET_IFNAME=%s, NCCL_SOCKET_FAMILY=%s)",
         spec ? spec : "", param_socket_family() ? param_socket_family() : "");
    g_local.res = ncclSystemError;
    return;
  }
  char buf[SOCKET_ADDR_STRLEN];
  INFO(SUB_INIT | SUB_NET, "Bootstrap : Using %s:%s", ifn,
       socket_addr_str(&g_local.addr, buf, sizeof(buf)));
}

ncclResult_t socket_local_addr(union socket_addr* addr, char* ifname, size_t iflen) {
  pthread_once(&g_local.once, choose_local_addr);
  if (g_local.res != ncclSuccess) return g_local.res;
  *addr = g_local.addr;
  if (ifname) snprintf(ifname, iflen, "%s", g_local.ifname);
  return ncclSuccess;
}

static int set_nonblock(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags < 0 ? -1 : fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void socket_tune_data(int fd, int bufsize) {
  /* Keepalive finds a peer whose host vanished (no FIN, no RST) in ~25 s,
   * without putting a deadline on peers that are merely late. */
  int one = 1, idle = 10, intvl = 5, cnt = 3;
  set_nonblock(fd);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
  if (bufsize > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof(bufsize));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof(bufsize));
  }
}

void socket_push(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* pushes what is held */
}

ncclResult_t socket_try_listen(union socket_addr* addr, int* fdp, int* err) {
  int one = 1;
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) goto fail;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, &addr->sa, socket_addr_len(addr)) != 0 || listen(fd, 16384) != 0) goto fail;
  socklen_t len = sizeof(*addr);
  getsockname(fd, &addr->sa, &len);
  set_nonblock(fd);
  *fdp = fd;
  *err = 0;
  return ncclSuccess;
fail:
  *err = errno;
  if (fd >= 0) close(fd);
  return ncclSystemError;
}

ncclResult_t socket_listen(union socket_addr* addr, int* fdp) {
  char buf[SOCKET_ADDR_STRLEN];
  int err;
  ncclResult_t res = socket_try_listen(addr, fdp, &err);
  if (res != ncclSuccess)
    WARN("Cannot listen on %s: %s", socket_addr_str(addr, buf, sizeof(buf)), strerror(err));
  return res;
}

ncclResult_t socket_wait(int fd, short events, uint64_t deadline_ns, _Atomic int* aborted,
                         const char* what) {
  for (;;) {
    uint64_t now = braid_now_ns();
    if (aborted && atomic_load(aborted)) {
      WARN("Communicator aborted while waiting to %s", what);
      return ncclSystemError;
    }
    if (now >= deadline_ns) {
      WARN("Timeout waiting to %s (BRAID_TIMEOUT_MS=%lld)", what, (long long)param_timeout_ms());
      return ncclSystemError;
    }
    struct pollfd p = {fd, events, 0};
    int ms = (int)MIN((deadline_ns - now) / 1000000ull + 1, 100ull); /* abort is seen in 0.1 s */
    int rc = poll(&p, 1, ms);
    if (rc > 0) return ncclSuccess;
    if (rc < 0 && errno != EINTR) {
      WARN("poll() failed while waiting to %s: %s", what, strerror(errno));
      return ncclSystemError;
    }
  }
}

/* A socket for connecting to `addr`, bound to from's address (any port)
 * when from is not NULL. */
static ncclResult_t socket_for(const union socket_addr* addr, const union socket_addr* from,
                               int* fdp) {
  char buf[SOCKET_ADDR_STRLEN];
  int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    WARN("socket() failed: %s", strerror(errno));
    return ncclSystemError;
  }
  if (from) {
    union socket_addr any = *from;
    if (any.sa.sa_family == AF_INET)
      any.sin.sin_port = 0;
    else
      any.sin6.sin6_port = 0;
    if (bind(fd, &any.sa, socket_addr_len(&any)) != 0) {
      WARN("Cannot bind a connection to %s: %s", socket_addr_str(&any, buf, sizeof(buf)),
           strerror(errno));
      close(fd);
      return ncclSystemError;
    }
  }
  *fdp = fd;
  return ncclSuccess;
}

ncclResult_t socket_connect(const union socket_addr* addr, uint64_t deadline_ns,
                            _Atomic int* aborted, int* fdp) {
  return socket_connect_from(addr, NULL, deadline_ns, aborted, fdp);
}

/* A peer may not be listening yet: retry refused connections until the
 * deadline, with a short back-off. */
ncclResult_t socket_connect_from(const union socket_addr* addr, const union socket_addr* from,
                                 uint64_t deadline_ns, _Atomic int* aborted, int* fdp) {
  ncclResult_t res = ncclSuccess;
  char buf[SOCKET_ADDR_STRLEN];
  int fd = -1;
  for (;;) {
    CHECK(socket_for(addr, from, &fd));
    int rc = connect(fd, &addr->sa, socket_addr_len(addr));
    if (rc != 0 && errno == EINPROGRESS) {
      CHECK(socket_wait(fd, POLLOUT, deadline_ns, aborted, "connect"));
      socklen_t len = sizeof(rc);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &rc, &len);
      errno = rc;
    }
    if (rc == 0) break;
    if (errno != ECONNREFUSED && errno != ETIMEDOUT && errno != EAGAIN)
      FAIL(ncclSystemError, "connect to %s failed: %s", socket_addr_str(addr, buf, sizeof(buf)),
           strerror(errno));
    close(fd);
    fd = -1;
    if (braid_now_ns() >= deadline_ns)
      FAIL(ncclSystemError, "connect to %s timed out: %s", socket_addr_str(addr, buf, sizeof(buf)),
           strerror(errno));
    if (aborted && atomic_load(aborted))
      FAIL(ncclSystemError, "Communicator aborted while connecting to %s",
           socket_addr_str(addr, buf, sizeof(buf)));
    usleep(10000);
  }
  *fdp = fd;
  return ncclSuccess;
fail:
  if (fd >= 0) close(fd);
  return res;
}

ncclResult_t socket_send_all(int fd, const void* buf, size_t len, uint64_t deadline_ns,
                             _Atomic int* aborted) {
  ncclResult_t res = ncclSuccess;
  const char* p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      CHECK(socket_wait(fd, POLLOUT, deadline_ns, aborted, "send"));
    } else {
      FAIL(ncclRemoteError, "send() failed: peer gone (%s)", strerror(errno));
    }
  }
fail:
  return res;
}

ncclResult_t socket_recv_all(int fd, void* buf, size_t len, uint64_t deadline_ns,
                             _Atomic int* aborted) {
  ncclResult_t res = ncclSuccess;
  char* p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= (size_t)n;
    } else if (n == 0) {
      FAIL(ncclRemoteError, "Connection closed by remote peer");
    } else if (errno == EAGAIN || errno == EINTR) {
      CHECK(socket_wait(fd, POLLIN, deadline_ns, aborted, "receive"));
    } else {
      FAIL(ncclRemoteError, "recv() failed: %s", strerror(errno));
    }
  }
fail:
  return res;
}
