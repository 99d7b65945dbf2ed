/* --sync and --compress as text, and which combinations make sense (sync.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sync.h"

static const char* const kNames[] = {"allreduce", "ps", "local", "gossip", "stale"};

/* "name" or "name:N" with N in [lo, hi]; *arg keeps its value without ":N". */
static int parse_arg(const char* s, const char* name, int lo, int hi, int* arg) {
  size_t len = strlen(name);
  char* end;
  if (strncmp(s, name, len) != 0) return -1;
  if (s[len] == '\0') return 0;
  if (s[len] != ':') return -1;
  long v = strtol(s + len + 1, &end, 10);
  if (end == s + len + 1 || *end || v < lo || v > hi) return -1;
  *arg = (int)v;
  return 1;
}

int sync_parse(const char* s, sync_spec_t* out) {
  compress_spec_t c = out->compress;
  memset(out, 0, sizeof(*out));
  out->compress = c;
  if (strcmp(s, "allreduce") == 0 || strcmp(s, "gossip") == 0) {
    out->kind = s[0] == 'a' ? SYNC_ALLREDUCE : SYNC_GOSSIP;
    return 0;
  }
  if (parse_arg(s, "ps", 0, 1 << 20, &out->arg) >= 0) {
    out->kind = SYNC_PS;
    return 0;
  }
  out->kind = SYNC_LOCAL;
  if (parse_arg(s, "local", 1, 1 << 20, &out->arg) == 1) return 0;
  out->kind = SYNC_STALE;
  if (parse_arg(s, "stale", 1, SYNC_MAX_STALE, &out->arg) == 1) return 0;
  return -1;
}

void sync_format(const sync_spec_t* s, char* out, size_t outlen) {
  if (s->kind == SYNC_ALLREDUCE || s->kind == SYNC_GOSSIP)
    snprintf(out, outlen, "%s", kNames[s->kind]);
  else
    snprintf(out, outlen, "%s:%d", kNames[s->kind], s->arg);
}

void sync_describe(const sync_spec_t* s, char* out, size_t outlen) {
  char sync[32], comp[32];
  sync_format(s, sync, sizeof(sync));
  compress_format(&s->compress, comp, sizeof(comp));
  snprintf(out, outlen, "%s %s", sync, comp);
}

int sync_validate(const sync_spec_t* s, int world, char* err, size_t errlen) {
  if (s->kind == SYNC_PS && s->arg >= world) {
    snprintf(err, errlen, "--sync ps:%d names a server rank, but there are %d ranks", s->arg,
             world);
    return -1;
  }
  if (compress_lossy(&s->compress) && (s->kind == SYNC_GOSSIP || s->kind == SYNC_STALE)) {
    char comp[32];
    compress_format(&s->compress, comp, sizeof(comp));
    snprintf(err, errlen, "--compress %s works with --sync allreduce, ps and local, not %s", comp,
             kNames[s->kind]);
    return -1;
  }
  return 0;
}

int sync_streams(const sync_spec_t* s) {
  return s->kind == SYNC_STALE ? s->arg + 1 : 1;
}
