/* Integer knobs with K/M/G suffixes (param_parse_int, common/param.c). Property:
 * a value that parses prints back, with its suffix, to the same value. */
#include <inttypes.h>
#include <string.h>

#include "fuzz.h"
#include "param.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* s = fuzz_str(data, size);
  int64_t v, again;
  if (param_parse_int(s, &v) == 0) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64, v);
    FUZZ_ASSERT(param_parse_int(buf, &again) == 0 && again == v);
    if (v % (1 << 20) == 0) {
      snprintf(buf, sizeof(buf), "%" PRId64 "M", v / (1 << 20));
      FUZZ_ASSERT(param_parse_int(buf, &again) == 0 && again == v);
    }
  }
  free(s);
  return 0;
}
