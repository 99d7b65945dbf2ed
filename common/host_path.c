/* File names with %h and %p (host_path.h). */
#include "host_path.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

void host_short_name(char* out, size_t cap) {
  if (cap == 0) return;
  out[0] = '\0';
  if (gethostname(out, cap - 1) != 0) snprintf(out, cap, "unknown");
  out[cap - 1] = '\0';
  char* dot = strchr(out, '.');
  if (dot) *dot = '\0';
}

void host_expand_path(const char* pattern, char* out, size_t cap) {
  char host[256];
  size_t o = 0;
  if (cap == 0) return;
  host_short_name(host, sizeof(host));
  for (const char* p = pattern; *p && o + 1 < cap; p++) {
    int n = 1;
    if (p[0] == '%' && p[1] == 'h')
      n = snprintf(out + o, cap - o, "%s", host), p++;
    else if (p[0] == '%' && p[1] == 'p')
      n = snprintf(out + o, cap - o, "%d", (int)getpid()), p++;
    else
      out[o] = *p;
    o += (size_t)(n > 0 ? n : 0);
    if (o > cap - 1) o = cap - 1;
  }
  out[o] = '\0';
}
