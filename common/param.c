/*
 * Environment parameters: parsing with size suffixes, the table's rows
 * (param_table.h), and one cached getter per row, so each variable is read
 * once per process and logged once when set.
 */
#include "param.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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

/* The environment's value, NULL when unset or empty (NCCL ignores empty
 * variables too); the one getenv of the library. */
static const char* env_value(const char* env) {
  const char* v = getenv(env);
  return (v && *v) ? v : NULL;
}

static const char* param_read_str(const char* env) {
  const char* v = env_value(env);
  if (v) INFO(SUB_ENV, "%s set by environment to %s", env, v);
  return v;
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

/* ---- the table ---- */

#define PARAM_ID(fn, ...) PARAM_ID_##fn,
enum param_id { PARAM_TABLE(PARAM_ID, PARAM_ID) PARAM_COUNT };

#define PARAM_ROW_INT(fn, env, dflt, lo, hi, flags, doc) \
  {env, PARAM_INT, dflt, lo, hi, NULL, NULL, flags, doc},
#define PARAM_ROW_STR(fn, env, dflt, shown, flags, doc) \
  {env, PARAM_STR, 0, 0, 0, dflt, shown, flags, doc},
static const struct param_row k_rows[PARAM_COUNT] = {PARAM_TABLE(PARAM_ROW_INT, PARAM_ROW_STR)};

const struct param_row* param_rows(int* n) {
  *n = PARAM_COUNT;
  return k_rows;
}

/* The values read so far. A getter's first callers may race: each reads
 * and logs, the first to take the lock publishes, and all return that. */
static struct {
  pthread_mutex_t lock;
  struct {
    _Atomic int ready;
    int64_t i; /* PARAM_INT */
    char* s;   /* PARAM_STR: the environment's value (a copy), NULL when unset */
  } v[PARAM_COUNT];
} g_params = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int64_t row_read_int(const struct param_row* r) {
  if (!(r->flags & PARAM_ZERO_OFF)) return param_read_range(r->name, r->dflt, r->lo, r->hi);
  int64_t v = param_read_range(r->name, r->dflt, 0, r->hi);
  return v == 0 ? 0 : param_clamp(r->name, v, r->lo, r->hi);
}

/* strdup, not braid_calloc: the logger's own rows are copied while logging
 * is being set up, where a WARN would wait for itself. */
static char* row_read_str(const struct param_row* r) {
  int early = (r->flags & PARAM_EARLY) != 0;
  const char* v = early ? env_value(r->name) : param_read_str(r->name);
  char* copy = v ? strdup(v) : NULL;
  if (v && copy == NULL && !early) WARN("Out of memory copying %s; treating it as unset", r->name);
  return copy;
}

static int64_t param_int(enum param_id id) {
  if (atomic_load_explicit(&g_params.v[id].ready, memory_order_acquire)) return g_params.v[id].i;
  int64_t v = row_read_int(&k_rows[id]);
  pthread_mutex_lock(&g_params.lock);
  if (!atomic_load_explicit(&g_params.v[id].ready, memory_order_relaxed)) {
    g_params.v[id].i = v;
    atomic_store_explicit(&g_params.v[id].ready, 1, memory_order_release);
  }
  v = g_params.v[id].i;
  pthread_mutex_unlock(&g_params.lock);
  return v;
}

static const char* param_str(enum param_id id) {
  if (!atomic_load_explicit(&g_params.v[id].ready, memory_order_acquire)) {
    char* s = row_read_str(&k_rows[id]);
    pthread_mutex_lock(&g_params.lock);
    if (!atomic_load_explicit(&g_params.v[id].ready, memory_order_relaxed)) {
      g_params.v[id].s = s;
      s = NULL;
      atomic_store_explicit(&g_params.v[id].ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&g_params.lock);
    free(s); /* another caller published first */
  }
  return g_params.v[id].s ? g_params.v[id].s : k_rows[id].dflt_str;
}

#define PARAM_DEFINE_INT(fn, ...)    \
  int64_t param_##fn(void) {         \
    return param_int(PARAM_ID_##fn); \
  }
#define PARAM_DEFINE_STR(fn, ...)    \
  const char* param_##fn(void) {     \
    return param_str(PARAM_ID_##fn); \
  }
PARAM_TABLE(PARAM_DEFINE_INT, PARAM_DEFINE_STR)

void param_log_early(void) {
  for (int id = 0; id < PARAM_COUNT; id++) {
    const struct param_row* r = &k_rows[id];
    if (!(r->flags & PARAM_EARLY) || r->type != PARAM_STR) continue;
    param_str((enum param_id)id); /* read already, unless logging never asked */
    if (g_params.v[id].s) INFO(SUB_ENV, "%s set by environment to %s", r->name, g_params.v[id].s);
  }
}

/* Forget the rows `only` selects (all when 0): their next getter reads the
 * environment again. */
static void forget_rows(unsigned only) {
  pthread_mutex_lock(&g_params.lock);
  for (int id = 0; id < PARAM_COUNT; id++) {
    if (only && !(k_rows[id].flags & only)) continue;
    free(g_params.v[id].s);
    g_params.v[id].s = NULL;
    g_params.v[id].i = 0;
    atomic_store_explicit(&g_params.v[id].ready, 0, memory_order_release);
  }
  pthread_mutex_unlock(&g_params.lock);
}

void param_cache_reset(void) {
  forget_rows(0);
}

void param_forget_early(void) {
  forget_rows(PARAM_EARLY);
}

int param_find(const char* name) {
  for (int id = 0; name != NULL && id < PARAM_COUNT; id++)
    if (strcmp(k_rows[id].name, name) == 0) return id;
  return -1;
}

void param_value_at(int id, int64_t* iv, const char** sv) {
  *iv = 0;
  *sv = NULL;
  if (k_rows[id].type == PARAM_INT)
    *iv = param_int((enum param_id)id);
  else
    *sv = param_str((enum param_id)id);
}
