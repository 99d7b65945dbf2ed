/*
 * The net plugin transport (net_transport.c): whatever network an NCCL net
 * plugin reaches, where NCCL_NET names the plugin's network.
 */
#ifndef BRAID_NET_TRANSPORT_H_
#define BRAID_NET_TRANSPORT_H_

#include "transport.h"

#define NET_TRANSPORT_ID 4

extern const struct transport net_transport;

#endif /* BRAID_NET_TRANSPORT_H_ */
