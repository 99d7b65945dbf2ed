/* NCCL_COMM_ID's "host:port" (socket_parse_hostport, common/socket.c), numeric
 * hosts only (common.c wraps getaddrinfo). Property: an address that parses
 * has a port and survives the wire format the unique id carries. */
#include <string.h>

#include "fuzz.h"
#include "socket.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* s = fuzz_str(data, size);
  union socket_addr a, back;
  char buf[SOCKET_ADDR_STRLEN];
  if (socket_parse_hostport(s, &a) == ncclSuccess) {
    struct socket_wire_addr w;
    FUZZ_ASSERT(a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6);
    socket_addr_to_wire(&a, &w);
    FUZZ_ASSERT(w.port != 0);
    FUZZ_ASSERT(socket_addr_from_wire(&w, &back) == 0);
    FUZZ_ASSERT(memcmp(&a, &back, socket_addr_len(&a)) == 0);
    socket_addr_str(&a, buf, sizeof(buf));
  }
  free(s);
  return 0;
}
