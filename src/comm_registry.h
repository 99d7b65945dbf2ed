/*
 * The live communicators (comm_registry.c): added at creation, removed
 * when the user destroys or aborts one, so that comm_check refuses a
 * handle that is gone without reading its memory.
 */
#ifndef BRAID_COMM_REGISTRY_H_
#define BRAID_COMM_REGISTRY_H_

#include "nccl.h"

struct ncclComm;

ncclResult_t comm_registry_add(const struct ncclComm* comm);
void comm_registry_remove(const struct ncclComm* comm);
int comm_registry_has(const struct ncclComm* comm);
/* Under the registry's lock: count a call in (comm->calls) if comm is
 * live; 0 if it is not. */
int comm_registry_enter(struct ncclComm* comm);

#endif /* BRAID_COMM_REGISTRY_H_ */
