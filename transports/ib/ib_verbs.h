/*
 * libibverbs, opened at run time (DESIGN.md 4: the library needs none of
 * CUDA, verbs or hwloc to load, so its NEEDED list stays NVIDIA's). Only
 * the entry points Braid calls are resolved; the data-path verbs
 * (post_send, post_recv, poll_cq, req_notify_cq) are inline in
 * <infiniband/verbs.h> and go through the device context's own table.
 * The library is found as the dynamic linker finds it
 * (LD_LIBRARY_PATH=build/tests/fakeverbs selects the tests' emulation).
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
};

/* The verbs of the process, opened at the first call; NULL when
 * libibverbs.so.1 is missing or lacks an entry point (*why says which,
 * for the caller's one log line). */
const struct ib_verbs* ib_verbs_get(const char** why);

#endif /* BRAID_IB_VERBS_H_ */
