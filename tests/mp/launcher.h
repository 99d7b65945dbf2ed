/* Multi-process tests: fork N ranks from a cmocka test, wait for them under a
 * deadline (SIGKILL on expiry), and helpers the rank bodies share. */
#ifndef MP_LAUNCHER_H_
#define MP_LAUNCHER_H_

#include <stddef.h>

#include "nccl.h"

#define MP_MAX_RANKS 64
#define MP_DEFAULT_DEADLINE_S 120
#define MP_SHM_INTS 1024
#define MP_MAX_IDS 4

/* What a rank body sees. `id` (= ids[0]) and ids[0..nids) are valid when
 * has_id: a root holder process forked before the ranks called
 * ncclGetUniqueId nids times, and its root threads serve the bootstrap. */
typedef struct mp_env {
  int rank;
  int nranks;
  int has_id;
  ncclUniqueId id;
  ncclUniqueId ids[MP_MAX_IDS];
  void* arg;
  volatile int* shm; /* MP_SHM_INTS ints shared by all ranks, zeroed */
} mp_env;

/* Runs in the child; returns 0 on success, non-zero on failure. */
typedef int (*mp_body_fn)(const mp_env* env);

typedef struct mp_opts {
  int deadline_s;     /* children still alive after this are SIGKILLed */
  int no_id;          /* 1: no unique id for the ranks (no root holder) */
  int victim;         /* this rank must die by SIGKILL; -1: none */
  int kill_on_notify; /* parent SIGKILLs the victim when it calls mp_notify_parent */
  int nids;           /* unique ids in env->ids, 1..MP_MAX_IDS; 0 means 1 */
} mp_opts;

#define MP_OPTS_INIT \
  { MP_DEFAULT_DEADLINE_S, 0, -1, 0, 0 }

/* Parent side: forks nranks children running body; returns the number of
 * ranks that failed (bad exit, unexpected signal, deadline). The calling
 * process must have no thread but its own (it is checked): a fork copies
 * every lock another thread holds at that instant, allocator locks included,
 * and the child would wait on them forever. So nothing in the test process
 * itself may start library threads (ncclGetUniqueId's root, comms): the
 * unique ids come from a root holder process, and library calls belong in
 * rank bodies. */
int mp_launch(int nranks, mp_body_fn body, void* arg, const mp_opts* opts);

/* Child side: tells the parent this rank reached its kill point. */
void mp_notify_parent(void);

/* Messages to stderr prefixed with "[rank r/n pid]". */
void mp_log(const mp_env* env, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
void mp_fail(const mp_env* env, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int mp_verbose(void);

/* Checks got == want; on mismatch prints what, both codes and the last
 * error. Returns 0 when equal, 1 otherwise. */
int mp_expect_rc(const mp_env* env, ncclComm_t comm, ncclResult_t got, ncclResult_t want,
                 const char* what);
/* One group: `bytes` of out sent to rank `to`, as many received from rank
 * `from` into in; 0 when every call succeeded, else the failures. */
int mp_sendrecv(const mp_env* env, ncclComm_t comm, const void* out, void* in, size_t bytes, int to,
                int from);
/* Checks that ncclGetLastError(comm) is a non-empty string; 0 when it is. */
int mp_expect_last_error(const mp_env* env, ncclComm_t comm, const char* what);

/* An all-reduce (sum) of rank + 1 over comm, on 1001 floats, each of which
 * must come out as `want`: 0 when exact, else 1 with the first bad element
 * printed. */
int mp_sum_ranks_exact(const mp_env* env, ncclComm_t comm, float want);

/* ncclCommInitRank with env's id; prints the error and returns 1 on failure. */
int mp_comm_init(const mp_env* env, ncclComm_t* comm);

/* Seconds on a monotonic clock. */
double mp_now(void);
void mp_sleep_ms(int ms);
/* A currently free TCP port on the loopback address of family (AF_INET,
 * AF_INET6), below the kernel's ephemeral range; 0 when none can be
 * bound. */
int mp_free_port(int family);
/* Hold this process on the allowed CPU `index` mod their count (where
 * CPUs have caches of their own, the comm then orders and pairs ranks by
 * cache: algorithms/layout.c); 0 on success. */
int mp_bind_rank(const mp_env* env, int index);
/* Waits until *flag != 0 or timeout_ms passes; returns the flag's value. */
int mp_wait_flag(volatile int* flag, int timeout_ms);
/* The largest count of a matrix test: dflt, or MP_BIG_COUNT when that is set
 * and smaller (make test-sanitize lowers it under ThreadSanitizer, which
 * instruments every element a kernel touches). */
size_t mp_big_count(size_t dflt);
/* Sets an environment variable unless the user already set it. */
void mp_default_env(const char* name, const char* value);

/* This process's stdout and stderr (the library logs to stdout, like
 * NCCL) captured in a temporary file. */
typedef struct mp_capture {
  char path[64];
  int saved[2];
} mp_capture;
/* 0 on success. */
int mp_capture_begin(mp_capture* cap);
/* mp_capture_begin with the library's INFO log of `subsys` on ("GRAPH":
 * the topology's report), read again from the environment; 0 on success. */
int mp_capture_debug(mp_capture* cap, const char* subsys);
/* Restores both, echoes what was captured to stderr, and returns how many
 * captured lines hold `needle` ("a*b": a, then later b). */
int mp_capture_end(mp_capture* cap, const char* needle);
/* How many lines captured so far hold `needle`, capture going on (for a
 * count of several needles before mp_capture_end). */
int mp_capture_count(const mp_capture* cap, const char* needle);
/* mp_capture_end without the NCCL INFO lines in the echo (a long log
 * that was only counted). */
void mp_capture_end_quiet(mp_capture* cap);

#endif /* MP_LAUNCHER_H_ */
