/*
 * Socket helpers shared by the bootstrap and the TCP transport: interface
 * choice (NCCL_SOCKET_IFNAME / NCCL_SOCKET_FAMILY), address formats, and
 * blocking operations bounded by a deadline.
 */
#ifndef BRAID_SOCKET_H_
#define BRAID_SOCKET_H_

#include <netinet/in.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "nccl.h"

union socket_addr {
  struct sockaddr sa;
  struct sockaddr_in sin;
  struct sockaddr_in6 sin6;
};

/* Fixed-size, byte-order-defined form of an address for ids and peer tables. */
struct socket_wire_addr {
  uint16_t family; /* AF_INET or AF_INET6 */
  uint16_t port;   /* network byte order */
  uint32_t scope;  /* IPv6 scope id */
  uint8_t addr[16];
};

#define SOCKET_ADDR_STRLEN 64

void socket_addr_to_wire(const union socket_addr* a, struct socket_wire_addr* w);
/* Returns -1 when the wire form is not a usable address. */
int socket_addr_from_wire(const struct socket_wire_addr* w, union socket_addr* a);
socklen_t socket_addr_len(const union socket_addr* a);
const char* socket_addr_str(const union socket_addr* a, char* buf, size_t len);

/* NCCL_SOCKET_IFNAME rules: comma list of prefixes; leading '^' excludes,
 * a following '=' requires exact names. Returns 1 when ifname is selected. */
int socket_ifname_match(const char* spec, const char* ifname);

/* "host:port", "[v6addr]:port" or "v6addr:port" (last colon splits). */
ncclResult_t socket_parse_hostport(const char* s, union socket_addr* out);

/* The address this process uses for bootstrap and data (chosen once). */
ncclResult_t socket_local_addr(union socket_addr* addr, char* ifname, size_t iflen);

/* A non-blocking listener on addr (port 0: any; the chosen one is written
 * back). socket_try_listen is quiet and tells why it failed in *err (an
 * errno value); socket_listen WARNs. */
ncclResult_t socket_try_listen(union socket_addr* addr, int* fd, int* err);
ncclResult_t socket_listen(union socket_addr* addr, int* fd);
/* Every wait below fails at the deadline, or as soon as *aborted (when
 * not NULL) is set: ncclCommAbort reaches them within 0.1 s. */
ncclResult_t socket_connect(const union socket_addr* addr, uint64_t deadline_ns,
                            _Atomic int* aborted, int* fd);
/* The same from the IP address of `from` (its port is ignored): a peer
 * that checks where a connection comes from sees that address. */
ncclResult_t socket_connect_from(const union socket_addr* addr, const union socket_addr* from,
                                 uint64_t deadline_ns, _Atomic int* aborted, int* fd);
/* Wait until fd is ready for `events`. */
ncclResult_t socket_wait(int fd, short events, uint64_t deadline_ns, _Atomic int* aborted,
                         const char* what);
ncclResult_t socket_send_all(int fd, const void* buf, size_t len, uint64_t deadline_ns,
                             _Atomic int* aborted);
ncclResult_t socket_recv_all(int fd, void* buf, size_t len, uint64_t deadline_ns,
                             _Atomic int* aborted);

/* Data-path socket options: non-blocking, TCP_NODELAY, buffer sizes. */
void socket_tune_data(int fd, int bufsize);

/* Send now the bytes the kernel holds back on a data socket. Autocorking
 * keeps a write's last small segment while earlier ones of the socket
 * still wait in the host's queue, and sends it only when they leave: on
 * a rate-limited link (tc's tbf or htb) that held a frame's tail, and the
 * frame, 10-85 ms (recursive doubling 256 KiB over 4 hosts at 1 Gbit/s:
 * 21 ms a call instead of 3.3). */
void socket_push(int fd);

/* Deadline `ms` milliseconds from now. */
uint64_t socket_deadline(int64_t ms);

#endif /* BRAID_SOCKET_H_ */
