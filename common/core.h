/*
 * Core conventions shared by every layer: the CHECK macro for ncclResult_t
 * propagation, the exported-API macro, and small helpers (common/core.c):
 * allocation, the clock, bounded condition waits.
 */
#ifndef BRAID_CORE_H_
#define BRAID_CORE_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "debug.h"
#include "nccl.h"

/* Define an exported API function and its pnccl* alias in one go:
 *   NCCL_API(ncclResult_t, ncclFoo, int x);
 *   ncclResult_t ncclFoo(int x) { ... } */
#define NCCL_API(ret, name, ...)                                \
  __attribute__((visibility("default"))) ret name(__VA_ARGS__); \
  __attribute__((visibility("default"), alias(#name))) ret p##name(__VA_ARGS__)

/* Define an exported Braid extension (braid.h): no pnccl alias. */
#define BRAID_API(ret, name, ...) __attribute__((visibility("default"))) ret name(__VA_ARGS__)

/* Propagate a failure to the caller's `fail:` label with `res` set.
 * Every fallible function declares `ncclResult_t res = ncclSuccess;`. */
#define CHECK(call)                    \
  do {                                 \
    res = (call);                      \
    if (res != ncclSuccess) goto fail; \
  } while (0)

/* Fail with `code` and a WARN naming the problem. */
#define FAIL(code, ...) \
  do {                  \
    WARN(__VA_ARGS__);  \
    res = (code);       \
    goto fail;          \
  } while (0)

#define DIV_UP(a, b) (((a) + (b)-1) / (b))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))
#define ALIGN_UP(x, a) (DIV_UP((x), (a)) * (a))

/* Whether n is a power of two (1, 2, 4 ...). */
static inline int braid_pow2(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

/* The low `bits` bits of v in reverse order (the canonical tree's block
 * and node places: algorithms/pairwise.c, algorithms/direct.c). */
static inline int braid_bit_reverse(int v, int bits) {
  int r = 0;
  for (int i = 0; i < bits; i++) r |= ((v >> i) & 1) << (bits - 1 - i);
  return r;
}

/* calloc that logs and reports ncclSystemError on failure: the one way the
 * library allocates (ptrp is the address of the pointer to set). */
ncclResult_t braid_calloc(void* ptrp, size_t nelem, size_t elem_size);

/* realloc of *ptrp to nelem x elem_size bytes, checked for overflow; on
 * failure it logs, reports ncclSystemError and leaves *ptrp unchanged. */
ncclResult_t braid_realloc(void* ptrp, size_t nelem, size_t elem_size);

/* pthread_cond_timedwait for at most `ms` milliseconds (waits that must
 * also notice an abort flag, or outlive a missed signal). */
void braid_cond_wait_ms(pthread_cond_t* cond, pthread_mutex_t* mutex, int ms);

/* FNV-1a over len bytes, from h (BRAID_FNV_OFFSET to start): tells hosts,
 * devices and jobs apart; never a security function (siphash.h is). */
#define BRAID_FNV_OFFSET 0xcbf29ce484222325ull
uint64_t braid_fnv1a(uint64_t h, const void* data, size_t len);

/* Monotonic clock in nanoseconds. */
uint64_t braid_now_ns(void);

/* "ncclSystemError": a result's name in NCCL's enum, for logs about
 * results Braid did not make (a plugin's). */
const char* braid_result_name(ncclResult_t res);

/* One pause of a wait for a flag another agent (a GPU stream, a peer)
 * sets: yields for the first microsecond of calls, then sleeps, doubling
 * up to 100 us, so a long wait costs little CPU and a short one little
 * latency. *nap_ns starts at 0. Returns 1 when it slept (a good moment
 * for slower checks). */
int braid_backoff(long* nap_ns);

#endif /* BRAID_CORE_H_ */
