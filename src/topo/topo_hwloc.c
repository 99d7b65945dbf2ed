/*
 * hwloc discovery with libhwloc opened at run time (BRAID_HWLOC_LIB), so
 * that libnccl.so.2 loads where hwloc is not installed; detection then
 * falls back to sysconf and sysfs (topo.c). Only hwloc's exported
 * functions are called, through the table below: the header's inline
 * helpers are written out here over them. The header fixes the structs'
 * layout, so the library must be of the header's ABI series (2.x).
 */
#include "topo/topo_hwloc.h"

#include <dlfcn.h>
#include <errno.h>
#include <hwloc.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "param.h"
#include "topo/topo_nic.h"

struct hwloc_api {
  unsigned (*get_api_version)(void);
  int (*topology_init)(hwloc_topology_t*);
  int (*topology_set_io_types_filter)(hwloc_topology_t, enum hwloc_type_filter_e);
  int (*topology_load)(hwloc_topology_t);
  void (*topology_destroy)(hwloc_topology_t);
  int (*get_type_depth)(hwloc_topology_t, hwloc_obj_type_t);
  int (*get_nbobjs_by_depth)(hwloc_topology_t, int);
  hwloc_obj_t (*get_obj_by_depth)(hwloc_topology_t, int, unsigned);
  int (*bitmap_list_snprintf)(char*, size_t, hwloc_const_bitmap_t);
  int (*bitmap_weight)(hwloc_const_bitmap_t);
  int (*bitmap_first)(hwloc_const_bitmap_t);
  int (*bitmap_iszero)(hwloc_const_bitmap_t);
  int (*bitmap_isincluded)(hwloc_const_bitmap_t, hwloc_const_bitmap_t);
};

/* Opened once per process and never closed: the table stays valid. */
static struct {
  pthread_once_t once;
  int ok;
  struct hwloc_api api;
} g_hwloc = {.once = PTHREAD_ONCE_INIT};

#define HWLOC_SYM(field, name) \
  { (void**)&g_hwloc.api.field, name }

static void hwloc_open(void) {
  const char* path = param_hwloc_lib();
  if (strcmp(path, "none") == 0) return;
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    INFO(TOPO_LOG_SUB, "Topology: cannot open %s (%s)", path, dlerror());
    return;
  }
  const struct {
    void** slot;
    const char* name;
  } syms[] = {
      HWLOC_SYM(get_api_version, "hwloc_get_api_version"),
      HWLOC_SYM(topology_init, "hwloc_topology_init"),
      HWLOC_SYM(topology_set_io_types_filter, "hwloc_topology_set_io_types_filter"),
      HWLOC_SYM(topology_load, "hwloc_topology_load"),
      HWLOC_SYM(topology_destroy, "hwloc_topology_destroy"),
      HWLOC_SYM(get_type_depth, "hwloc_get_type_depth"),
      HWLOC_SYM(get_nbobjs_by_depth, "hwloc_get_nbobjs_by_depth"),
      HWLOC_SYM(get_obj_by_depth, "hwloc_get_obj_by_depth"),
      HWLOC_SYM(bitmap_list_snprintf, "hwloc_bitmap_list_snprintf"),
      HWLOC_SYM(bitmap_weight, "hwloc_bitmap_weight"),
      HWLOC_SYM(bitmap_first, "hwloc_bitmap_first"),
      HWLOC_SYM(bitmap_iszero, "hwloc_bitmap_iszero"),
      HWLOC_SYM(bitmap_isincluded, "hwloc_bitmap_isincluded"),
  };
  for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
    *syms[i].slot = dlsym(lib, syms[i].name);
    if (*syms[i].slot == NULL) {
      INFO(TOPO_LOG_SUB, "Topology: %s lacks %s", path, syms[i].name);
      return;
    }
  }
  unsigned v = g_hwloc.api.get_api_version();
  if ((v >> 16) != (HWLOC_API_VERSION >> 16)) {
    INFO(TOPO_LOG_SUB, "Topology: %s is hwloc API 0x%x, built for 0x%x: not used", path, v,
         (unsigned)HWLOC_API_VERSION);
    return;
  }
  INFO(TOPO_LOG_SUB, "Topology: hwloc API 0x%x from %s", v, path);
  g_hwloc.ok = 1;
}

/* ---- the header's inline helpers, over the table ---- */

static int hw_count(hwloc_topology_t t, hwloc_obj_type_t type) {
  int depth = g_hwloc.api.get_type_depth(t, type);
  if (depth == HWLOC_TYPE_DEPTH_UNKNOWN || depth == HWLOC_TYPE_DEPTH_MULTIPLE) return 0;
  int n = g_hwloc.api.get_nbobjs_by_depth(t, depth);
  return n > 0 ? n : 0;
}

static hwloc_obj_t hw_obj(hwloc_topology_t t, hwloc_obj_type_t type, int i) {
  return g_hwloc.api.get_obj_by_depth(t, g_hwloc.api.get_type_depth(t, type), (unsigned)i);
}

/* Objects of `type` whose (non-empty) cpuset lies inside `set`. */
static int hw_count_in(hwloc_topology_t t, hwloc_const_cpuset_t set, hwloc_obj_type_t type) {
  int n = 0, all = hw_count(t, type);
  for (int i = 0; i < all; i++) {
    hwloc_obj_t o = hw_obj(t, type, i);
    if (o->cpuset != NULL && !g_hwloc.api.bitmap_iszero(o->cpuset) &&
        g_hwloc.api.bitmap_isincluded(o->cpuset, set))
      n++;
  }
  return n;
}

static int hw_is_io(hwloc_obj_type_t type) {
  return type == HWLOC_OBJ_BRIDGE || type == HWLOC_OBJ_PCI_DEVICE || type == HWLOC_OBJ_OS_DEVICE;
}

/* ---- what topology detection reads ---- */

static uint64_t hw_cache_max(hwloc_topology_t t, hwloc_obj_type_t type) {
  uint64_t best = 0;
  int n = hw_count(t, type);
  for (int i = 0; i < n; i++) {
    hwloc_obj_t c = hw_obj(t, type, i);
    if (c->attr->cache.type != HWLOC_OBJ_CACHE_INSTRUCTION) best = MAX(best, c->attr->cache.size);
  }
  return best;
}

static void hw_numa_fill(hwloc_topology_t t, struct topo_system* sys) {
  int n = hw_count(t, HWLOC_OBJ_NUMANODE);
  if (n > TOPO_MAX_NUMA)
    INFO(TOPO_LOG_SUB, "Topology: %d NUMA nodes, keeping the first %d", n, TOPO_MAX_NUMA);
  for (int i = 0; i < n && sys->nnuma < TOPO_MAX_NUMA; i++) {
    hwloc_obj_t node = hw_obj(t, HWLOC_OBJ_NUMANODE, i);
    struct topo_numa* nm = &sys->numa[sys->nnuma++];
    nm->os_index = (int)node->os_index;
    nm->ncores = hw_count_in(t, node->cpuset, HWLOC_OBJ_CORE);
    nm->npus = hw_count_in(t, node->cpuset, HWLOC_OBJ_PU);
    nm->mem_bytes = node->attr->numanode.local_memory;
    if (g_hwloc.api.bitmap_list_snprintf(nm->cpuset, sizeof(nm->cpuset), node->cpuset) < 0)
      nm->cpuset[0] = '\0';
  }
}

/* The node nearest an I/O object: the one its first non-I/O ancestor (the
 * first with a cpuset) lies in. One spanning several nodes names none. */
static int hw_numa_of(hwloc_obj_t obj) {
  while (obj != NULL && obj->cpuset == NULL) obj = obj->parent;
  if (obj == NULL || obj->nodeset == NULL || g_hwloc.api.bitmap_weight(obj->nodeset) != 1)
    return -1;
  return g_hwloc.api.bitmap_first(obj->nodeset);
}

static void hw_pci_str(hwloc_obj_t pci, char* out, size_t cap) {
  snprintf(out, cap, "%04x:%02x:%02x.%x", pci->attr->pcidev.domain, pci->attr->pcidev.bus,
           pci->attr->pcidev.dev, pci->attr->pcidev.func);
}

/* The PCI device an OS device hangs off, NULL for one without (virtual). */
static hwloc_obj_t hw_pci_parent(hwloc_obj_t obj) {
  for (obj = obj->parent; obj != NULL && hw_is_io(obj->type); obj = obj->parent)
    if (obj->type == HWLOC_OBJ_PCI_DEVICE) return obj;
  return NULL;
}

static void hw_nics_fill(hwloc_topology_t t, struct topo_system* sys) {
  int n = hw_count(t, HWLOC_OBJ_OS_DEVICE);
  for (int i = 0; i < n; i++) {
    hwloc_obj_t o = hw_obj(t, HWLOC_OBJ_OS_DEVICE, i);
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK || o->name == NULL) continue;
    struct topo_nic* nic = topo_nic_add(sys, o->name);
    if (nic == NULL) return;
    hwloc_obj_t pci = hw_pci_parent(o);
    if (pci != NULL) hw_pci_str(pci, nic->pci, sizeof(nic->pci));
    nic->numa = hw_numa_of(o);
  }
}

/* An NVIDIA display or 3D controller, or any PCI device carrying a CUDA OS
 * device (hwloc's cuda plugin, where built). */
static int hw_is_gpu(hwloc_obj_t pci) {
  const struct hwloc_pcidev_attr_s* a = &pci->attr->pcidev;
  if (a->vendor_id == 0x10de && (a->class_id == 0x0300 || a->class_id == 0x0302)) return 1;
  for (hwloc_obj_t c = pci->io_first_child; c != NULL; c = c->next_sibling)
    if (c->type == HWLOC_OBJ_OS_DEVICE && c->subtype && strcmp(c->subtype, "CUDA") == 0) return 1;
  return 0;
}

/* In PCI bus order, which is CUDA's order under CUDA_DEVICE_ORDER=PCI_BUS_ID. */
static void hw_gpus_fill(hwloc_topology_t t, struct topo_system* sys) {
  int n = hw_count(t, HWLOC_OBJ_PCI_DEVICE);
  for (int i = 0; i < n; i++) {
    hwloc_obj_t p = hw_obj(t, HWLOC_OBJ_PCI_DEVICE, i);
    if (!hw_is_gpu(p)) continue;
    if (sys->ngpus >= TOPO_MAX_GPUS) {
      INFO(TOPO_LOG_SUB, "Topology: more than %d GPUs, leaving the rest out", TOPO_MAX_GPUS);
      return;
    }
    struct topo_gpu* gpu = &sys->gpus[sys->ngpus++];
    hw_pci_str(p, gpu->pci, sizeof(gpu->pci));
    gpu->numa = hw_numa_of(p);
  }
}

ncclResult_t topo_hwloc_fill(struct topo_system* sys) {
  ncclResult_t res = ncclSuccess;
  hwloc_topology_t t;
  pthread_once(&g_hwloc.once, hwloc_open);
  if (!g_hwloc.ok) return ncclSystemError;
  if (g_hwloc.api.topology_init(&t) != 0)
    FAIL(ncclSystemError, "Topology: hwloc_topology_init failed: %s", strerror(errno));
  if (g_hwloc.api.topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0 ||
      g_hwloc.api.topology_load(t) != 0) {
    int err = errno;
    g_hwloc.api.topology_destroy(t);
    FAIL(ncclSystemError, "Topology: hwloc discovery failed: %s", strerror(err));
  }
  sys->ncores = hw_count(t, HWLOC_OBJ_CORE);
  sys->npus = hw_count(t, HWLOC_OBJ_PU);
  sys->l1d_bytes = hw_cache_max(t, HWLOC_OBJ_L1CACHE);
  sys->l2_bytes = hw_cache_max(t, HWLOC_OBJ_L2CACHE);
  sys->l3_bytes = hw_cache_max(t, HWLOC_OBJ_L3CACHE);
  hw_numa_fill(t, sys);
  hw_nics_fill(t, sys);
  hw_gpus_fill(t, sys);
  g_hwloc.api.topology_destroy(t);
fail:
  return res;
}
