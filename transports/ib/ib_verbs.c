/*
 * Opening libibverbs (ib_verbs.h): once per process, never closed (its
 * providers keep state for the process's lifetime, as NCCL's does).
 */
#include "ib_verbs.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "param.h"

static struct {
  pthread_once_t once;
  struct ib_verbs verbs;
  int ok;
  char why[256];
} g_ib = {.once = PTHREAD_ONCE_INIT};

static const struct {
  const char* name;
  size_t offset;
} k_entries[] = {
    {"ibv_get_device_list", offsetof(struct ib_verbs, get_device_list)},
    {"ibv_free_device_list", offsetof(struct ib_verbs, free_device_list)},
    {"ibv_get_device_name", offsetof(struct ib_verbs, get_device_name)},
    {"ibv_open_device", offsetof(struct ib_verbs, open_device)},
    {"ibv_close_device", offsetof(struct ib_verbs, close_device)},
    {"ibv_query_device", offsetof(struct ib_verbs, query_device)},
    {"ibv_query_port", offsetof(struct ib_verbs, query_port)},
    {"ibv_query_gid", offsetof(struct ib_verbs, query_gid)},
    {"ibv_alloc_pd", offsetof(struct ib_verbs, alloc_pd)},
    {"ibv_dealloc_pd", offsetof(struct ib_verbs, dealloc_pd)},
    {"ibv_reg_mr", offsetof(struct ib_verbs, reg_mr)},
    {"ibv_dereg_mr", offsetof(struct ib_verbs, dereg_mr)},
    {"ibv_create_comp_channel", offsetof(struct ib_verbs, create_comp_channel)},
    {"ibv_destroy_comp_channel", offsetof(struct ib_verbs, destroy_comp_channel)},
    {"ibv_create_cq", offsetof(struct ib_verbs, create_cq)},
    {"ibv_destroy_cq", offsetof(struct ib_verbs, destroy_cq)},
    {"ibv_get_cq_event", offsetof(struct ib_verbs, get_cq_event)},
    {"ibv_ack_cq_events", offsetof(struct ib_verbs, ack_cq_events)},
    {"ibv_create_qp", offsetof(struct ib_verbs, create_qp)},
    {"ibv_modify_qp", offsetof(struct ib_verbs, modify_qp)},
    {"ibv_destroy_qp", offsetof(struct ib_verbs, destroy_qp)},
    {"ibv_get_async_event", offsetof(struct ib_verbs, get_async_event)},
    {"ibv_ack_async_event", offsetof(struct ib_verbs, ack_async_event)},
    {"ibv_wc_status_str", offsetof(struct ib_verbs, wc_status_str)},
};

static void ib_verbs_open(void) {
  const char* name = param_ibverbs_lib();
  void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf(g_ib.why, sizeof(g_ib.why), "%s not found (%s)", name, dlerror());
    return;
  }
  for (size_t i = 0; i < sizeof(k_entries) / sizeof(k_entries[0]); i++) {
    void* fn = dlsym(lib, k_entries[i].name);
    if (fn == NULL) {
      snprintf(g_ib.why, sizeof(g_ib.why), "%s lacks %s", name, k_entries[i].name);
      return; /* left open: a half-resolved library is not used, and not unloaded under us */
    }
    *(void**)((char*)&g_ib.verbs + k_entries[i].offset) = fn;
  }
  g_ib.ok = 1;
}

const struct ib_verbs* ib_verbs_get(const char** why) {
  pthread_once(&g_ib.once, ib_verbs_open);
  *why = g_ib.ok ? NULL : g_ib.why;
  return g_ib.ok ? &g_ib.verbs : NULL;
}
