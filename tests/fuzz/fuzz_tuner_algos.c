/* NCCL_ALGO lists (tuner_parse_algos, src/tune/tuner.c). Properties: only
 * algorithm bits, and a leading '^' gives the complement. */
#include "comm/comm.h"
#include "fuzz.h"
#include "schedule.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const unsigned all = (1u << ALGO_COUNT) - 1;
  char* s = fuzz_str(data, size);
  unsigned mask = tuner_parse_algos(s);
  FUZZ_ASSERT((mask & ~all) == 0);
  if (s[0] != '\0' && s[0] != '^') {
    char* inverted = fuzz_str_caret(s);
    FUZZ_ASSERT(tuner_parse_algos(inverted) == (all & ~mask));
    free(inverted);
  }
  free(s);
  return 0;
}
