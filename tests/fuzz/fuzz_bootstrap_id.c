/* The unique id decoder (bootstrap_id_decode, src/bootstrap/bootstrap.c): 128 bytes
 * from the user (the input, zero-padded or cut). Properties: an id that
 * decodes names a usable root address, and encoding it again and decoding
 * gives the same id. */
#include <string.h>

#include "bootstrap/bootstrap.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ncclUniqueId in, out;
  struct bootstrap_id id, again;
  union socket_addr a;
  char buf[SOCKET_ADDR_STRLEN];
  memset(&in, 0, sizeof(in));
  memcpy(in.internal, data, size < sizeof(in.internal) ? size : sizeof(in.internal));
  if (bootstrap_id_decode(&in, &id) != ncclSuccess) return 0;
  FUZZ_ASSERT(id.magic == BOOTSTRAP_MAGIC && id.version == BOOTSTRAP_VERSION);
  FUZZ_ASSERT(socket_addr_from_wire(&id.root, &a) == 0);
  socket_addr_str(&a, buf, sizeof(buf));
  bootstrap_id_encode(&id, &out);
  FUZZ_ASSERT(bootstrap_id_decode(&out, &again) == ncclSuccess);
  FUZZ_ASSERT(memcmp(&id, &again, sizeof(id)) == 0);
  return 0;
}
