/*
 * A small reader of the JSON the flight recorder writes (status_dumps.c):
 * the members of one object, strings unescaped, nested values skipped or
 * handed over whole. Bounded everywhere: a dump is read as untrusted text.
 */
#include "status/status_json.h"

#include <stdlib.h>
#include <string.h>

static const char* skip_space(const char* p) {
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') p++;
  return p;
}

const char* json_string(const char* p, char* out, size_t cap) {
  size_t o = 0;
  if (*p != '"') return NULL;
  for (p++; *p && *p != '"'; p++) {
    char c = *p;
    if (c == '\\') {
      c = *++p;
      if (c == 'u') { /* \u00XX: what the writer escapes; anything else as '?' */
        char hex[5] = {0};
        for (int i = 0; i < 4; i++)
          if ((hex[i] = *++p) == '\0') return NULL;
        long v = strtol(hex, NULL, 16);
        c = v > 0 && v < 0x80 ? (char)v : '?';
      } else if (c == 'n') {
        c = '\n';
      } else if (c == 't') {
        c = '\t';
      } else if (c == '\0') {
        return NULL;
      }
    }
    if (o + 1 < cap) out[o++] = c;
  }
  if (cap) out[o] = '\0';
  return *p == '"' ? p + 1 : NULL;
}

#define JSON_MAX_DEPTH 16 /* the recorder nests 2 deep: deeper is not ours */

static const char* skip_nested(const char* p, int depth) {
  if (depth > JSON_MAX_DEPTH) return NULL;
  p = skip_space(p);
  if (*p == '"') {
    for (p++; *p && *p != '"'; p++)
      if (*p == '\\' && *++p == '\0') return NULL;
    return *p ? p + 1 : NULL;
  }
  if (*p == '{' || *p == '[') {
    char close = *p == '{' ? '}' : ']';
    p = skip_space(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
      if (close == '}') { /* key : value */
        p = skip_nested(p, depth + 1);
        if (p == NULL || *(p = skip_space(p)) != ':') return NULL;
        p++;
      }
      if ((p = skip_nested(p, depth + 1)) == NULL) return NULL;
      p = skip_space(p);
      if (*p == close) return p + 1;
      if (*p != ',') return NULL;
      p++;
    }
  }
  const char* start = p; /* number, true, false, null */
  while (*p && strchr(",}] \t\r\n", *p) == NULL) p++;
  return p > start ? p : NULL;
}

const char* json_skip(const char* p) {
  return skip_nested(p, 0);
}

int json_members(const char* p, json_member_fn fn, void* arg) {
  char key[64];
  p = skip_space(p);
  if (*p != '{') return -1;
  p = skip_space(p + 1);
  if (*p == '}') return 0;
  for (;;) {
    if ((p = json_string(p, key, sizeof(key))) == NULL) return -1;
    p = skip_space(p);
    if (*p != ':') return -1;
    p = skip_space(p + 1);
    fn(key, p, arg);
    if ((p = json_skip(p)) == NULL) return -1;
    p = skip_space(p);
    if (*p == '}') return 0;
    if (*p != ',') return -1;
    p = skip_space(p + 1);
  }
}

int json_elements(const char* p, int (*fn)(const char* element, void* arg), void* arg) {
  p = skip_space(p);
  if (*p != '[') return -1;
  p = skip_space(p + 1);
  if (*p == ']') return 0;
  for (;;) {
    if (fn(p, arg) != 0) return -1;
    if ((p = json_skip(p)) == NULL) return -1;
    p = skip_space(p);
    if (*p == ']') return 0;
    if (*p != ',') return -1;
    p = skip_space(p + 1);
  }
}

int64_t json_int(const char* v) {
  return strtoll(v, NULL, 10);
}

uint64_t json_uint(const char* v) {
  return strtoull(v, NULL, 10);
}
