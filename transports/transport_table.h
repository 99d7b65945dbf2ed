/*
 * The transport table (transport_table.c): which transport carries a pair
 * of ranks, in the order a pair tries them, and what is done with every
 * transport of the build at once (blobs, registrations, the device, the
 * comm's states).
 */
#ifndef BRAID_TRANSPORT_TABLE_H_
#define BRAID_TRANSPORT_TABLE_H_

#include <stddef.h>

#include "nccl.h"
#include "peer.h"
#include "transport.h"

/* Read the table's knobs into ctx: NCCL_NET must name a network this
 * build has (ncclInvalidArgument with a WARN otherwise). */
ncclResult_t transport_table_init(struct transport_ctx* ctx);

/* Every transport's blob for this rank, into `mine` (its peer_info): a
 * record each, its id, its length and its bytes, in the table's order
 * (transport_peer_blob reads a peer's). ncclInternalError if they do not
 * fit PEER_BLOB_BYTES. */
ncclResult_t transport_blobs_make(struct transport_ctx* ctx, struct peer_info* mine);

/* The key of the build's transport with this id ("tcp"), NULL if none;
 * and back, -1 if none (the flight recorder's names). */
const char* transport_key_of(unsigned id);
int transport_id_of(const char* key);

/* transport_register_each over the table. */
ncclResult_t transport_register(struct transport_ctx* ctx, void* base, size_t size, void** handles);
void transport_deregister(struct transport_ctx* ctx, void** handles);

/* The network transport NCCL_NET named (Socket when unset). */
const struct transport* transport_network(const struct transport_ctx* ctx);

/* The first transport of the table that joins ranks a and b and moves
 * `mem_caps` (TRANSPORT_CAP_*_MEM), or NULL. Pure on the peer table. */
const struct transport* transport_select(const struct transport_ctx* ctx, int a, int b,
                                         unsigned mem_caps);

/* The transport this rank uses with `peer` (host memory), chosen once and
 * logged at INFO; ncclSystemError with a WARN if none can join them. */
ncclResult_t transport_for_peer(struct transport_ctx* ctx, int peer, const struct transport** out);

/* The transport that moves device buffers between this rank and `peer`
 * without host memory (cudaipc), chosen once and logged at INFO; NULL
 * where none can (then they are staged through host memory). */
const struct transport* transport_for_peer_device(struct transport_ctx* ctx, int peer);

/* The comm's device is made: ctx->device = dev, and every transport that
 * moves device memory gets ready (device_attach). */
ncclResult_t transport_device_attach(struct transport_ctx* ctx, struct transport_device* dev);

/* A copy of the comm's ctx for another thread that makes and drives
 * connections of its own (the tagged point-to-point lane): its own epoll
 * set and waits, the same peers, secret and listener, whose incoming
 * connections both share (made now if they were not yet). */
ncclResult_t transport_ctx_fork(struct transport_ctx* ctx, int epoll_fd,
                                struct transport_waits* waits, struct transport_ctx* out);

/* The transport of the lane (TRANSPORT_CHANNEL_LANE) with `peer`: one
 * whose receive side can be made without waiting (connect_recv_try),
 * shared memory where it joins the pair, else TCP. */
const struct transport* transport_lane_for_peer(const struct transport_ctx* ctx, int peer);

/* The comm's network's devices as the topology's report gives them (one
 * line into out, len bytes), where the network's own run time knows them
 * (a net plugin's); 0 and "" otherwise. */
int transport_network_describe(const struct transport_ctx* ctx, char* out, size_t len);

/* Free what each transport kept for the comm (ctx->state, and incoming
 * connections nobody claimed), once its connections are closed. */
void transport_states_free(struct transport_ctx* ctx);

#endif /* BRAID_TRANSPORT_TABLE_H_ */
