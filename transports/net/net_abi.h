/*
 * The binary interface of NCCL's net plugins, versions 8 to 12, as
 * Braid's own declarations: the tables a plugin library exports under
 * the names ncclNetPlugin_v8 ... ncclNetPlugin_v12, and the structures
 * they pass. Layouts and calling conventions are those NCCL 2.19-2.30
 * loads (docs/net-plugins.md lists what changed at each version); the
 * names here are Braid's. Only net_plugin.c reads them: it adapts
 * whichever version a plugin offers to one interface (net_plugin.h).
 */
#ifndef BRAID_NET_ABI_H_
#define BRAID_NET_ABI_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define NET_ABI_HANDLE_BYTES 128 /* a listen handle, opaque */
#define NET_ABI_PTR_HOST 0x1
#define NET_ABI_PTR_CUDA 0x2
#define NET_ABI_PTR_DMABUF 0x4
#define NET_ABI_DEVICE_HOST 0 /* netDeviceType: the host drives the NIC */

/* The logger a plugin is given: NCCL's levels and subsystem flags. */
typedef void (*net_abi_logger)(int level, unsigned long flags, const char* file, int line,
                               const char* fmt, ...);
typedef ncclResult_t (*net_abi_profiler)(void** handle, int type, void* phandle, int64_t id,
                                         void* data);

/* What a plugin says of a device that offloads to the GPU (never used: a
 * host accepts only host-driven devices). */
struct net_abi_device_handle {
  int type;
  int version;
  void* handle;
  size_t size;
  int needs_proxy_progress;
};

struct net_abi_props_v8 {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int speed_mbps;
  int port;
  float latency_us;
  int max_comms;
  int max_recvs;
  int device_type;
  int device_version;
};

/* v9-v11: forceFlush after regIsGlobal; virtual-device members at the end. */
struct net_abi_vdev_v9 {
  int ndevs;
  int devs[4];
};
struct net_abi_props_v9 {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int force_flush;
  int speed_mbps;
  int port;
  float latency_us;
  int max_comms;
  int max_recvs;
  int device_type;
  int device_version;
  struct net_abi_vdev_v9 vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
};
struct net_abi_props_v11 {
  struct net_abi_props_v9 v9;
  int max_multi_request_size;
};

/* v12: eight virtual devices, then rail and plane ids. */
struct net_abi_vdev_v12 {
  int ndevs;
  int devs[8];
};
struct net_abi_props_v12 {
  char* name;
  char* pci_path;
  uint64_t guid;
  int ptr_support;
  int reg_is_global;
  int force_flush;
  int speed_mbps;
  int port;
  float latency_us;
  int max_comms;
  int max_recvs;
  int device_type;
  int device_version;
  struct net_abi_vdev_v12 vprops;
  size_t max_p2p_bytes;
  size_t max_coll_bytes;
  int max_multi_request_size;
  int16_t rail_id;
  int16_t plane_id;
};

/* The per-communicator configuration of v10's connect and v11+'s init. */
struct net_abi_config {
  int traffic_class;
};

typedef struct net_abi_device_handle net_abi_dh;

/* The tables, member for member. Unused members are declared with the
 * types the plugin compiled them with, so that the offsets match. */
struct net_abi_v8 {
  const char* name;
  ncclResult_t (*init)(net_abi_logger log);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*get_properties)(int dev, struct net_abi_props_v8* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm, net_abi_dh** dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, net_abi_dh** dev_comm);
  ncclResult_t (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*reg_mr_dmabuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle);
  ncclResult_t (*dereg_mr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, int size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*close_send)(void* send_comm);
  ncclResult_t (*close_recv)(void* recv_comm);
  ncclResult_t (*close_listen)(void* listen_comm);
  ncclResult_t (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecv_consumed)(void* recv_comm, int n, void* request);
};

struct net_abi_v9 {
  const char* name;
  ncclResult_t (*init)(net_abi_logger log);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*get_properties)(int dev, struct net_abi_props_v9* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, void* handle, void** send_comm, net_abi_dh** dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, net_abi_dh** dev_comm);
  ncclResult_t (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*reg_mr_dmabuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle);
  ncclResult_t (*dereg_mr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*close_send)(void* send_comm);
  ncclResult_t (*close_recv)(void* recv_comm);
  ncclResult_t (*close_listen)(void* listen_comm);
  ncclResult_t (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecv_consumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*make_vdevice)(int* d, void* props);
};

struct net_abi_v10 {
  const char* name;
  ncclResult_t (*init)(net_abi_logger log, net_abi_profiler prof);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*get_properties)(int dev, struct net_abi_props_v9* props);
  ncclResult_t (*listen)(int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(int dev, struct net_abi_config* config, void* handle, void** send_comm,
                          net_abi_dh** dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, net_abi_dh** dev_comm);
  ncclResult_t (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*reg_mr_dmabuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle);
  ncclResult_t (*dereg_mr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*close_send)(void* send_comm);
  ncclResult_t (*close_recv)(void* recv_comm);
  ncclResult_t (*close_listen)(void* listen_comm);
  ncclResult_t (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecv_consumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*make_vdevice)(int* d, void* props);
};

/* v11 and v12: the same members (v12's properties differ); a context per
 * communicator from init, handed to listen and connect, ended by
 * finalize. */
struct net_abi_v11 {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t comm_id, struct net_abi_config* config,
                       net_abi_logger log, net_abi_profiler prof);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*get_properties)(int dev, void* props);
  ncclResult_t (*listen)(void* ctx, int dev, void* handle, void** listen_comm);
  ncclResult_t (*connect)(void* ctx, int dev, void* handle, void** send_comm,
                          net_abi_dh** dev_comm);
  ncclResult_t (*accept)(void* listen_comm, void** recv_comm, net_abi_dh** dev_comm);
  ncclResult_t (*reg_mr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*reg_mr_dmabuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                int fd, void** mhandle);
  ncclResult_t (*dereg_mr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                        void* phandle, void** request);
  ncclResult_t (*irecv)(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                        void** mhandles, void** phandles, void** request);
  ncclResult_t (*iflush)(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*close_send)(void* send_comm);
  ncclResult_t (*close_recv)(void* recv_comm);
  ncclResult_t (*close_listen)(void* listen_comm);
  ncclResult_t (*get_device_mr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecv_consumed)(void* recv_comm, int n, void* request);
  ncclResult_t (*make_vdevice)(int* d, void* props);
  ncclResult_t (*finalize)(void* ctx);
  ncclResult_t (*set_net_attr)(void* ctx, void* attr);
};

#endif /* BRAID_NET_ABI_H_ */
