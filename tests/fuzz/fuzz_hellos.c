/* The first bytes a stranger sends: the bootstrap root's hello check
 * (bootstrap_hello_stranger, src/bootstrap/bootstrap_root.c) and a TCP data
 * listener's (tcp_hello_problem, transports/tcp/tcp_connect.c). Properties:
 * a root hello passes only with Braid's magic, this protocol version and
 * the job key; a TCP hello passes only with the data secret, for this rank,
 * from a rank of the comm, with socket numbering and channel in range. */
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "bootstrap/bootstrap_root.h"
#include "fuzz.h"
#include "tcp/tcp.h"
#include "tcp/tcp_connect.h"

#define FUZZ_KEY 0x0123456789abcdefull

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct root_hello rh;
  struct tcp_hello th;
  struct transport_ctx ctx = {.rank = 3, .nranks = 8, .secret = FUZZ_KEY};
  memset(&rh, 0, sizeof(rh));
  memset(&th, 0, sizeof(th));
  memcpy(&rh, data, size < sizeof(rh) ? size : sizeof(rh));
  memcpy(&th, data, size < sizeof(th) ? size : sizeof(th));
  if (bootstrap_hello_stranger(&rh, FUZZ_KEY) == NULL)
    FUZZ_ASSERT(rh.magic == BOOTSTRAP_MAGIC && rh.version == BOOTSTRAP_VERSION &&
                rh.key == FUZZ_KEY);
  if (tcp_hello_problem(&ctx, &th) == NULL) {
    FUZZ_ASSERT(th.magic == TCP_MAGIC && th.version == TCP_VERSION && th.secret == FUZZ_KEY);
    FUZZ_ASSERT(th.to == ctx.rank && th.from >= 0 && th.from < ctx.nranks);
    FUZZ_ASSERT(th.nsocks >= 1 && th.nsocks <= TCP_MAX_SOCKS && th.sock_idx >= 0 &&
                th.sock_idx < th.nsocks && (th.channel == 0 || th.channel == 1));
  }
  return 0;
}
