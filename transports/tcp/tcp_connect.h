/*
 * TCP connection setup (tcp_connect.c): this rank's blob and data
 * listener, connections made by hellos read side by side (hello_pool), and
 * out-of-band sockets for another transport's setup and liveness (the
 * verbs transport's QP numbers, its peer's death): one socket per (peer,
 * channel), dialled by the side that sends, answered by the one that
 * receives, after the same hello, on hello channels past TCP's own.
 */
#ifndef BRAID_TCP_CONNECT_H_
#define BRAID_TCP_CONNECT_H_

#include "nccl.h"
#include "tcp.h"
#include "transport.h"

ncclResult_t tcp_blob_make(struct transport_ctx* ctx, void* blob);

ncclResult_t tcp_oob_dial(struct transport_ctx* ctx, int peer, int channel, int* fd);
ncclResult_t tcp_oob_answer(struct transport_ctx* ctx, int peer, int channel, int* fd);

/* Why a hello is refused, or NULL; exposed for the fuzzer. */
const char* tcp_hello_problem(const struct transport_ctx* ctx, const struct tcp_hello* h);

/* A connection with no sockets yet. */
ncclResult_t tcp_conn_alloc(int peer, int is_send, int nsocks, struct tcp_conn** out);

/* Connection setup (tcp_connect.c), as struct transport names them. */
ncclResult_t tcp_connect_send(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out);
ncclResult_t tcp_connect_recv(struct transport_ctx* ctx, int peer, int channel,
                              struct transport_conn** out);
ncclResult_t tcp_connect_duplex(struct transport_ctx* ctx, int peer, int channel, int send_phase,
                                struct transport_conn** send, struct transport_conn** recv);

ncclResult_t tcp_connect_recv_try(struct transport_ctx* ctx, int peer, int channel,
                                  struct transport_conn** inout);

/* Make ctx's state of incoming connections now, so that copies of ctx
 * (transport_ctx_fork) share it. */
ncclResult_t transport_accept_share(struct transport_ctx* ctx);
/* Close the incoming connections nobody claimed. */
void transport_accept_free(struct transport_ctx* ctx);

#endif /* BRAID_TCP_CONNECT_H_ */
