/*
 * Protection domains and memory regions of the verbs emulation. Keys are
 * an index into the process's table (plus a base, so 0 is never a key);
 * a deregistered region's key names nothing, and a request with it fails
 * like hardware: a local protection error at the requester, a remote
 * access error at the target.
 */
#include <errno.h>
#include <stdlib.h>

#include "fakeverbs.h"

#define FV_MAX_MRS 4096
#define FV_KEY_BASE 0x1000u

pthread_mutex_t fv_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ibv_mr* g_mrs[FV_MAX_MRS];
static uint64_t g_registrations;

/* For tests (not a verb): how many regions this process registered. */
FV_EXPORT uint64_t fakeverbs_registrations(void) {
  pthread_mutex_lock(&fv_lock);
  uint64_t n = g_registrations;
  pthread_mutex_unlock(&fv_lock);
  return n;
}

/* For tests (not a verb): how many live regions overlap [addr, addr +
 * len). A registration pins the pages as they were: one left on a user's
 * buffer after it may have been freed is what this finds. */
FV_EXPORT int fakeverbs_registered(const void* addr, size_t len) {
  uintptr_t lo = (uintptr_t)addr, hi = lo + len;
  int n = 0;
  pthread_mutex_lock(&fv_lock);
  for (int i = 0; i < FV_MAX_MRS; i++)
    if (g_mrs[i]) {
      uintptr_t b = (uintptr_t)g_mrs[i]->addr, e = b + g_mrs[i]->length;
      n += b < hi && lo < e;
    }
  pthread_mutex_unlock(&fv_lock);
  return n;
}

FV_EXPORT struct ibv_pd* ibv_alloc_pd(struct ibv_context* ctx) {
  struct ibv_pd* pd = calloc(1, sizeof(*pd));
  if (pd) pd->context = ctx;
  return pd;
}

FV_EXPORT int ibv_dealloc_pd(struct ibv_pd* pd) {
  free(pd);
  return 0;
}

#undef ibv_reg_mr
FV_EXPORT struct ibv_mr* ibv_reg_mr(struct ibv_pd* pd, void* addr, size_t length, int access) {
  struct ibv_mr* mr = calloc(1, sizeof(*mr));
  if (mr == NULL) return NULL;
  pthread_mutex_lock(&fv_lock);
  int i = 0;
  while (i < FV_MAX_MRS && g_mrs[i]) i++;
  if (i == FV_MAX_MRS) {
    pthread_mutex_unlock(&fv_lock);
    free(mr);
    errno = ENOMEM;
    return NULL;
  }
  *mr = (struct ibv_mr){.context = pd->context,
                        .pd = pd,
                        .addr = addr,
                        .length = length,
                        .lkey = FV_KEY_BASE + (uint32_t)i,
                        .rkey = FV_KEY_BASE + (uint32_t)i};
  mr->handle = (uint32_t)access; /* the access flags: ibv_mr has no field of its own for them */
  g_mrs[i] = mr;
  g_registrations++;
  pthread_mutex_unlock(&fv_lock);
  return mr;
}

/* The newer entry point verbs.h may route ibv_reg_mr to. */
FV_EXPORT struct ibv_mr* ibv_reg_mr_iova2(struct ibv_pd* pd, void* addr, size_t length,
                                          uint64_t iova, unsigned int access) {
  (void)iova;
  return ibv_reg_mr(pd, addr, length, (int)access);
}

FV_EXPORT int ibv_dereg_mr(struct ibv_mr* mr) {
  pthread_mutex_lock(&fv_lock);
  uint32_t i = mr->lkey - FV_KEY_BASE;
  if (i < FV_MAX_MRS && g_mrs[i] == mr) g_mrs[i] = NULL;
  pthread_mutex_unlock(&fv_lock);
  free(mr);
  return 0;
}

struct ibv_mr* fv_mr_check(uint32_t key, uint64_t addr, uint64_t len, int access) {
  uint32_t i = key - FV_KEY_BASE;
  struct ibv_mr* mr = i < FV_MAX_MRS ? g_mrs[i] : NULL;
  uint64_t base = mr ? (uint64_t)(uintptr_t)mr->addr : 0;
  if (mr == NULL || addr < base || len > mr->length || addr - base > mr->length - len) return NULL;
  if (access && ((int)mr->handle & access) != access) return NULL;
  return mr;
}
