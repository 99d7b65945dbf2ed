/*
 * Environment parameters: one getter per row of param_table.h, each read
 * once, on first use, and logged at INFO/ENV when set ("NCCL_ALGO set by
 * environment to Ring"); docs/environment.md's table lists them with their defaults.
 */
#ifndef BRAID_PARAM_H_
#define BRAID_PARAM_H_

#include <stdint.h>

#include "param_table.h"

enum param_type { PARAM_INT, PARAM_STR };

enum param_flags { PARAM_ZERO_OFF = 1u << 0, PARAM_EARLY = 1u << 1 };

/* A row of the table, for code that lists the parameters (tests, docs). */
struct param_row {
  const char* name;
  enum param_type type;
  int64_t dflt, lo, hi; /* PARAM_INT */
  const char* dflt_str; /* PARAM_STR: the value when unset, or NULL */
  const char* shown;    /* PARAM_STR with dflt_str NULL: the documented default */
  unsigned flags;
  const char* doc;
};

/* param_<getter>(): int64_t for INT rows, const char* for STR rows (a copy
 * that lives as long as the process). */
#define PARAM_DECLARE_INT(fn, ...) int64_t param_##fn(void);
#define PARAM_DECLARE_STR(fn, ...) const char* param_##fn(void);
PARAM_TABLE(PARAM_DECLARE_INT, PARAM_DECLARE_STR)
#undef PARAM_DECLARE_INT
#undef PARAM_DECLARE_STR

/* The table, in its order; *n gets its length. */
const struct param_row* param_rows(int* n);

/* The PARAM_EARLY rows that are set, at INFO/ENV: debug.c calls it once
 * logging is set up (those rows are read while it is being set up). */
void param_log_early(void);

/* For tests only: forget every value read so far, so the next getter reads
 * the environment again (as a fresh process would). Not safe against
 * getters running concurrently, nor while a string from one is in use. */
void param_cache_reset(void);

/* ncclResetDebugInit: the logger's own rows (PARAM_EARLY) are read again
 * on next use. The caller (debug.c) holds no string from them. */
void param_forget_early(void);

/* By name, for the ncclParam* API: the row index of `name` (-1: none), and
 * row `id`'s value as the library uses it (*iv for PARAM_INT rows, *sv for
 * PARAM_STR rows, NULL when unset with no default). */
int param_find(const char* name);
void param_value_at(int id, int64_t* iv, const char** sv);

/* The primitives under the rows. Parse "123", "64K", "8M", "1G" (powers of
 * 1024); returns 0 on success. */
int param_parse_int(const char* s, int64_t* out);

/* Read `env` now, uncached (or `dflt` when unset or malformed, with a
 * WARN); library code reads its knobs through the table's getters. */
int64_t param_read_int(const char* env, int64_t dflt);

/* An integer clamped to [lo, hi], with a WARN when it was not inside;
 * param_clamp does the same to a value read some other way. */
int64_t param_read_range(const char* env, int64_t dflt, int64_t lo, int64_t hi);
int64_t param_clamp(const char* env, int64_t v, int64_t lo, int64_t hi);

#endif /* BRAID_PARAM_H_ */
