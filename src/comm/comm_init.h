/*
 * The start of a communicator's life (comm_init.c): besides the API calls
 * (ncclCommInitRank and friends), what the calls that make a comm from
 * another (split, shrink, grow) need of it.
 */
#ifndef BRAID_COMM_INIT_H_
#define BRAID_COMM_INIT_H_

#include "nccl.h"

/* A user config read up to the size the caller's header gave it. */
ncclResult_t comm_config_read(const ncclConfig_t* user, ncclConfig_t* out);

#endif /* BRAID_COMM_INIT_H_ */
