/*
 * The other end of a TCP connection (socket_peer.h).
 */
#include "socket_peer.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int addr_pair(int fd, union socket_addr* here, union socket_addr* there) {
  socklen_t a = sizeof(*here), b = sizeof(*there);
  return getsockname(fd, &here->sa, &a) == 0 && getpeername(fd, &there->sa, &b) == 0;
}

/* An IPv4-mapped IPv6 address as plain IPv4 (dual-stack listeners). */
static void addr_unmap(union socket_addr* a) {
  if (a->sa.sa_family != AF_INET6 || !IN6_IS_ADDR_V4MAPPED(&a->sin6.sin6_addr)) return;
  struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = a->sin6.sin6_port};
  memcpy(&v4.sin_addr, &a->sin6.sin6_addr.s6_addr[12], 4);
  a->sin = v4;
}

static int same_ip(const union socket_addr* x, const union socket_addr* y) {
  if (x->sa.sa_family != y->sa.sa_family) return 0;
  if (x->sa.sa_family == AF_INET) return x->sin.sin_addr.s_addr == y->sin.sin_addr.s_addr;
  return memcmp(&x->sin6.sin6_addr, &y->sin6.sin6_addr, sizeof(struct in6_addr)) == 0;
}

static int is_loopback(const union socket_addr* a) {
  if (a->sa.sa_family == AF_INET) return (ntohl(a->sin.sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&a->sin6.sin6_addr);
}

int socket_peer_local(int fd) {
  union socket_addr here, there;
  if (!addr_pair(fd, &here, &there)) return 0;
  addr_unmap(&here);
  addr_unmap(&there);
  return is_loopback(&there) || same_ip(&here, &there);
}

int socket_peer_from(int fd, const union socket_addr* addr) {
  union socket_addr here, there, want = *addr;
  if (!addr_pair(fd, &here, &there)) return 0;
  addr_unmap(&there);
  addr_unmap(&want);
  return same_ip(&there, &want);
}

/* An address as /proc/net/tcp{,6} prints it: the address words as the
 * kernel holds them, in hex, then the port. */
static void proc_form(const union socket_addr* a, char* out, size_t len) {
  if (a->sa.sa_family == AF_INET) {
    snprintf(out, len, "%08X:%04X", (unsigned)a->sin.sin_addr.s_addr, ntohs(a->sin.sin_port));
    return;
  }
  uint32_t w[4];
  memcpy(w, &a->sin6.sin6_addr, sizeof(w));
  snprintf(out, len, "%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3], ntohs(a->sin6.sin6_port));
}

/* The inode of the socket whose local end is `local` and remote end
 * `remote`, from /proc/net/tcp (or tcp6); 0 if none. */
static unsigned long proc_socket_inode(const union socket_addr* local,
                                       const union socket_addr* remote) {
  char want_local[64], want_remote[64], line[512], l[64], r[64];
  unsigned long inode = 0, found = 0;
  proc_form(local, want_local, sizeof(want_local));
  proc_form(remote, want_remote, sizeof(want_remote));
  FILE* f = fopen(local->sa.sa_family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6", "re");
  if (f == NULL) return 0;
  while (!found && fgets(line, sizeof(line), f))
    if (sscanf(line, " %*d: %63s %63s %*x %*s %*s %*s %*u %*d %lu", l, r, &inode) == 3 &&
        strcmp(l, want_local) == 0 && strcmp(r, want_remote) == 0)
      found = inode;
  fclose(f);
  return found;
}

/* Whether pid has the socket `inode` among its descriptors. */
static int process_holds(pid_t pid, unsigned long inode) {
  char dir[64], path[320], link[64], want[64];
  int held = 0;
  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
  snprintf(want, sizeof(want), "socket:[%lu]", inode);
  DIR* d = opendir(dir);
  for (struct dirent* e; d && !held && (e = readdir(d)) != NULL;) {
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n <= 0) continue;
    link[n] = '\0';
    held = strcmp(link, want) == 0;
  }
  if (d) closedir(d);
  return held;
}

/* The peer's socket is in the table of the family it was made with: ours,
 * or IPv4 when it reached our dual-stack socket through a mapped address. */
int socket_peer_held_by(int fd, pid_t pid) {
  union socket_addr here, there;
  if (!addr_pair(fd, &here, &there)) return 0;
  unsigned long inode = proc_socket_inode(&there, &here);
  if (inode == 0 && there.sa.sa_family == AF_INET6) {
    addr_unmap(&here);
    addr_unmap(&there);
    if (there.sa.sa_family == AF_INET) inode = proc_socket_inode(&there, &here);
  }
  return inode != 0 && process_holds(pid, inode);
}
