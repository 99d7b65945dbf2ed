/*
 * An NCCL net plugin, loaded and adapted (net_plugin.c): whichever of the
 * versions 8 to 12 the library offers (the highest), behind one interface
 * that speaks size_t and one buffer per receive. Everything the plugin
 * returns is checked before use: sizes, counts, handles, properties; a
 * plugin is code Braid did not write, and a wrong answer from it must be
 * an error, never a write past a buffer.
 *
 * The library is found as NCCL finds it: NCCL_NET_PLUGIN names it (a path
 * or a library name, else libnccl-net-<name>.so), or libnccl-net.so when
 * unset; "none" loads nothing. It is loaded once per process, at the
 * first comm whose NCCL_NET names no built-in network, and stays.
 */
#ifndef BRAID_NET_PLUGIN_H_
#define BRAID_NET_PLUGIN_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define NET_PLUGIN_HANDLE_BYTES 128

struct net_plugin;

/* What a device says of itself, checked (net_plugin_props). */
struct net_props {
  char name[64];
  int host_ptrs;   /* takes host memory (every device a host uses does) */
  int device_ptrs; /* takes CUDA device memory */
  int speed_mbps;  /* > 0 */
  double latency_us;
  size_t max_bytes; /* the largest message it takes at once */
  int max_recvs;    /* receives it groups in one request (Braid posts them one by one) */
};

/* The process's plugin, loaded at the first call: ncclSuccess with *out,
 * or an error with a WARN saying why none could be loaded. */
ncclResult_t net_plugin_get(struct net_plugin** out);
const char* net_plugin_name(const struct net_plugin* p);

/* A comm's use of the plugin: its context (v11 and up; NULL before). */
ncclResult_t net_plugin_open(struct net_plugin* p, uint64_t comm_id, void** ctx);
void net_plugin_close(struct net_plugin* p, void* ctx);

ncclResult_t net_plugin_devices(struct net_plugin* p, int* ndev);
ncclResult_t net_plugin_props(struct net_plugin* p, int dev, struct net_props* out);

/* Connection setup; none blocks. connect and accept give NULL until the
 * connection is made: call again, connect with the same handle's memory
 * (a plugin keeps the state of a connect in progress there, as NCCL lets
 * it). */
ncclResult_t net_plugin_listen(struct net_plugin* p, void* ctx, int dev,
                               uint8_t handle[NET_PLUGIN_HANDLE_BYTES], void** listen);
ncclResult_t net_plugin_connect(struct net_plugin* p, void* ctx, int dev,
                                uint8_t handle[NET_PLUGIN_HANDLE_BYTES], void** send);
ncclResult_t net_plugin_accept(struct net_plugin* p, void* listen, void** recv);
void net_plugin_close_send(struct net_plugin* p, void* send);
void net_plugin_close_recv(struct net_plugin* p, void* recv);
void net_plugin_close_listen(struct net_plugin* p, void* listen);

/* Registration of a connection's message memory: host memory, or CUDA
 * device memory (`device`) where the device takes it (device_ptrs). */
ncclResult_t net_plugin_reg(struct net_plugin* p, void* comm, void* data, size_t size, int device,
                            void** mhandle);
void net_plugin_dereg(struct net_plugin* p, void* comm, void* mhandle);

/* One message each (at most the device's max_bytes). *request NULL: the
 * plugin cannot take it now, post again later. */
ncclResult_t net_plugin_isend(struct net_plugin* p, void* send, void* data, size_t size, int tag,
                              void* mhandle, void** request);
ncclResult_t net_plugin_irecv(struct net_plugin* p, void* recv, void* data, size_t size, int tag,
                              void* mhandle, void** request);
/* After a receive into device memory: make what the NIC wrote visible to
 * the GPU's later work; *request NULL: nothing to wait for. */
ncclResult_t net_plugin_iflush(struct net_plugin* p, void* recv, void* data, size_t size,
                               void* mhandle, void** request);
/* *done, and for a done receive (got not NULL) the bytes that came,
 * checked against `size`, what was posted: more is an error. */
ncclResult_t net_plugin_test(struct net_plugin* p, void* request, size_t size, int* done,
                             size_t* got);

#endif /* BRAID_NET_PLUGIN_H_ */
