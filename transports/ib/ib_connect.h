/*
 * Verbs setup (ib_connect.c): the comm's device (the port nearest the
 * rank, its PD and GID), what a rank publishes about it, and connections:
 * the sending side dials an out-of-band TCP socket and sends its QPs'
 * info, the receiving side makes as many QPs, connects them and answers,
 * the sender connects when the answer arrives (ib_info_take, from
 * progress). The socket stays in the progress engine's epoll set: its end
 * is how a vanished peer shows.
 */
#ifndef BRAID_IB_CONNECT_H_
#define BRAID_IB_CONNECT_H_

#include "ib_transport.h"
#include "nccl.h"
#include "transport.h"

/* What a rank publishes: whether it speaks verbs, and on what link. */
struct ib_blob {
  uint8_t valid;
  uint8_t link_layer;
  uint8_t far; /* its port is on another NUMA node than the rank */
  uint8_t pad;
  uint32_t mbps; /* its port's rate */
};

/* The comm's device, or NULL where verbs are not its network. */
struct ib_state* ib_state_of(const struct transport_ctx* ctx);

/* The sender: the receiver's answer, once whole on the socket (*got 0:
 * not yet): connect the QPs. */
ncclResult_t ib_info_take(struct ib_conn* c, int* got);

/* As struct transport names them. */
ncclResult_t ib_blob_make(struct transport_ctx* ctx, void* blob);
uint32_t ib_link_mbps(const struct transport_ctx* ctx, int rank);
void ib_describe(const struct transport_ctx* ctx, char* out, size_t len);
int ib_can_connect(const struct transport_ctx* ctx, int a, int b);
void ib_free_state(struct transport_ctx* ctx);
ncclResult_t ib_connect_send(struct transport_ctx* ctx, int peer, int channel,
                             struct transport_conn** out);
ncclResult_t ib_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                             struct transport_conn** out);
void ib_shutdown(struct transport_conn* conn);
void ib_close(struct transport_conn* conn);

#endif /* BRAID_IB_CONNECT_H_ */
