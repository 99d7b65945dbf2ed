/*
 * A listener and the connections it accepted that have not yet sent their
 * fixed-size hello. Every pending connection is read as its bytes come, at
 * once with all the others, each against its own deadline, so an idle or
 * slow stranger never delays anyone; at most `max_pending` wait, the
 * oldest giving way to a new one. Serves the bootstrap root and the TCP
 * transport's data listener.
 */
#ifndef BRAID_HELLO_POOL_H_
#define BRAID_HELLO_POOL_H_

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

/* The largest hello a pool takes: the bootstrap root's carries a peer_info
 * (288 bytes with the transports' blobs). A pool reads exactly its own
 * size; this only bounds the slot of each pending connection. */
#define HELLO_POOL_MAX_BYTES 512

struct hello_pending {
  int fd;
  uint64_t deadline_ns;
  size_t got;
  unsigned char buf[HELLO_POOL_MAX_BYTES];
};

/* A complete hello: `fd` is now the callee's (keep it or close it). */
typedef void (*hello_pool_done_fn)(void* arg, int fd, const void* hello);

struct hello_pool {
  const char* who; /* for the log: "Bootstrap root", "NET/Socket" */
  int listen_fd;
  size_t hello_bytes;
  int64_t hello_ms;
  int max_pending;
  int npending;
  struct hello_pending* pending;
  uint64_t dropped; /* connections that never sent a whole hello in time */
  /* Optional, set after init: why a connection may not even send its
   * hello (NULL: it may), so that strangers never take a pending slot. */
  const char* (*admit)(int fd);
};

ncclResult_t hello_pool_init(struct hello_pool* pool, const char* who, int listen_fd,
                             size_t hello_bytes, int64_t hello_ms, int max_pending);
/* Closes the pending connections (not the listener). */
void hello_pool_free(struct hello_pool* pool);

/* The listener and every pending connection, into p (room for
 * 1 + max_pending); returns how many. */
int hello_pool_pollfds(const struct hello_pool* pool, struct pollfd* p);
/* Milliseconds until the first pending deadline, capped at cap_ms. */
int hello_pool_timeout_ms(const struct hello_pool* pool, int cap_ms);
/* After poll() on what hello_pool_pollfds gave: accept what waits, read
 * what pending connections sent, hand every complete hello to done(), and
 * drop connections past their deadline or closed. */
void hello_pool_service(struct hello_pool* pool, const struct pollfd* p, int n,
                        hello_pool_done_fn done, void* arg);

/* What a refused connection is told is up to the caller; this logs it,
 * WARN for the first few of a pool and INFO after, so a flood of strangers
 * cannot flood the log. */
void hello_pool_log_refusal(struct hello_pool* pool, const char* why);

#endif /* BRAID_HELLO_POOL_H_ */
