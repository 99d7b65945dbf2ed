/* The TCP receive path (transports/tcp/tcp.c) fed by whoever holds the
 * other end of a data socket: the input's first bytes choose how many
 * receives are posted and their sizes, the rest arrives on the socket as
 * frames and parts (or anything else), then the sender closes. Properties:
 * nothing is written outside the posted buffers (AddressSanitizer), never
 * more messages complete than were posted, a completed message holds what
 * followed a frame that named its sequence number and size, and a refused
 * one says why (conn->mismatch). */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "tcp/tcp.h"
#include "tcp/tcp_connect.h"

#define FUZZ_MSGS 4
#define FUZZ_SIZE_UNIT 17 /* message sizes 0 .. 255 x 17 bytes */

/* Where message k's part starts in the stream, if every frame before it
 * matched; -1 when the stream does not hold a matching frame for it. */
static long expected_part(const uint8_t* s, size_t n, const size_t* sizes, int k) {
  static const struct transport_tag none;
  size_t off = 0;
  for (int i = 0; i <= k; i++) {
    struct tcp_frame f;
    if (off + sizeof(f) > n) return -1;
    memcpy(&f, s + off, sizeof(f));
    if (f.seq != (uint64_t)i || f.msg_bytes != sizes[i] || memcmp(&f.tag, &none, sizeof(none)))
      return -1;
    off += sizeof(f);
    if (i == k) return (long)off;
    off += sizes[i];
  }
  return -1;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  int sv[2], nmsgs, progressed = 1;
  size_t sizes[FUZZ_MSGS];
  char* bufs[FUZZ_MSGS] = {NULL};
  struct tcp_conn* c = NULL;
  ncclResult_t res = ncclSuccess;
  if (size < 1) return 0;
  nmsgs = 1 + data[0] % FUZZ_MSGS;
  if (size < 1 + (size_t)nmsgs) return 0;
  const uint8_t* stream = data + 1 + nmsgs;
  size_t n = size - 1 - (size_t)nmsgs;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
  FUZZ_ASSERT(tcp_conn_alloc(0, 0, 1, &c) == ncclSuccess);
  c->socks[0].fd = sv[0];
  for (int i = 0; i < nmsgs; i++) {
    sizes[i] = (size_t)data[1 + i] * FUZZ_SIZE_UNIT;
    bufs[i] = malloc(sizes[i] ? sizes[i] : 1);
    FUZZ_ASSERT(transport_post_host(&c->base, bufs[i], sizes[i], NULL) == ncclSuccess);
  }
  FUZZ_ASSERT(write(sv[1], stream, n) == (ssize_t)n); /* fits: inputs stay small */
  shutdown(sv[1], SHUT_WR);
  while (res == ncclSuccess && progressed && c->base.completed < c->base.posted) {
    progressed = 0;
    res = tcp_transport.progress(&c->base, &progressed);
  }
  FUZZ_ASSERT(c->base.completed <= c->base.posted);
  if (res == ncclInvalidUsage) FUZZ_ASSERT(c->base.mismatch != TRANSPORT_MATCH);
  for (int k = 0; k < (int)c->base.completed; k++) {
    long at = expected_part(stream, n, sizes, k);
    FUZZ_ASSERT(at >= 0 && (size_t)at + sizes[k] <= n);
    FUZZ_ASSERT(memcmp(bufs[k], stream + at, sizes[k]) == 0);
  }
  tcp_transport.close(&c->base);
  close(sv[1]);
  for (int i = 0; i < nmsgs; i++) free(bufs[i]);
  return 0;
}
