/*
 * Shared-memory connection setup (shm_connect.c): the sender creates,
 * sizes and fills a segment only this user may open, the receiver polls
 * for it, checks its header against the peer table and its own comm, maps
 * it and unlinks the name; each side opens the other's bell pipe.
 */
#ifndef BRAID_SHM_CONNECT_H_
#define BRAID_SHM_CONNECT_H_

#include "nccl.h"
#include "transport.h"

/* As struct transport names them. */
int shm_can_connect(const struct transport_ctx* ctx, int a, int b);
ncclResult_t shm_blob_make(struct transport_ctx* ctx, void* blob);
ncclResult_t shm_connect_send(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out);
ncclResult_t shm_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out);
ncclResult_t shm_connect_recv_try(struct transport_ctx* ctx, int peer, int channel,
                                  struct transport_conn** inout);

#endif /* BRAID_SHM_CONNECT_H_ */
