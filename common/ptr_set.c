/*
 * The pointer set (ptr_set.h): open addressing with tombstones, rehashed
 * when half full; it grows only when live entries fill a quarter of it, so
 * pointers added and removed again do not make it grow.
 */
#include "ptr_set.h"

#include <stdlib.h>

#include "core.h"

#define PTR_SET_TOMB ((uintptr_t)1) /* a removed entry: probing goes on past it */

static size_t set_hash(uintptr_t p, size_t cap) {
  uint64_t x = (uint64_t)p * 0x9e3779b97f4a7c15ull;
  return (size_t)(x >> 17) & (cap - 1);
}

/* The slot holding p, or the first free one on its probe path. */
static size_t set_find(const struct ptr_set* s, uintptr_t p) {
  size_t i = set_hash(p, s->cap), tomb = SIZE_MAX;
  for (;; i = (i + 1) & (s->cap - 1)) {
    uintptr_t v = s->slots[i];
    if (v == p) return i;
    if (v == PTR_SET_TOMB && tomb == SIZE_MAX) tomb = i;
    if (v == 0) return tomb != SIZE_MAX ? tomb : i;
  }
}

/* Rehash without tombstones, into twice the room when live entries fill a
 * quarter of it. */
static ncclResult_t set_grow(struct ptr_set* s) {
  size_t old_cap = s->cap, live = 0;
  uintptr_t* old = s->slots;
  for (size_t i = 0; i < old_cap; i++) live += old[i] > PTR_SET_TOMB;
  size_t cap = old_cap == 0 ? 64 : 4 * (live + 1) > old_cap ? 2 * old_cap : old_cap;
  uintptr_t* slots = NULL;
  ncclResult_t res = braid_calloc(&slots, cap, sizeof(*slots));
  if (res != ncclSuccess) return res;
  s->slots = slots;
  s->cap = cap;
  s->used = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i] > PTR_SET_TOMB) s->slots[set_find(s, old[i])] = old[i], s->used++;
  free(old);
  return ncclSuccess;
}

ncclResult_t ptr_set_add(struct ptr_set* s, const void* ptr) {
  ncclResult_t res = ncclSuccess;
  uintptr_t p = (uintptr_t)ptr;
  pthread_mutex_lock(&s->lock);
  if (2 * (s->used + 1) > s->cap) res = set_grow(s);
  if (res == ncclSuccess) {
    size_t i = set_find(s, p);
    if (s->slots[i] != p) s->used += s->slots[i] == 0;
    s->slots[i] = p;
  }
  pthread_mutex_unlock(&s->lock);
  return res;
}

int ptr_set_remove(struct ptr_set* s, const void* ptr) {
  int found = 0;
  pthread_mutex_lock(&s->lock);
  if (s->cap && (uintptr_t)ptr > PTR_SET_TOMB) {
    size_t i = set_find(s, (uintptr_t)ptr);
    found = s->slots[i] == (uintptr_t)ptr;
    if (found) s->slots[i] = PTR_SET_TOMB;
  }
  pthread_mutex_unlock(&s->lock);
  return found;
}

void ptr_set_lock(struct ptr_set* s) {
  pthread_mutex_lock(&s->lock);
}

void ptr_set_unlock(struct ptr_set* s) {
  pthread_mutex_unlock(&s->lock);
}

int ptr_set_has_locked(const struct ptr_set* s, const void* ptr) {
  return s->cap && (uintptr_t)ptr > PTR_SET_TOMB &&
         s->slots[set_find(s, (uintptr_t)ptr)] == (uintptr_t)ptr;
}

int ptr_set_has(struct ptr_set* s, const void* ptr) {
  ptr_set_lock(s);
  int found = ptr_set_has_locked(s, ptr);
  ptr_set_unlock(s);
  return found;
}
