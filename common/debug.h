/*
 * Logging in NCCL's format ("host:pid:tid [dev] NCCL INFO ...") controlled by
 * NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE; the last WARN is kept
 * for ncclGetLastError.
 */
#ifndef BRAID_DEBUG_H_
#define BRAID_DEBUG_H_

#include <stdint.h>

enum debug_level {
  DEBUG_NONE = 0,
  DEBUG_VERSION = 1,
  DEBUG_WARN = 2,
  DEBUG_INFO = 3,
  DEBUG_ABORT = 4,
  DEBUG_TRACE = 5
};

/* Subsystems as NCCL names them (NCCL_DEBUG_SUBSYS). */
enum debug_subsys {
  SUB_INIT = 1u << 0,
  SUB_COLL = 1u << 1,
  SUB_P2P = 1u << 2,
  SUB_SHM = 1u << 3,
  SUB_NET = 1u << 4,
  SUB_GRAPH = 1u << 5,
  SUB_TUNING = 1u << 6,
  SUB_ENV = 1u << 7,
  SUB_ALLOC = 1u << 8,
  SUB_CALL = 1u << 9,
  SUB_PROXY = 1u << 10,
  SUB_NVLS = 1u << 11,
  SUB_BOOTSTRAP = 1u << 12,
  SUB_REG = 1u << 13,
  SUB_ALL = ~0u
};

void debug_log(enum debug_level level, uint32_t subsys, const char* file, int line, const char* fmt,
               ...) __attribute__((format(printf, 5, 6)));

/* Level and subsystem mask from the environment (read once). */
enum debug_level debug_level(void);
int debug_enabled(enum debug_level level, uint32_t subsys);

/* Parsers, exposed for tests: "INFO" -> DEBUG_INFO; "INIT,NET" or "^COLL". */
enum debug_level debug_parse_level(const char* s);
uint32_t debug_parse_subsys(const char* s);

/* The text of the last WARN issued by this thread ("" if none). */
const char* debug_last_error(void);
/* Read the NCCL_DEBUG* settings again (ncclResetDebugInit). */
void debug_reset(void);

/* Device number shown in this thread's log lines (the rank for host comms). */
void debug_set_device(int dev);

#define WARN(...) debug_log(DEBUG_WARN, SUB_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define INFO(sub, ...)                                               \
  do {                                                               \
    if (debug_enabled(DEBUG_INFO, (sub)))                            \
      debug_log(DEBUG_INFO, (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define TRACE(sub, ...)                                               \
  do {                                                                \
    if (debug_enabled(DEBUG_TRACE, (sub)))                            \
      debug_log(DEBUG_TRACE, (sub), __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#endif /* BRAID_DEBUG_H_ */
