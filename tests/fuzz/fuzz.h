/* libFuzzer targets (make fuzz, scripts/fuzz.sh): what every target shares.
 * A target is one file tests/fuzz/fuzz_<name>.c that defines
 * LLVMFuzzerTestOneInput; seeds, when it has some, go in
 * tests/fuzz/corpus/<name>/ and a dictionary in tests/fuzz/<name>.dict. */
#ifndef BRAID_FUZZ_H_
#define BRAID_FUZZ_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

/* data[0..size) as a C string in a block of exactly size + 1 bytes, so that
 * AddressSanitizer catches a read past its NUL; free() it. */
char* fuzz_str(const uint8_t* data, size_t size);

/* "^" followed by s, in a block of its exact size; free() it. */
char* fuzz_str_caret(const char* s);

/* A property of the code under test that must hold: a crash when it does not. */
#define FUZZ_ASSERT(cond)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      fprintf(stderr, "%s:%d: fuzz property failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                         \
    }                                                                                  \
  } while (0)

#endif /* BRAID_FUZZ_H_ */
