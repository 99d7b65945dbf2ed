/* Linked into every fuzz target: string helpers, logging that formats every
 * message (into /dev/null), and name resolution limited to numeric addresses. */
#include <netdb.h>
#include <string.h>

#include "fuzz.h"

char* fuzz_str(const uint8_t* data, size_t size) {
  char* s = malloc(size + 1);
  if (s == NULL) abort();
  if (size > 0) memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

char* fuzz_str_caret(const char* s) {
  size_t n = strlen(s);
  char* c = malloc(n + 2);
  if (c == NULL) abort();
  c[0] = '^';
  memcpy(c + 1, s, n + 1);
  return c;
}

/* Every INFO and WARN the parsers print is formatted from the fuzzed text. */
__attribute__((constructor)) static void fuzz_logging(void) {
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "ALL", 1);
  setenv("NCCL_DEBUG_FILE", "/dev/null", 1);
}

/* The targets link with -Wl,--wrap=getaddrinfo: whatever a parser is given,
 * a fuzzer resolves numeric addresses only and never asks DNS or
 * /etc/hosts (slow, and not the fuzzer's business). */
int __real_getaddrinfo(const char* node, const char* service, const struct addrinfo* hints,
                       struct addrinfo** res);
int __wrap_getaddrinfo(const char* node, const char* service, const struct addrinfo* hints,
                       struct addrinfo** res) {
  struct addrinfo h;
  memset(&h, 0, sizeof(h));
  if (hints) h = *hints;
  h.ai_flags |= AI_NUMERICHOST | AI_NUMERICSERV;
  return __real_getaddrinfo(node, service, &h, res);
}
