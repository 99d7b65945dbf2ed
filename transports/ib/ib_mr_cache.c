/*
 * The registration cache (ib_mr_cache.h).
 */
#include "ib_mr_cache.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

void ib_mr_cache_init(struct ib_mr_cache* c, const struct ib_verbs* v, struct ibv_pd* pd) {
  memset(c, 0, sizeof(*c));
  pthread_mutex_init(&c->lock, NULL);
  c->v = v;
  c->pd = pd;
}

static void ent_drop(struct ib_mr_cache* c, struct ib_mr_ent* e) {
  c->v->dereg_mr(e->mr);
  memset(e, 0, sizeof(*e));
}

void ib_mr_cache_free(struct ib_mr_cache* c) {
  for (int i = 0; i < IB_MR_CACHE_SIZE; i++)
    if (c->ents[i].mr) ent_drop(c, &c->ents[i]);
  pthread_mutex_destroy(&c->lock);
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
  if (victim) ent_drop(c, victim);
  return victim;
}

/* An entry covering [base, end): every one listed is held or kept, so
 * none can be stale. */
static struct ib_mr_ent* cache_find(struct ib_mr_cache* c, uintptr_t base, uintptr_t end) {
  for (int i = 0; i < IB_MR_CACHE_SIZE; i++)
    if (c->ents[i].mr && c->ents[i].base <= base && end <= c->ents[i].end) return &c->ents[i];
  return NULL;
}

static ncclResult_t cache_add(struct ib_mr_cache* c, uintptr_t base, uintptr_t end, int keep,
                              struct ib_mr_ent** out) {
  struct ib_mr_ent* e = cache_slot(c);
  if (e == NULL) {
    WARN("NET/IB : all %d registrations are in use", IB_MR_CACHE_SIZE);
    return ncclSystemError;
  }
  e->mr = c->v->reg_mr(c->pd, (void*)base, end - base, IB_MR_ACCESS);
  if (e->mr == NULL) {
    WARN("NET/IB : ibv_reg_mr of %zu bytes failed: %s (memlock limit?)", (size_t)(end - base),
         strerror(errno));
    return ncclSystemError;
  }
  e->base = base;
  e->end = end;
  e->keep = keep;
  e->cache = c;
  c->registrations++;
  *out = e;
  return ncclSuccess;
}

ncclResult_t ib_mr_get(struct ib_mr_cache* c, const void* ptr, size_t bytes, int keep,
                       struct ib_mr_ent** out) {
  ncclResult_t res = ncclSuccess;
  /* Exactly the range, not the pages around it: the NIC lets the peer
   * write wherever the registration reaches, and the rest of a page is
   * someone else's memory (the heap's neighbours). */
  uintptr_t base = (uintptr_t)ptr, end = base + (bytes ? bytes : 1);
  struct ib_mr_ent* e;
  pthread_mutex_lock(&c->lock);
  e = cache_find(c, base, end);
  if (e == NULL) CHECK(cache_add(c, base, end, keep, &e));
  e->refs++;
  e->last_use = ++c->clock;
  *out = e;
fail:
  pthread_mutex_unlock(&c->lock);
  return res;
}

void ib_mr_hold(struct ib_mr_ent* e) {
  pthread_mutex_lock(&e->cache->lock);
  e->refs++;
  pthread_mutex_unlock(&e->cache->lock);
}

void ib_mr_put(struct ib_mr_ent* e) {
  struct ib_mr_cache* c;
  if (e == NULL) return;
  c = e->cache;
  pthread_mutex_lock(&c->lock);
  if (--e->refs == 0 && !e->keep) ent_drop(c, e);
  pthread_mutex_unlock(&c->lock);
}
