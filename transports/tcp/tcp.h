/*
 * TCP transport, shared between its connection setup (tcp_connect.h) and
 * its data path (tcp.c): the wire formats and the connection.
 *
 * Several sockets per peer; large messages are striped across them, small
 * ones rotated. Every socket opens with a hello carrying the data secret;
 * every part of a message on a socket is preceded by a frame with the
 * message's sequence number, size and call, which the receiver checks
 * before it takes the bytes.
 */
#ifndef BRAID_TCP_H_
#define BRAID_TCP_H_

#include <stddef.h>
#include <stdint.h>

#include "transport.h"

#define TCP_MAGIC 0x50435442u /* "BTCP" */
#define TCP_VERSION 4u        /* 4: framed parts; 3: the collective channel is duplex */
#define TCP_MAX_SOCKS 64
/* Below this many bytes per socket a message travels whole on one socket:
 * striping it would cost more syscalls than it saves. */
#define TCP_STRIPE_MIN (64 * 1024)

/* What TCP publishes about a rank (its transport blob). */
struct tcp_blob {
  struct socket_wire_addr listen; /* where its data listener accepts */
};

/* The first bytes on every socket. */
struct tcp_hello {
  uint32_t magic;
  uint32_t version;
  uint64_t secret;
  int32_t from;
  int32_t to;
  int32_t sock_idx;
  int32_t nsocks;
  int32_t channel;
  int32_t reserved;
};

/* Out-of-band sockets (tcp_connect.h): hello channels past TCP's own. */
#define TCP_OOB_CHANNELS 2
#define TCP_OOB_CHANNEL(channel) (2 + (channel))

/* What precedes each part of a message on a socket. */
struct tcp_frame {
  uint64_t seq;       /* message number on the connection */
  uint64_t msg_bytes; /* the whole message */
  struct transport_tag tag;
};

struct tcp_msg {
  char* buf;
  size_t bytes;
  int parts_left;
  struct transport_tag tag;
};

struct tcp_sock {
  int fd;
  uint64_t cursor;        /* message this socket works on */
  size_t done;            /* bytes of its frame and part already moved */
  struct tcp_frame frame; /* the frame going out, or coming in */
  int unpushed;           /* a sender's frames written since its last push */
};

struct tcp_conn {
  struct transport_conn base;
  struct transport_waits* waits; /* the comm's: a blocked conn counts itself there */
  struct tcp_conn* twin;         /* duplex: the other direction on the same sockets */
  int nsocks;
  struct tcp_sock socks[TCP_MAX_SOCKS];
  struct tcp_msg msgs[TRANSPORT_MAX_INFLIGHT];
};

#endif /* BRAID_TCP_H_ */
