/*
 * NCCL_IB_HCA (ib_hca.h).
 */
#include "ib_hca.h"

#include <stdlib.h>
#include <string.h>

#define HCA_NAME_MAX 63

/* One entry "name[:port]" of len bytes: its name's length and port (0:
 * any); -1 if malformed. */
static int entry_parse(const char* e, size_t len, size_t* name_len, int* port) {
  const char* colon = memchr(e, ':', len);
  *port = 0;
  *name_len = colon ? (size_t)(colon - e) : len;
  if (*name_len == 0 || *name_len > HCA_NAME_MAX) return -1;
  if (colon == NULL) return 0;
  char digits[8];
  size_t n = len - *name_len - 1;
  if (n == 0 || n >= sizeof(digits)) return -1;
  memcpy(digits, colon + 1, n);
  digits[n] = '\0';
  char* end;
  long p = strtol(digits, &end, 10);
  if (*end != '\0' || p < 1 || p > 255) return -1;
  *port = (int)p;
  return 0;
}

/* The list after its '^' and '=' marks; calls fn on each entry until it
 * returns nonzero, returning that (or 0), -1 for a malformed entry. */
static int entries_each(const char* list,
                        int (*fn)(void* arg, const char* name, size_t len, int port), void* arg) {
  while (*list) {
    size_t len = strcspn(list, ","), name_len;
    int port, r;
    if (len > 0) {
      if (entry_parse(list, len, &name_len, &port) < 0) return -1;
      if ((r = fn(arg, list, name_len, port)) != 0) return r;
    }
    list += len;
    if (*list == ',') list++;
  }
  return 0;
}

struct match_arg {
  const char* dev;
  int port, exact;
};

static int entry_matches(void* arg, const char* name, size_t len, int port) {
  const struct match_arg* m = arg;
  int name_hit = m->exact ? strlen(m->dev) == len && strncmp(m->dev, name, len) == 0
                          : strncmp(m->dev, name, len) == 0;
  return name_hit && (port == 0 || port == m->port);
}

static int entry_ok(void* arg, const char* name, size_t len, int port) {
  (void)arg, (void)name, (void)len, (void)port;
  return 0;
}

/* The list and its marks. */
static const char* spec_list(const char* spec, int* exclude, int* exact) {
  *exclude = *exact = 0;
  if (*spec == '^') *exclude = 1, spec++;
  if (*spec == '=') *exact = 1, spec++;
  return spec;
}

int ib_hca_match(const char* spec, const char* dev, int port) {
  int exclude, exact;
  if (spec == NULL || *spec == '\0') return 1;
  const char* list = spec_list(spec, &exclude, &exact);
  struct match_arg m = {dev, port, exact};
  int hit = entries_each(list, entry_matches, &m) > 0;
  return exclude ? !hit : hit;
}

int ib_hca_valid(const char* spec, const char** why) {
  int exclude, exact;
  *why = NULL;
  if (spec == NULL || *spec == '\0') return 1;
  if (entries_each(spec_list(spec, &exclude, &exact), entry_ok, NULL) < 0) {
    *why = "entries are name[:port], names of 1-63 characters, ports 1-255";
    return 0;
  }
  return 1;
}
