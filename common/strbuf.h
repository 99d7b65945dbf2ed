/*
 * A growing string (common/strbuf.c): text put together piece by piece, a
 * report or a JSON line, without guessing its size first. Out of memory,
 * it stops growing and says so (failed); what it holds stays a string.
 */
#ifndef BRAID_STRBUF_H_
#define BRAID_STRBUF_H_

#include <stddef.h>

struct strbuf {
  char* s; /* NUL-terminated once anything was put; NULL before */
  size_t len, cap;
  int failed;
};

void strbuf_printf(struct strbuf* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
/* s as a JSON string: quoted, with quotes, backslashes and controls escaped. */
void strbuf_json_string(struct strbuf* b, const char* s);
/* The text, the caller's now (free() it); b is empty again. */
char* strbuf_take(struct strbuf* b);
void strbuf_free(struct strbuf* b);

#endif /* BRAID_STRBUF_H_ */
