/*
 * The live communicators of the process. A handle passed again after
 * ncclCommDestroy/Abort must be refused without reading the memory it
 * pointed to, and only a record outside that memory can tell: a pointer
 * set, one of the library's two pieces of process-wide state (the other
 * is ncclMemAlloc's, mem_alloc.c).
 */
#include <stdatomic.h>

#include "comm.h"
#include "core.h"
#include "ptr_set.h"

static struct ptr_set g_comms = PTR_SET_INIT;

ncclResult_t comm_registry_add(const struct ncclComm* comm) {
  return ptr_set_add(&g_comms, comm);
}

void comm_registry_remove(const struct ncclComm* comm) {
  ptr_set_remove(&g_comms, comm);
}

int comm_registry_has(const struct ncclComm* comm) {
  return ptr_set_has(&g_comms, comm, NULL, NULL);
}

/* Under the set's lock: a remove (abort, destroy) cannot come in between. */
static void count_call(const void* p, void* arg) {
  (void)arg;
  atomic_fetch_add(&((struct ncclComm*)p)->calls, 1);
}

int comm_registry_enter(struct ncclComm* comm) {
  return ptr_set_has(&g_comms, comm, count_call, NULL);
}
