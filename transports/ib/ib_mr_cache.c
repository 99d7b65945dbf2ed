/*
 * The registration cache (ib_mr_cache.h).
 */
#include "ib_mr_cache.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#define IB_MR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)

void ib_mr_cache_init(struct ib_mr_cache* c, const struct ib_verbs* v, struct ibv_pd* pd) {
  memset(c, 0, sizeof(*c));
  c->v = v;
  c->pd = pd;
}

void ib_mr_cache_free(struct ib_mr_cache* c) {
  for (int i = 0; i < IB_MR_CACHE_SIZE; i++)
    if (c->ents[i].mr) c->v->dereg_mr(c->ents[i].mr);
  memset(c->ents, 0, sizeof(c->ents));
}

/* A free entry, else the least recently used one nobody holds (its
 * region deregistered), else NULL. */
static struct ib_mr_ent* cache_slot(struct ib_mr_cache* c) {
  struct ib_mr_ent* victim = NULL;
  for (int i = 0; i < IB_MR_CACHE_SIZE; i++) {
    struct ib_mr_ent* e = &c->ents[i];
    if (e->mr == NULL) return e;
    if (e->refs == 0 && (victim == NULL || e->last_use < victim->last_use)) victim = e;
  }
  if (victim) {
    c->v->dereg_mr(victim->mr);
    memset(victim, 0, sizeof(*victim));
  }
  return victim;
}

ncclResult_t ib_mr_get(struct ib_mr_cache* c, const void* ptr, size_t bytes,
                       struct ib_mr_ent** out) {
  ncclResult_t res = ncclSuccess;
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)ptr;
  uintptr_t base = a & ~(page - 1), end = ALIGN_UP(a + (bytes ? bytes : 1), page);
  struct ib_mr_ent* e = NULL;
  for (int i = 0; i < IB_MR_CACHE_SIZE && e == NULL; i++)
    if (c->ents[i].mr && c->ents[i].base <= base && end <= c->ents[i].end) e = &c->ents[i];
  if (e == NULL) {
    e = cache_slot(c);
    if (e == NULL)
      FAIL(ncclSystemError, "NET/IB : all %d registrations are in use", IB_MR_CACHE_SIZE);
    e->mr = c->v->reg_mr(c->pd, (void*)base, end - base, IB_MR_ACCESS);
    if (e->mr == NULL)
      FAIL(ncclSystemError, "NET/IB : ibv_reg_mr of %zu bytes failed: %s (memlock limit?)",
           (size_t)(end - base), strerror(errno));
    e->base = base;
    e->end = end;
    c->registrations++;
  }
  e->refs++;
  e->last_use = ++c->clock;
  *out = e;
fail:
  return res;
}

void ib_mr_put(struct ib_mr_ent* e) {
  if (e) e->refs--;
}
