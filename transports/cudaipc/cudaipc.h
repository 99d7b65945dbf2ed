/*
 * CUDA IPC between ranks of a node (cudaipc.c): its descriptor, a row of
 * the transport table. The direct device path (src/cuda/cuda_direct.c)
 * reads the export its reg hook leaves in a registration, by its id.
 */
#ifndef BRAID_CUDAIPC_H_
#define BRAID_CUDAIPC_H_

#include "transport.h"

extern const struct transport cudaipc_transport;

#endif /* BRAID_CUDAIPC_H_ */
