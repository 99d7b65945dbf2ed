/*
 * NCCL-format logging. Settings come from the environment once, on first use;
 * WARN text is remembered per thread (and process-wide) for ncclGetLastError.
 */
#include "debug.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_path.h"
#include "param.h"

#define LAST_ERROR_LEN 1024

static struct {
  pthread_once_t once;
  _Atomic int announced; /* the settings' own "set by environment" lines */
  enum debug_level level;
  uint32_t subsys;
  FILE* out;
  char host[64];
  pthread_mutex_t lock; /* guards last_error and whole-line writes */
  char last_error[LAST_ERROR_LEN];
} g_debug = {PTHREAD_ONCE_INIT, 0, DEBUG_NONE, 0, NULL, "", PTHREAD_MUTEX_INITIALIZER, ""};

static __thread char t_last_error[LAST_ERROR_LEN];

enum debug_level debug_parse_level(const char* s) {
  if (s == NULL) return DEBUG_NONE;
  if (strcasecmp(s, "VERSION") == 0) return DEBUG_VERSION;
  if (strcasecmp(s, "WARN") == 0) return DEBUG_WARN;
  if (strcasecmp(s, "INFO") == 0) return DEBUG_INFO;
  if (strcasecmp(s, "ABORT") == 0) return DEBUG_ABORT;
  if (strcasecmp(s, "TRACE") == 0) return DEBUG_TRACE;
  return DEBUG_NONE;
}

static uint32_t subsys_bit(const char* name, size_t len) {
  static const struct {
    const char* name;
    uint32_t bit;
  } table[] = {{"INIT", SUB_INIT},
               {"COLL", SUB_COLL},
               {"P2P", SUB_P2P},
               {"SHM", SUB_SHM},
               {"NET", SUB_NET},
               {"GRAPH", SUB_GRAPH},
               {"TUNING", SUB_TUNING},
               {"ENV", SUB_ENV},
               {"ALLOC", SUB_ALLOC},
               {"CALL", SUB_CALL},
               {"PROXY", SUB_PROXY},
               {"NVLS", SUB_NVLS},
               {"BOOTSTRAP", SUB_BOOTSTRAP},
               {"REG", SUB_REG},
               {"ALL", SUB_ALL}};
  for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
    if (strlen(table[i].name) == len && strncasecmp(table[i].name, name, len) == 0)
      return table[i].bit;
  return 0;
}

/* "INIT,NET" enables those; "^COLL,P2P" enables all but those. Default INIT
 * (as NCCL) when unset. Unknown names are ignored. */
uint32_t debug_parse_subsys(const char* s) {
  if (s == NULL || *s == '\0') return SUB_INIT | SUB_BOOTSTRAP | SUB_ENV;
  int invert = (*s == '^');
  if (invert) s++;
  uint32_t mask = 0;
  while (*s) {
    size_t len = strcspn(s, ",");
    mask |= subsys_bit(s, len);
    s += len;
    if (*s == ',') s++;
  }
  return invert ? ~mask : mask;
}

/* Opens the log file for writing; -1 with `why` when it must not be used.
 * The path is often in a shared folder under a name anyone can predict
 * (/tmp/nccl.%h.%p): a link planted there by another user would have us
 * truncate and write whatever it points to, and another user's file would
 * get our log (it names buffers, hosts and ports). So a link is followed
 * only when it is this user's or root's (/dev/stderr), and a regular file
 * is written only when it is this user's; devices and pipes are fine. */
static int debug_file_open(const char* path, char* why, size_t len) {
  struct stat st;
  int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
    /* ELOOP, or EACCES where the kernel's protected_symlinks said no first */
    if (st.st_uid != geteuid() && st.st_uid != 0) {
      snprintf(why, len, "a link of another user's (uid %u)", (unsigned)st.st_uid);
      return -1;
    }
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  }
  if (fd < 0) {
    snprintf(why, len, "%s", strerror(errno));
    return -1;
  }
  if (fstat(fd, &st) != 0 || (S_ISREG(st.st_mode) && st.st_uid != geteuid())) {
    snprintf(why, len, "a file of another user's (uid %u)", (unsigned)st.st_uid);
    close(fd);
    return -1;
  }
  if (S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) {
    snprintf(why, len, "%s", strerror(errno));
    close(fd);
    return -1;
  }
  return fd;
}

/* NCCL_DEBUG_FILE may contain %h (hostname) and %p (pid). */
static FILE* open_debug_file(const char* pattern) {
  char path[512], why[96] = "";
  host_expand_path(pattern, path, sizeof(path));
  int fd = debug_file_open(path, why, sizeof(why));
  if (fd < 0) { /* the logger is not set up yet: its format by hand */
    fprintf(stdout, "%s:%d:%d [0] NCCL WARN NCCL_DEBUG_FILE %s: %s; logging to stdout\n",
            g_debug.host, (int)getpid(), (int)syscall(SYS_gettid), path, why);
    return NULL;
  }
  FILE* f = fdopen(fd, "w");
  if (f == NULL) close(fd);
  if (f) setvbuf(f, NULL, _IOLBF, 0);
  return f;
}

/* Reads the PARAM_EARLY rows: they log nothing, since logging is what is
 * being set up here (a log line now would wait on this once). */
static void debug_read_settings(void) {
  g_debug.level = debug_parse_level(param_debug());
  g_debug.subsys = debug_parse_subsys(param_debug_subsys());
  g_debug.out = stdout;
  const char* file = param_debug_file();
  if (file && g_debug.level > DEBUG_VERSION) {
    FILE* f = open_debug_file(file);
    if (f) g_debug.out = f;
  }
}

static void debug_init(void) {
  gethostname(g_debug.host, sizeof(g_debug.host) - 1);
  char* dot = strchr(g_debug.host, '.');
  if (dot) *dot = '\0';
  debug_read_settings();
}

/* ncclResetDebugInit: NCCL_DEBUG, NCCL_DEBUG_SUBSYS and NCCL_DEBUG_FILE are
 * read again now (a program may change them between phases). A log file
 * of the old settings is closed; lines being written wait on the lock. */
void debug_reset(void) {
  pthread_once(&g_debug.once, debug_init);
  pthread_mutex_lock(&g_debug.lock);
  FILE* old = g_debug.out;
  param_forget_early();
  debug_read_settings();
  if (old != NULL && old != stdout && old != g_debug.out) fclose(old);
  pthread_mutex_unlock(&g_debug.lock);
}

/* Logging is set up; the first caller past that logs the settings it came
 * from, as every other parameter is logged (its lines find `announced` set). */
static void debug_ready(void) {
  pthread_once(&g_debug.once, debug_init);
  if (atomic_load_explicit(&g_debug.announced, memory_order_relaxed)) return;
  if (atomic_exchange(&g_debug.announced, 1) == 0) param_log_early();
}

enum debug_level debug_level(void) {
  debug_ready();
  return g_debug.level;
}

int debug_enabled(enum debug_level level, uint32_t subsys) {
  debug_ready();
  return g_debug.level >= level && (g_debug.subsys & subsys);
}

static __thread int t_device = 0;
void debug_set_device(int dev) {
  t_device = dev;
}

void debug_log(enum debug_level level, uint32_t subsys, const char* file, int line, const char* fmt,
               ...) {
  debug_ready();
  char msg[LAST_ERROR_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (level == DEBUG_WARN) {
    memcpy(t_last_error, msg, sizeof(msg));
    pthread_mutex_lock(&g_debug.lock);
    memcpy(g_debug.last_error, msg, sizeof(msg));
    pthread_mutex_unlock(&g_debug.lock);
  }
  if (g_debug.level < level || !(g_debug.subsys & subsys)) return;
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int pid = (int)getpid(), tid = (int)syscall(SYS_gettid);
  pthread_mutex_lock(&g_debug.lock);
  if (level == DEBUG_WARN)
    fprintf(g_debug.out, "%s:%d:%d [%d] %s:%d NCCL WARN %s\n", g_debug.host, pid, tid, t_device,
            base, line, msg);
  else
    fprintf(g_debug.out, "%s:%d:%d [%d] NCCL %s %s\n", g_debug.host, pid, tid, t_device,
            level == DEBUG_TRACE ? "TRACE" : "INFO", msg);
  fflush(g_debug.out);
  pthread_mutex_unlock(&g_debug.lock);
}

/* This thread's last WARN, or else the process's last one. */
const char* debug_last_error(void) {
  if (t_last_error[0]) return t_last_error;
  pthread_mutex_lock(&g_debug.lock);
  memcpy(t_last_error, g_debug.last_error, sizeof(t_last_error));
  pthread_mutex_unlock(&g_debug.lock);
  return t_last_error;
}
