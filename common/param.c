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

/* A knob outside [lo, hi] is clamped to the nearer bound, with a WARN: a
 * setting that would give wrong data (a 0-byte chunk), hang, or make every
 * call thousands of times slower (1-byte chunks, 1-byte socket buffers) is
 * never used as given. */
int64_t param_clamp(const char* env, int64_t v, int64_t lo, int64_t hi) {
  if (v >= lo && v <= hi) return v;
  int64_t c = v < lo ? lo : hi;
  WARN("%s=%lld is out of range [%lld, %lld]; using %lld", env, (long long)v, (long long)lo,
       (long long)hi, (long long)c);
  return c;
}

int64_t param_read_range(const char* env, int64_t dflt, int64_t lo, int64_t hi) {
  return param_clamp(env, param_read_int(env, dflt), lo, hi);
}

/* A cached getter: the first caller reads the environment; a racing second
 * caller reads the same value, so a relaxed atomic is enough. */
#define PARAM_CACHED(fn, read)                                      \
  int64_t param_##fn(void) {                                        \
    static _Atomic int64_t cache = INT64_MIN;                       \
    int64_t v = atomic_load_explicit(&cache, memory_order_relaxed); \
    if (v == INT64_MIN) {                                           \
      v = (read);                                                   \
      atomic_store_explicit(&cache, v, memory_order_relaxed);       \
    }                                                               \
    return v;                                                       \
  }
#define PARAM_GETTER(fn, env, dflt, lo, hi) PARAM_CACHED(fn, param_read_range(env, dflt, lo, hi))

#define KiB (1LL << 10)
#define MiB (1LL << 20)
#define GiB (1LL << 30)

PARAM_GETTER(timeout_ms, "BRAID_TIMEOUT_MS", 300000, 100, 1LL << 40)
PARAM_GETTER(socket_nthreads, "NCCL_SOCKET_NTHREADS", 1, 1, 16)
PARAM_GETTER(nsocks_perthread, "NCCL_NSOCKS_PERTHREAD", 2, 1, 64)
PARAM_GETTER(chunk_size, "BRAID_CHUNK_SIZE", 64 * KiB, PARAM_CHUNK_MIN, 64 * MiB)
PARAM_GETTER(nsteps, "BRAID_NSTEPS", 16, 4, 32)
PARAM_GETTER(spin_us, "BRAID_SPIN_US", 100, 0, 1000000)
PARAM_GETTER(shm_disable, "NCCL_SHM_DISABLE", 0, 0, 1)

/* 0 keeps the kernel's autotuning; anything else must be a real buffer. */
static int64_t read_sock_buf(void) {
  int64_t v = param_read_range("BRAID_SOCKET_BUF", 0, 0, 1 * GiB);
  return v == 0 ? 0 : param_clamp("BRAID_SOCKET_BUF", v, 64 * KiB, 1 * GiB);
}
PARAM_CACHED(sock_buf, read_sock_buf())
