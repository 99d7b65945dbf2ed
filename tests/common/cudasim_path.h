/*
 * Where the unit tests of the device path find the simulated driver:
 * build/tests/libcudasim.so, beside the test binary itself.
 */
#ifndef BRAID_TESTS_CUDASIM_PATH_H_
#define BRAID_TESTS_CUDASIM_PATH_H_

#include <stdio.h>
#include <string.h>

/* lib = argv0's directory + "libcudasim.so". */
static inline void cudasim_path_beside(const char* argv0, char* lib, size_t len) {
  snprintf(lib, len, "%s", argv0);
  char* slash = strrchr(lib, '/');
  char* name = slash ? slash + 1 : lib;
  snprintf(name, len - (size_t)(name - lib), "libcudasim.so");
}

#endif /* BRAID_TESTS_CUDASIM_PATH_H_ */
