/*
 * The ncclParam* API over Braid's parameter table (common/param_table.h):
 * every NCCL_* and BRAID_* variable the library reads, by its name, with
 * the value the library uses (the environment's, clamped, or the default).
 * A handle is the row's index; it lives as long as the process.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "param.h"

static int handle_row(ncclParamHandle_t h) {
  int n;
  param_rows(&n);
  intptr_t id = (intptr_t)h - 1;
  return id >= 0 && id < n ? (int)id : -1;
}

NCCL_API(ncclResult_t, ncclParamBind, ncclParamHandle_t* out, const char* key);
ncclResult_t ncclParamBind(ncclParamHandle_t* out, const char* key) {
  int id = param_find(key);
  if (out == NULL || id < 0) {
    WARN("ncclParamBind : %s is not a parameter of this library", key ? key : "(null)");
    return ncclInvalidArgument;
  }
  *out = (ncclParamHandle_t)(intptr_t)(id + 1);
  return ncclSuccess;
}

/* An integer row's value, when it fits [lo, hi]. */
static ncclResult_t param_get_int(ncclParamHandle_t h, int64_t lo, uint64_t hi, int64_t* v,
                                  const char* fn) {
  int n, id = handle_row(h);
  const char* s;
  if (id < 0) {
    WARN("%s : invalid handle", fn);
    return ncclInvalidArgument;
  }
  const struct param_row* r = &param_rows(&n)[id];
  if (r->type != PARAM_INT) {
    WARN("%s : %s is a string parameter", fn, r->name);
    return ncclInvalidArgument;
  }
  param_value_at(id, v, &s);
  if (*v < lo || (*v > 0 && (uint64_t)*v > hi)) {
    WARN("%s : %s = %" PRId64 " does not fit", fn, r->name, *v);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

#define PARAM_GETTER(name, type, lo, hi)                        \
  NCCL_API(ncclResult_t, name, ncclParamHandle_t h, type* out); \
  ncclResult_t name(ncclParamHandle_t h, type* out) {           \
    int64_t v;                                                  \
    if (out == NULL) return ncclInvalidArgument;                \
    ncclResult_t res = param_get_int(h, (lo), (hi), &v, #name); \
    if (res == ncclSuccess) *out = (type)v;                     \
    return res;                                                 \
  }

PARAM_GETTER(ncclParamGetI8, int8_t, INT8_MIN, INT8_MAX)
PARAM_GETTER(ncclParamGetI16, int16_t, INT16_MIN, INT16_MAX)
PARAM_GETTER(ncclParamGetI32, int32_t, INT32_MIN, INT32_MAX)
PARAM_GETTER(ncclParamGetI64, int64_t, INT64_MIN, INT64_MAX)
PARAM_GETTER(ncclParamGetU8, uint8_t, 0, UINT8_MAX)
PARAM_GETTER(ncclParamGetU16, uint16_t, 0, UINT16_MAX)
PARAM_GETTER(ncclParamGetU32, uint32_t, 0, UINT32_MAX)
PARAM_GETTER(ncclParamGetU64, uint64_t, 0, UINT64_MAX)

/* Row `id` as text: a string row's value ("" when unset with no default),
 * an integer row's in decimal in `buf`. */
static const char* row_text(int id, char* buf, size_t len) {
  int64_t v;
  const char* s;
  param_value_at(id, &v, &s);
  int n;
  if (param_rows(&n)[id].type == PARAM_STR) return s ? s : "";
  snprintf(buf, len, "%" PRId64, v);
  return buf;
}

/* Integer rows come back as text in a per-thread buffer, valid until the
 * thread's next ncclParamGetStr or ncclParamGetParameter. */
static __thread char t_text[32];

NCCL_API(ncclResult_t, ncclParamGetStr, ncclParamHandle_t h, const char** out);
ncclResult_t ncclParamGetStr(ncclParamHandle_t h, const char** out) {
  int id = handle_row(h);
  if (id < 0 || out == NULL) {
    WARN("ncclParamGetStr : invalid handle or NULL out");
    return ncclInvalidArgument;
  }
  *out = row_text(id, t_text, sizeof t_text);
  return ncclSuccess;
}

/* The value's bytes: an integer row's int64_t, a string row's text with
 * its terminating NUL. *len gets the size needed, also when maxLen is too
 * small (then ncclInvalidArgument and nothing copied). */
NCCL_API(ncclResult_t, ncclParamGet, ncclParamHandle_t h, void* out, int maxLen, int* len);
ncclResult_t ncclParamGet(ncclParamHandle_t h, void* out, int maxLen, int* len) {
  int n, id = handle_row(h);
  if (id < 0 || len == NULL) {
    WARN("ncclParamGet : invalid handle or NULL len");
    return ncclInvalidArgument;
  }
  int64_t v;
  const char* s;
  param_value_at(id, &v, &s);
  int is_int = param_rows(&n)[id].type == PARAM_INT;
  const void* src = is_int ? (const void*)&v : (const void*)(s ? s : "");
  *len = is_int ? (int)sizeof v : (int)strlen((const char*)src) + 1;
  if (out == NULL || maxLen < *len) {
    WARN("ncclParamGet : %s needs %d bytes, %d given", param_rows(&n)[id].name, *len, maxLen);
    return ncclInvalidArgument;
  }
  memcpy(out, src, (size_t)*len);
  return ncclSuccess;
}

NCCL_API(ncclResult_t, ncclParamGetParameter, const char* key, const char** value, int* valueLen);
ncclResult_t ncclParamGetParameter(const char* key, const char** value, int* valueLen) {
  int id = param_find(key);
  if (id < 0 || value == NULL || valueLen == NULL) {
    WARN("ncclParamGetParameter : %s is not a parameter of this library", key ? key : "(null)");
    return ncclInvalidArgument;
  }
  *value = row_text(id, t_text, sizeof t_text);
  *valueLen = (int)strlen(*value);
  return ncclSuccess;
}

/* The names, in the table's order; the array lives as long as the
 * process (built once, never changed). */
static const char** g_keys;
static pthread_once_t g_keys_once = PTHREAD_ONCE_INIT;

static void keys_build(void) {
  int n;
  const struct param_row* rows = param_rows(&n);
  const char** keys = NULL;
  if (braid_calloc(&keys, (size_t)n, sizeof(*keys)) != ncclSuccess) return;
  for (int i = 0; i < n; i++) keys[i] = rows[i].name;
  g_keys = keys;
}

NCCL_API(ncclResult_t, ncclParamGetAllParameterKeys, const char*** table, int* tableLen);
ncclResult_t ncclParamGetAllParameterKeys(const char*** table, int* tableLen) {
  if (table == NULL || tableLen == NULL) return ncclInvalidArgument;
  pthread_once(&g_keys_once, keys_build);
  if (g_keys == NULL) return ncclSystemError;
  *table = g_keys;
  param_rows(tableLen);
  return ncclSuccess;
}

NCCL_API(void, ncclParamDumpAll, void);
void ncclParamDumpAll(void) {
  int n;
  char buf[32];
  const struct param_row* rows = param_rows(&n);
  for (int i = 0; i < n; i++) printf("%s=%s\n", rows[i].name, row_text(i, buf, sizeof buf));
  fflush(stdout);
}
