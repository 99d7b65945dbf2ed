/*
 * A set of pointers behind a mutex: what a library must keep to refuse a
 * handle it never gave out, or one already given back, without reading the
 * memory it points to (the live communicators, ncclMemAlloc's blocks).
 * Open addressing; lookups cost a hash and a probe or two.
 */
#ifndef BRAID_PTR_SET_H_
#define BRAID_PTR_SET_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct ptr_set {
  pthread_mutex_t lock;
  uintptr_t* slots;
  size_t cap, used; /* used counts live entries and tombstones */
};

#define PTR_SET_INIT \
  { PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0 }

ncclResult_t ptr_set_add(struct ptr_set* set, const void* p);
/* 1 when p was there (and is removed now), 0 when it was not. */
int ptr_set_remove(struct ptr_set* set, const void* p);
/* Whether p is there. */
int ptr_set_has(struct ptr_set* set, const void* p);
/* The same under the set's lock, which the caller holds (ptr_set_lock):
 * what it does before ptr_set_unlock, no remove comes in between. */
void ptr_set_lock(struct ptr_set* set);
int ptr_set_has_locked(const struct ptr_set* set, const void* p);
void ptr_set_unlock(struct ptr_set* set);

#endif /* BRAID_PTR_SET_H_ */
