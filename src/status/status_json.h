/*
 * A small reader of the flight recorder's JSON (status_json.c), for the
 * dumps braid-status merges: an object's members, an array's elements,
 * strings and numbers. It reads untrusted text: every call is bounded,
 * and malformed text is an error, never a crash.
 */
#ifndef BRAID_STATUS_JSON_H_
#define BRAID_STATUS_JSON_H_

#include <stddef.h>
#include <stdint.h>

/* Called with each member's key and the text where its value starts. */
typedef void (*json_member_fn)(const char* key, const char* value, void* arg);

/* The members of the object at p; 0, or -1 when it is malformed. */
int json_members(const char* p, json_member_fn fn, void* arg);
/* The elements of the array at p (fn non-zero stops it: -1). */
int json_elements(const char* p, int (*fn)(const char* element, void* arg), void* arg);
/* The string at p (a quote) unescaped into out (cap bytes, truncated);
 * where it ends, NULL when malformed. */
const char* json_string(const char* p, char* out, size_t cap);
/* Past the value at p, NULL when malformed. */
const char* json_skip(const char* p);
int64_t json_int(const char* v);
uint64_t json_uint(const char* v);

#endif /* BRAID_STATUS_JSON_H_ */
