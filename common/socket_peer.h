/*
 * Who is at the other end of a TCP connection. A peer's address says
 * which host it came from; on this host, where every process shares the
 * addresses, only the kernel's tables tell which process holds the other
 * end: /proc/net/tcp{,6} gives the peer socket's inode, and the process
 * that holds it has that inode among its descriptors.
 */
#ifndef BRAID_SOCKET_PEER_H_
#define BRAID_SOCKET_PEER_H_

#include <sys/types.h>

#include "socket.h"

/* Whether the connection's other end is in this network namespace: its
 * address is a loopback one or this end's own. */
int socket_peer_local(int fd);
/* Whether the other end's IP address (port aside) is `addr`'s. */
int socket_peer_from(int fd, const union socket_addr* addr);
/* Whether process `pid` holds the other end of connection fd, which
 * socket_peer_local says is on this host. */
int socket_peer_held_by(int fd, pid_t pid);

#endif /* BRAID_SOCKET_PEER_H_ */
