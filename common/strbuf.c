/* A growing string (strbuf.h). */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Room for `more` bytes and the NUL: doubles, so a report is O(n). */
static int strbuf_reserve(struct strbuf* b, size_t more) {
  if (b->failed) return 0;
  if (b->len + more + 1 <= b->cap) return 1;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + more + 1) cap *= 2;
  char* s = realloc(b->s, cap);
  if (s == NULL) {
    b->failed = 1;
    return 0;
  }
  b->s = s;
  b->cap = cap;
  return 1;
}

void strbuf_printf(struct strbuf* b, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !strbuf_reserve(b, (size_t)n)) return;
  va_start(ap, fmt);
  vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void strbuf_json_string(struct strbuf* b, const char* s) {
  strbuf_printf(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      strbuf_printf(b, "\\%c", c);
    else if (c < 0x20)
      strbuf_printf(b, "\\u%04x", c);
    else
      strbuf_printf(b, "%c", c);
  }
  strbuf_printf(b, "\"");
}

char* strbuf_take(struct strbuf* b) {
  char* s = b->s;
  if (s == NULL && strbuf_reserve(b, 0)) s = b->s, s[0] = '\0';
  b->s = NULL;
  b->len = b->cap = 0;
  return s;
}

void strbuf_free(struct strbuf* b) {
  free(b->s);
  b->s = NULL;
  b->len = b->cap = 0;
  b->failed = 0;
}
