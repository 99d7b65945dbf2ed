/*
 * libibverbs, opened at run time (docs/architecture.md 5: the library needs none of
 * CUDA, verbs or hwloc to load, so its NEEDED list stays NVIDIA's). Only
 * the entry points Braid calls are resolved; the data-path verbs
 * (post_send, post_recv, poll_cq, req_notify_cq) are inline in
 * <infiniband/verbs.h> and go through the device context's own table.
 * The library is BRAID_IBVERBS_LIB (libibverbs.so.1, found as the dynamic
 * linker finds it; the tests name their emulation,
 * build/tests/fakeverbs/libibverbs.so.1, or put it on LD_LIBRARY_PATH).
 */
#ifndef BRAID_IB_VERBS_H_
#define BRAID_IB_VERBS_H_

#include <infiniband/verbs.h>

struct ib_verbs {
  struct ibv_device** (*get_device_list)(int* n);
  void (*free_device_list)(struct ibv_device** list);
  const char* (*get_device_name)(struct ibv_device* dev);
  struct ibv_context* (*open_device)(struct ibv_device* dev);
  int (*close_device)(struct ibv_context* ctx);
  int (*query_device)(struct ibv_context* ctx, struct ibv_device_attr* attr);
  int (*query_port)(struct ibv_context* ctx, uint8_t port, struct ibv_port_attr* attr);
  int (*query_gid)(struct ibv_context* ctx, uint8_t port, int index, union ibv_gid* gid);
  /* what a connection sets up: protection domain, memory regions,
   * completion queue and channel, queue pairs, async events */
  struct ibv_pd* (*alloc_pd)(struct ibv_context* ctx);
  int (*dealloc_pd)(struct ibv_pd* pd);
  struct ibv_mr* (*reg_mr)(struct ibv_pd* pd, void* addr, size_t length, int access);
  int (*dereg_mr)(struct ibv_mr* mr);
  struct ibv_comp_channel* (*create_comp_channel)(struct ibv_context* ctx);
  int (*destroy_comp_channel)(struct ibv_comp_channel* ch);
  struct ibv_cq* (*create_cq)(struct ibv_context* ctx, int cqe, void* cq_context,
                              struct ibv_comp_channel* ch, int comp_vector);
  int (*destroy_cq)(struct ibv_cq* cq);
  int (*get_cq_event)(struct ibv_comp_channel* ch, struct ibv_cq** cq, void** cq_context);
  void (*ack_cq_events)(struct ibv_cq* cq, unsigned int nevents);
  struct ibv_qp* (*create_qp)(struct ibv_pd* pd, struct ibv_qp_init_attr* attr);
  int (*modify_qp)(struct ibv_qp* qp, struct ibv_qp_attr* attr, int mask);
  int (*destroy_qp)(struct ibv_qp* qp);
  int (*get_async_event)(struct ibv_context* ctx, struct ibv_async_event* event);
  void (*ack_async_event)(struct ibv_async_event* event);
  const char* (*wc_status_str)(enum ibv_wc_status status);
};

/* The verbs of the process, opened at the first call; NULL when
 * libibverbs.so.1 is missing or lacks an entry point (*why says which,
 * for the caller's one log line). */
const struct ib_verbs* ib_verbs_get(const char** why);

#endif /* BRAID_IB_VERBS_H_ */
