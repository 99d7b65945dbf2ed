/* NCCL_SOCKET_IFNAME rules (socket_ifname_match, common/socket.c): input is
 * "spec\0ifname". Property: a leading '^' inverts the answer. */
#include <string.h>

#include "fuzz.h"
#include "socket.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint8_t* nul = memchr(data, '\0', size);
  size_t n = nul ? (size_t)(nul - data) : size;
  char* spec = fuzz_str(data, n);
  char* ifname = nul ? fuzz_str(nul + 1, size - n - 1) : fuzz_str(data, 0);
  int hit = socket_ifname_match(spec, ifname);
  FUZZ_ASSERT(hit == 0 || hit == 1);
  if (spec[0] != '^') {
    char* inverted = fuzz_str_caret(spec);
    FUZZ_ASSERT(socket_ifname_match(inverted, ifname) == !hit);
    free(inverted);
  }
  free(spec);
  free(ifname);
  return 0;
}
