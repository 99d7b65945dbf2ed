/*
 * Environment parameters: parsing with size suffixes, and one cached getter
 * per knob so each variable is read exactly once per process.
 */
#include "param.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "debug.h"

int param_parse_int(const char* s, int64_t* out) {
  if (s == NULL || *s == '\0') return -1;
  errno = 0;
  char* end;
  long long v = strtoll(s, &end, 0);
  if (errno != 0 || end == s) return -1;
  int64_t mult = 1;
  switch (*end) {
    case 'k':
    case 'K':
      mult = 1LL << 10;
      end++;
      break;
    case 'm':
    case 'M':
      mult = 1LL << 20;
      end++;
      break;
    case 'g':
    case 'G':
      mult = 1LL << 30;
      end++;
      break;
    default:
      break;
  }
  if (*end != '\0') return -1;
  if (v > INT64_MAX / mult || v < INT64_MIN / mult) return -1;
  *out = v * mult;
  return 0;
}

const char* param_read_str(const char* env) {
  const char* v = getenv(env);
  if (v && *v) INFO(SUB_ENV, "%s set by environment to %s", env, v);
  return (v && *v) ? v : NULL;
}

int64_t param_read_int(const char* env, int64_t dflt) {
  const char* s = param_read_str(env);
  int64_t v;
  if (s == NULL) return dflt;
  if (param_parse_int(s, &v) != 0) {
    WARN("Invalid value %s for %s, using default %lld", s, env, (long long)dflt);
    return dflt;
  }
  return v;
}

/* A cached getter: the first caller reads the environment; a racing second
 * caller reads the same value, so a relaxed atomic is enough. */
#define PARAM_GETTER(fn, env, dflt)                                 \
  int64_t param_##fn(void) {                                        \
    static _Atomic int64_t cache = INT64_MIN;                       \
    int64_t v = atomic_load_explicit(&cache, memory_order_relaxed); \
    if (v == INT64_MIN) {                                           \
      v = param_read_int(env, dflt);                                \
      atomic_store_explicit(&cache, v, memory_order_relaxed);       \
    }                                                               \
    return v;                                                       \
  }

PARAM_GETTER(timeout_ms, "BRAID_TIMEOUT_MS", 300000)
PARAM_GETTER(socket_nthreads, "NCCL_SOCKET_NTHREADS", 1)
PARAM_GETTER(nsocks_perthread, "NCCL_NSOCKS_PERTHREAD", 2)
PARAM_GETTER(chunk_size, "BRAID_CHUNK_SIZE", 64 * 1024)
PARAM_GETTER(nsteps, "BRAID_NSTEPS", 16)
PARAM_GETTER(spin_us, "BRAID_SPIN_US", 100)
PARAM_GETTER(sock_buf, "BRAID_SOCKET_BUF", 0)
PARAM_GETTER(shm_disable, "NCCL_SHM_DISABLE", 0)
