/* NCCL_DEBUG and NCCL_DEBUG_SUBSYS (debug_parse_level, debug_parse_subsys,
 * common/debug.c). Properties: a level is one of the enum; a leading '^' gives
 * the complement of the subsystems. */
#include "debug.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  char* s = fuzz_str(data, size);
  enum debug_level l = debug_parse_level(s);
  FUZZ_ASSERT(l >= DEBUG_NONE && l <= DEBUG_TRACE);
  uint32_t mask = debug_parse_subsys(s);
  if (s[0] != '\0' && s[0] != '^') {
    char* inverted = fuzz_str_caret(s);
    FUZZ_ASSERT(debug_parse_subsys(inverted) == ~mask);
    free(inverted);
  }
  free(s);
  return 0;
}
