/*
 * Loading an NCCL net plugin and speaking its version (net_plugin.h).
 *
 * The plugin is the process's, as in NCCL: one library, loaded at the
 * first need and never unloaded (its threads and memory may outlive any
 * comm), under a lock. Versions 8 to 10 are initialised once, here;
 * version 11 and up once per comm (net_plugin_open). Each call below
 * switches on the version only where the tables differ.
 */
#include "net_plugin.h"

#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "net_abi.h"
#include "param.h"

#define NET_V8_MAX_BYTES (1u << 30) /* v8 sizes are int: NCCL caps them at 1 GiB too */

struct net_plugin {
  int version;
  const char* name;
  union {
    const void* any;
    const struct net_abi_v8* v8;
    const struct net_abi_v9* v9;
    const struct net_abi_v10* v10;
    const struct net_abi_v11* v11; /* and v12 */
  } t;
  char path[256];
};

/* The process's plugin: loaded once, under the lock (the one state the
 * library keeps outside a comm, as NCCL does: a plugin is per process). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct net_plugin g_plugin;
static int g_loaded;             /* 1: g_plugin is ready */
static ncclResult_t g_load_fail; /* the first load's failure, given again */

/* The plugin's log lines, through Braid's logger. */
static void net_log(int level, unsigned long flags, const char* file, int line, const char* fmt,
                    ...) {
  char text[512];
  va_list ap;
  (void)flags;
  if (level > DEBUG_WARN && !debug_enabled(DEBUG_INFO, SUB_NET)) return;
  va_start(ap, fmt);
  vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  if (level == DEBUG_WARN)
    debug_log(DEBUG_WARN, SUB_ALL, file ? file : "plugin", line, "NET/Plugin : %s", text);
  else
    debug_log(DEBUG_INFO, SUB_NET, file ? file : "plugin", line, "NET/Plugin : %s", text);
}

/* dlopen as NCCL does: the name as given, else libnccl-net-<name>.so for
 * a bare name. */
static void* open_named(const char* name, char* path, size_t size) {
  void* h;
  snprintf(path, size, "%s", name);
  if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)) != NULL) return h;
  if (strchr(name, '/') != NULL || strncmp(name, "lib", 3) == 0) return NULL;
  snprintf(path, size, "libnccl-net-%s.so", name);
  return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

/* The first library of NCCL_NET_PLUGIN's list that opens. */
static void* open_library(char* path, size_t size) {
  const char* list = param_net_plugin();
  char names[1024];
  if (list == NULL) return dlopen(strcpy(path, "libnccl-net.so"), RTLD_NOW | RTLD_LOCAL);
  snprintf(names, sizeof(names), "%s", list);
  for (char *save = NULL, *n = strtok_r(names, ",", &save); n; n = strtok_r(NULL, ",", &save)) {
    if (strcmp(n, "none") == 0) break;
    void* h = open_named(n, path, size);
    if (h) return h;
    INFO(SUB_NET | SUB_INIT, "NET/Plugin : cannot open %s: %s", path, dlerror());
  }
  return NULL;
}

/* The highest version the library exports, with its table. */
static int find_table(void* lib, const void** table) {
  static const char* const names[] = {"ncclNetPlugin_v12", "ncclNetPlugin_v11", "ncclNetPlugin_v10",
                                      "ncclNetPlugin_v9", "ncclNetPlugin_v8"};
  for (int i = 0; i < 5; i++)
    if ((*table = dlsym(lib, names[i])) != NULL) return 12 - i;
  return 0;
}

/* A table must have what a host calls: checked once, not at every call. */
static int table_complete(const struct net_plugin* p) {
#define HAS(tbl)                                                                             \
  ((tbl)->name && (tbl)->init && (tbl)->devices && (tbl)->get_properties && (tbl)->listen && \
   (tbl)->connect && (tbl)->accept && (tbl)->reg_mr && (tbl)->dereg_mr && (tbl)->isend &&    \
   (tbl)->irecv && (tbl)->test && (tbl)->close_send && (tbl)->close_recv && (tbl)->close_listen)
  switch (p->version) {
    case 8:
      return HAS(p->t.v8);
    case 9:
      return HAS(p->t.v9);
    case 10:
      return HAS(p->t.v10);
    default:
      return HAS(p->t.v11) && p->t.v11->finalize;
  }
#undef HAS
}

/* v8 to v10: the process's one init. */
static ncclResult_t init_once(struct net_plugin* p) {
  switch (p->version) {
    case 8:
      return p->t.v8->init(net_log);
    case 9:
      return p->t.v9->init(net_log);
    case 10:
      return p->t.v10->init(net_log, NULL);
    default:
      return ncclSuccess; /* per comm */
  }
}

static ncclResult_t load(struct net_plugin* p) {
  void* lib = open_library(p->path, sizeof(p->path));
  if (lib == NULL) {
    WARN("NET/Plugin : no net plugin could be loaded (NCCL_NET_PLUGIN=%s)",
         param_net_plugin() ? param_net_plugin() : "unset: libnccl-net.so");
    return ncclInvalidUsage;
  }
  p->version = find_table(lib, &p->t.any);
  if (p->version == 0) {
    WARN("NET/Plugin : %s exports no ncclNetPlugin_v8 to _v12", p->path);
    return ncclInvalidUsage;
  }
  if (!table_complete(p)) {
    WARN("NET/Plugin : %s's v%d table lacks a function a host needs", p->path, p->version);
    return ncclInvalidUsage;
  }
  p->name = p->t.v8->name; /* the first member in every version */
  ncclResult_t res = init_once(p);
  if (res != ncclSuccess) {
    WARN("NET/Plugin : %s (v%d) failed to initialise: %s", p->path, p->version,
         braid_result_name(res));
    return ncclSystemError;
  }
  INFO(SUB_INIT | SUB_NET, "NET/Plugin : loaded %s, \"%s\", interface v%d", p->path, p->name,
       p->version);
  return ncclSuccess;
}

ncclResult_t net_plugin_get(struct net_plugin** out) {
  ncclResult_t res;
  pthread_mutex_lock(&g_lock);
  if (!g_loaded && g_load_fail == ncclSuccess) {
    res = load(&g_plugin);
    if (res == ncclSuccess)
      g_loaded = 1;
    else
      g_load_fail = res;
  }
  res = g_loaded ? ncclSuccess : g_load_fail;
  pthread_mutex_unlock(&g_lock);
  *out = g_loaded ? &g_plugin : NULL;
  return res;
}

const char* net_plugin_name(const struct net_plugin* p) {
  return p->name;
}

ncclResult_t net_plugin_open(struct net_plugin* p, uint64_t comm_id, void** ctx) {
  struct net_abi_config config = {-1}; /* no traffic class */
  *ctx = NULL;
  if (p->version < 11) return ncclSuccess;
  ncclResult_t res = p->t.v11->init(ctx, comm_id, &config, net_log, NULL);
  if (res != ncclSuccess)
    WARN("NET/Plugin : %s's init failed: %s", p->name, braid_result_name(res));
  return res;
}

void net_plugin_close(struct net_plugin* p, void* ctx) {
  if (p->version >= 11) p->t.v11->finalize(ctx);
}

/* A plugin call's failure, said once where it happened. */
static ncclResult_t said(const struct net_plugin* p, const char* call, ncclResult_t res) {
  if (res != ncclSuccess)
    WARN("NET/Plugin : %s's %s failed: %s", p->name, call, braid_result_name(res));
  return res;
}

ncclResult_t net_plugin_devices(struct net_plugin* p, int* ndev) {
  *ndev = 0;
  ncclResult_t res = said(p, "devices", p->t.v8->devices(ndev)); /* one member in every version */
  if (res == ncclSuccess && (*ndev < 0 || *ndev > 1024)) {
    WARN("NET/Plugin : %s reports %d devices", p->name, *ndev);
    return ncclSystemError;
  }
  return res;
}

/* ---- properties ---- */

static void props_common(struct net_props* out, const char* name, int ptrs, int speed,
                         float latency, int max_recvs) {
  snprintf(out->name, sizeof(out->name), "%s", name ? name : "?");
  out->host_ptrs = (ptrs & NET_ABI_PTR_HOST) != 0;
  out->device_ptrs = (ptrs & NET_ABI_PTR_CUDA) != 0;
  out->speed_mbps = speed;
  out->latency_us = latency;
  out->max_recvs = max_recvs < 1 ? 1 : max_recvs; /* Braid posts one at a time */
}

/* Reads the version's structure into out; the device type apart. */
static ncclResult_t props_read(struct net_plugin* p, int dev, struct net_props* out, int* type) {
  ncclResult_t res;
  size_t max;
  if (p->version == 8) {
    struct net_abi_props_v8 v;
    memset(&v, 0, sizeof(v));
    if ((res = p->t.v8->get_properties(dev, &v)) != ncclSuccess) return res;
    props_common(out, v.name, v.ptr_support, v.speed_mbps, v.latency_us, v.max_recvs);
    *type = v.device_type;
    max = NET_V8_MAX_BYTES;
  } else if (p->version < 12) {
    struct net_abi_props_v11 v; /* v9 and v10 fill its first part */
    memset(&v, 0, sizeof(v));
    res = p->version == 9    ? p->t.v9->get_properties(dev, &v.v9)
          : p->version == 10 ? p->t.v10->get_properties(dev, &v.v9)
                             : p->t.v11->get_properties(dev, &v);
    if (res != ncclSuccess) return res;
    props_common(out, v.v9.name, v.v9.ptr_support, v.v9.speed_mbps, v.v9.latency_us,
                 v.v9.max_recvs);
    *type = v.v9.device_type;
    max = v.v9.max_p2p_bytes;
  } else {
    struct net_abi_props_v12 v;
    memset(&v, 0, sizeof(v));
    if ((res = p->t.v11->get_properties(dev, &v)) != ncclSuccess) return res;
    props_common(out, v.name, v.ptr_support, v.speed_mbps, v.latency_us, v.max_recvs);
    *type = v.device_type;
    max = v.max_p2p_bytes;
  }
  /* every size crosses the test call as an int */
  out->max_bytes = max == 0 ? INT_MAX : MIN(max, (size_t)INT_MAX);
  return ncclSuccess;
}

ncclResult_t net_plugin_props(struct net_plugin* p, int dev, struct net_props* out) {
  int type = -1;
  ncclResult_t res = props_read(p, dev, out, &type);
  if (res != ncclSuccess) {
    WARN("NET/Plugin : %s's getProperties(%d) failed: %s", p->name, dev, braid_result_name(res));
    return res;
  }
  if (type != NET_ABI_DEVICE_HOST || !out->host_ptrs) {
    WARN(
        "NET/Plugin : %s's device %d (%s) is not driven by the host (type %d) or takes no host "
        "memory",
        p->name, dev, out->name, type);
    return ncclSystemError;
  }
  if (!isfinite(out->latency_us) || out->latency_us < 0) out->latency_us = 0;
  if (out->speed_mbps < 0) out->speed_mbps = 0; /* unknown: the tuner uses the NIC's */
  return ncclSuccess;
}

/* ---- connections ---- */

ncclResult_t net_plugin_listen(struct net_plugin* p, void* ctx, int dev,
                               uint8_t handle[NET_PLUGIN_HANDLE_BYTES], void** listen) {
  *listen = NULL;
  memset(handle, 0, NET_PLUGIN_HANDLE_BYTES);
  ncclResult_t res = said(p, "listen",
                          p->version >= 11 ? p->t.v11->listen(ctx, dev, handle, listen)
                                           : p->t.v8->listen(dev, handle, listen));
  if (res == ncclSuccess && *listen == NULL) {
    WARN("NET/Plugin : %s's listen succeeded with no listener", p->name);
    return ncclSystemError;
  }
  return res;
}

ncclResult_t net_plugin_connect(struct net_plugin* p, void* ctx, int dev,
                                uint8_t h[NET_PLUGIN_HANDLE_BYTES], void** send) {
  struct net_abi_config config = {-1};
  net_abi_dh* dh = NULL;
  ncclResult_t res;
  *send = NULL;
  switch (p->version) {
    case 8:
      res = p->t.v8->connect(dev, h, send, &dh);
      break;
    case 9:
      res = p->t.v9->connect(dev, h, send, &dh);
      break;
    case 10:
      res = p->t.v10->connect(dev, &config, h, send, &dh);
      break;
    default:
      res = p->t.v11->connect(ctx, dev, h, send, &dh);
  }
  return said(p, "connect", res);
}

ncclResult_t net_plugin_accept(struct net_plugin* p, void* listen, void** recv) {
  net_abi_dh* dh = NULL;
  *recv = NULL;
  return said(p, "accept", p->t.v8->accept(listen, recv, &dh));
}

void net_plugin_close_send(struct net_plugin* p, void* send) {
  if (send) p->t.v8->close_send(send);
}
void net_plugin_close_recv(struct net_plugin* p, void* recv) {
  if (recv) p->t.v8->close_recv(recv);
}
void net_plugin_close_listen(struct net_plugin* p, void* listen) {
  if (listen) p->t.v8->close_listen(listen);
}

/* ---- messages ---- */

ncclResult_t net_plugin_reg(struct net_plugin* p, void* comm, void* data, size_t size, int device,
                            void** mhandle) {
  *mhandle = NULL;
  ncclResult_t res =
      p->t.v8->reg_mr(comm, data, size, device ? NET_ABI_PTR_CUDA : NET_ABI_PTR_HOST, mhandle);
  if (res != ncclSuccess)
    WARN("NET/Plugin : %s could not register %zu bytes at %p: %s", p->name, size, data,
         braid_result_name(res));
  return res;
}

void net_plugin_dereg(struct net_plugin* p, void* comm, void* mhandle) {
  if (mhandle) p->t.v8->dereg_mr(comm, mhandle);
}

ncclResult_t net_plugin_isend(struct net_plugin* p, void* send, void* data, size_t size, int tag,
                              void* mhandle, void** request) {
  ncclResult_t res;
  *request = NULL; /* never the optional-completion marker */
  switch (p->version) {
    case 8:
      res = p->t.v8->isend(send, data, (int)size, tag, mhandle, request);
      break;
    case 9:
      res = p->t.v9->isend(send, data, size, tag, mhandle, request);
      break;
    case 10:
      res = p->t.v10->isend(send, data, size, tag, mhandle, NULL, request);
      break;
    default:
      res = p->t.v11->isend(send, data, size, tag, mhandle, NULL, request);
  }
  return said(p, "isend", res);
}

ncclResult_t net_plugin_irecv(struct net_plugin* p, void* recv, void* data, size_t size, int tag,
                              void* mhandle, void** request) {
  int isize = (int)size;
  void* phandle = NULL;
  ncclResult_t res;
  *request = NULL;
  switch (p->version) {
    case 8:
      res = p->t.v8->irecv(recv, 1, &data, &isize, &tag, &mhandle, request);
      break;
    case 9:
      res = p->t.v9->irecv(recv, 1, &data, &size, &tag, &mhandle, request);
      break;
    case 10:
      res = p->t.v10->irecv(recv, 1, &data, &size, &tag, &mhandle, &phandle, request);
      break;
    default:
      res = p->t.v11->irecv(recv, 1, &data, &size, &tag, &mhandle, &phandle, request);
  }
  return said(p, "irecv", res);
}

ncclResult_t net_plugin_iflush(struct net_plugin* p, void* recv, void* data, size_t size,
                               void* mhandle, void** request) {
  int isize = (int)MIN(size, (size_t)INT_MAX);
  *request = NULL;
  if (p->t.v8->iflush == NULL) return ncclSuccess; /* the same member in every version */
  return said(p, "iflush", p->t.v8->iflush(recv, 1, &data, &isize, &mhandle, request));
}

ncclResult_t net_plugin_test(struct net_plugin* p, void* request, size_t size, int* done,
                             size_t* got) {
  int sizes[1] = {-1}, d = 0;
  ncclResult_t res = said(p, "test", p->t.v8->test(request, &d, sizes));
  *done = d != 0;
  if (res != ncclSuccess || !*done || got == NULL) return res;
  if (sizes[0] < 0 || (size_t)sizes[0] > size) {
    WARN("NET/Plugin : %s completed %d bytes of a %zu-byte message", p->name, sizes[0], size);
    return ncclSystemError;
  }
  *got = (size_t)sizes[0];
  return ncclSuccess;
}
