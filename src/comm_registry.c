/*
 * The live communicators of the process. A handle passed again after
 * ncclCommDestroy/Abort must be refused without reading the memory it
 * pointed to, and only a record outside that memory can tell: this is the
 * library's one piece of process-wide mutable state. An open-addressing
 * set of pointers behind a mutex; lookups cost a hash and a probe or two.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "comm.h"
#include "core.h"

#define REGISTRY_TOMB ((uintptr_t)1) /* a removed entry: probing goes on past it */

static struct {
  pthread_mutex_t lock;
  uintptr_t* slots;
  size_t cap, used; /* used counts live entries and tombstones */
} g_registry = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

static size_t registry_hash(uintptr_t p, size_t cap) {
  uint64_t x = (uint64_t)p * 0x9e3779b97f4a7c15ull;
  return (size_t)(x >> 17) & (cap - 1);
}

/* The slot holding p, or the first free one on its probe path. */
static size_t registry_find(uintptr_t p) {
  size_t i = registry_hash(p, g_registry.cap), tomb = SIZE_MAX;
  for (;; i = (i + 1) & (g_registry.cap - 1)) {
    uintptr_t v = g_registry.slots[i];
    if (v == p) return i;
    if (v == REGISTRY_TOMB && tomb == SIZE_MAX) tomb = i;
    if (v == 0) return tomb != SIZE_MAX ? tomb : i;
  }
}

/* Rehash without tombstones, into twice the room when live entries fill
 * a quarter of it: created and destroyed comms do not make it grow. */
static ncclResult_t registry_grow(void) {
  size_t old_cap = g_registry.cap, live = 0;
  uintptr_t* old = g_registry.slots;
  for (size_t i = 0; i < old_cap; i++) live += old[i] > REGISTRY_TOMB;
  size_t cap = old_cap == 0 ? 64 : 4 * (live + 1) > old_cap ? 2 * old_cap : old_cap;
  uintptr_t* slots = NULL;
  ncclResult_t res = braid_calloc(&slots, cap, sizeof(*slots));
  if (res != ncclSuccess) return res;
  g_registry.slots = slots;
  g_registry.cap = cap;
  g_registry.used = 0;
  for (size_t i = 0; i < old_cap; i++)
    if (old[i] > REGISTRY_TOMB) g_registry.slots[registry_find(old[i])] = old[i], g_registry.used++;
  free(old);
  return ncclSuccess;
}

ncclResult_t comm_registry_add(const struct ncclComm* comm) {
  ncclResult_t res = ncclSuccess;
  pthread_mutex_lock(&g_registry.lock);
  if (2 * (g_registry.used + 1) > g_registry.cap) res = registry_grow();
  if (res == ncclSuccess) {
    size_t i = registry_find((uintptr_t)comm);
    if (g_registry.slots[i] != (uintptr_t)comm) g_registry.used += g_registry.slots[i] == 0;
    g_registry.slots[i] = (uintptr_t)comm;
  }
  pthread_mutex_unlock(&g_registry.lock);
  return res;
}

void comm_registry_remove(const struct ncclComm* comm) {
  pthread_mutex_lock(&g_registry.lock);
  if (g_registry.cap) {
    size_t i = registry_find((uintptr_t)comm);
    if (g_registry.slots[i] == (uintptr_t)comm) g_registry.slots[i] = REGISTRY_TOMB;
  }
  pthread_mutex_unlock(&g_registry.lock);
}

int comm_registry_has(const struct ncclComm* comm) {
  int found = 0;
  pthread_mutex_lock(&g_registry.lock);
  if (g_registry.cap && (uintptr_t)comm > REGISTRY_TOMB)
    found = g_registry.slots[registry_find((uintptr_t)comm)] == (uintptr_t)comm;
  pthread_mutex_unlock(&g_registry.lock);
  return found;
}
