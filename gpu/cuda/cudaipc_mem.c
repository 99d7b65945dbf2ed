/*
 * Exporting and importing device allocations (cudaipc_mem.h). The cache
 * is a short list: a rank maps the few buffers its peers use, again and
 * again; the least recently used mapping goes when it is full.
 */
#include "cudaipc_mem.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "cuda_driver.h"
#include "cuda_vmm.h"

#define CUDAIPC_CACHE_MAX 256

struct cudaipc_map {
  int peer;
  uint64_t base, buffer_id, size;
  uint32_t kind;
  CUdeviceptr local;
  uint64_t last_use;
};

struct cudaipc_cache {
  CUdevice dev;
  int n;
  uint64_t clock, maps, stale;
  struct cudaipc_map entries[CUDAIPC_CACHE_MAX];
};

ncclResult_t cudaipc_describe(const void* ptr, struct cudaipc_desc* desc, int* fd) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  CUmemGenericAllocationHandle h;
  CUdeviceptr base = 0;
  size_t size = 0;
  unsigned long long id = 0;
  *fd = -1;
  memset(desc, 0, sizeof(*desc));
  if (cu == NULL) FAIL(ncclInvalidUsage, "CUDA IPC without a CUDA driver");
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
  CHECK(cuda_check(cu->cuMemGetAddressRange(&base, &size, p), "cuMemGetAddressRange"));
  CHECK(cuda_check(cu->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p),
                   "cuPointerGetAttribute(buffer id)"));
  desc->base = base;
  desc->size = size;
  desc->buffer_id = id;
  if (cu->cuMemRetainAllocationHandle(&h, (void*)ptr) == CUDA_SUCCESS) { /* cuMem memory */
    desc->kind = CUDAIPC_VMM;
    res = cuda_check(
        cu->cuMemExportToShareableHandle(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle(POSIX fd)");
    cu->cuMemRelease(h);
    if (res != ncclSuccess) *fd = -1;
    return res;
  }
  desc->kind = CUDAIPC_LEGACY;
  CHECK(cuda_check(cu->cuIpcGetMemHandle(&desc->legacy, base), "cuIpcGetMemHandle"));
fail:
  return res;
}

void cudaipc_export_make(const void* ptr, struct cudaipc_export** out) {
  struct cudaipc_export* ex = NULL;
  *out = NULL;
  if (cuda_driver() == NULL || braid_calloc(&ex, 1, sizeof(*ex)) != ncclSuccess) return;
  if (cudaipc_describe(ptr, &ex->desc, &ex->fd) != ncclSuccess) {
    INFO(SUB_INIT, "CUDA IPC: registered buffer %p not exported; calls will describe it", ptr);
    free(ex);
    return;
  }
  *out = ex;
}

void cudaipc_export_free(struct cudaipc_export* ex) {
  if (ex == NULL) return;
  if (ex->fd >= 0) close(ex->fd);
  free(ex);
}

int cudaipc_export_covers(const struct cudaipc_export* ex, const void* ptr) {
  unsigned long long id = 0;
  uint64_t p = (uint64_t)(uintptr_t)ptr;
  if (ex == NULL || p < ex->desc.base || p - ex->desc.base >= ex->desc.size) return 0;
  return cuda_driver()->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                              (CUdeviceptr)p) == CUDA_SUCCESS &&
         id == ex->desc.buffer_id;
}

ncclResult_t cudaipc_cache_create(CUdevice dev, struct cudaipc_cache** out) {
  ncclResult_t res = ncclSuccess;
  struct cudaipc_cache* c = NULL;
  CHECK(braid_calloc(&c, 1, sizeof(*c)));
  c->dev = dev;
  *out = c;
fail:
  return res;
}

static void map_drop(const struct cuda_api* cu, struct cudaipc_map* m) {
  if (m->kind == CUDAIPC_VMM)
    cuda_vmm_free(cu, (void*)(uintptr_t)m->local);
  else
    cuda_check(cu->cuIpcCloseMemHandle(m->local), "cuIpcCloseMemHandle");
}

void cudaipc_cache_destroy(struct cudaipc_cache* c) {
  const struct cuda_api* cu = cuda_driver();
  if (c == NULL) return;
  for (int i = 0; i < c->n && cu; i++) map_drop(cu, &c->entries[i]);
  free(c);
}

static struct cudaipc_map* map_find(const struct cudaipc_cache* c, int peer,
                                    const struct cudaipc_desc* d) {
  for (int i = 0; i < c->n; i++) {
    const struct cudaipc_map* m = &c->entries[i];
    if (m->peer == peer && m->base == d->base) return (struct cudaipc_map*)m;
  }
  return NULL;
}

int cudaipc_cache_holds(const struct cudaipc_cache* c, int peer, const struct cudaipc_desc* d) {
  const struct cudaipc_map* m = map_find(c, peer, d);
  return m != NULL && m->buffer_id == d->buffer_id;
}

/* A legacy handle maps the whole allocation, whatever size the peer
 * claimed: the driver says how much that is. */
static ncclResult_t map_legacy(const struct cuda_api* cu, const struct cudaipc_desc* d,
                               CUdeviceptr* local, size_t* mapped) {
  ncclResult_t res = ncclSuccess;
  CUdeviceptr base = 0;
  CHECK(cuda_check(cu->cuIpcOpenMemHandle(local, d->legacy, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                   "cuIpcOpenMemHandle"));
  res = cuda_check(cu->cuMemGetAddressRange(&base, mapped, *local), "cuMemGetAddressRange");
  if (res == ncclSuccess && base != *local) *mapped = 0; /* not the allocation's start: none */
  if (res != ncclSuccess) cu->cuIpcCloseMemHandle(*local);
fail:
  return res;
}

/* Map one allocation of a peer here: *mapped bytes at *local. A cuMem
 * allocation is mapped for the size its description gives, which the
 * driver refuses beyond the allocation's own. */
static ncclResult_t map_import(const struct cuda_api* cu, CUdevice dev,
                               const struct cudaipc_desc* d, int fd, CUdeviceptr* local,
                               size_t* mapped) {
  ncclResult_t res = ncclSuccess;
  CUmemGenericAllocationHandle h;
  if (d->kind == CUDAIPC_LEGACY) return map_legacy(cu, d, local, mapped);
  *mapped = d->size;
  if (d->kind != CUDAIPC_VMM || fd < 0)
    FAIL(ncclInternalError, "CUDA IPC: a %s allocation without its %s",
         d->kind == CUDAIPC_VMM ? "cuMem" : "foreign", d->kind == CUDAIPC_VMM ? "fd" : "kind");
  CHECK(cuda_check(cu->cuMemImportFromShareableHandle(&h, (void*)(intptr_t)fd,
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                   "cuMemImportFromShareableHandle"));
  res = cuda_vmm_map(cu, dev, h, d->size, local);
  cu->cuMemRelease(h); /* the mapping holds the memory */
fail:
  return res;
}

/* The slot for a new mapping: a free one, else the least recently used. */
static struct cudaipc_map* map_slot(const struct cuda_api* cu, struct cudaipc_cache* c) {
  if (c->n < CUDAIPC_CACHE_MAX) return &c->entries[c->n++];
  struct cudaipc_map* lru = &c->entries[0];
  for (int i = 1; i < c->n; i++)
    if (c->entries[i].last_use < lru->last_use) lru = &c->entries[i];
  map_drop(cu, lru);
  return lru;
}

ncclResult_t cudaipc_cache_map(struct cudaipc_cache* c, int peer, const struct cudaipc_desc* d,
                               int fd, void** local, size_t* mapped) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  struct cudaipc_map* m = map_find(c, peer, d);
  CUdeviceptr at = 0;
  size_t size = 0;
  if (m && m->buffer_id != d->buffer_id) { /* freed and reallocated at the same address */
    map_drop(cu, m);
    *m = c->entries[--c->n];
    c->stale++;
    m = NULL;
  }
  if (m == NULL) {
    CHECK(map_import(cu, c->dev, d, fd, &at, &size));
    m = map_slot(cu, c);
    *m = (struct cudaipc_map){peer, d->base, d->buffer_id, size, d->kind, at, 0};
    c->maps++;
  }
  m->last_use = ++c->clock;
  *local = (void*)(uintptr_t)m->local;
  *mapped = m->size;
fail:
  return res;
}

ncclResult_t cudaipc_translate(const struct cudaipc_desc* d, void* local, size_t mapped,
                               uint64_t ptr, uint64_t bytes, int peer, char** out) {
  uint64_t off = ptr - d->base;
  if (ptr < d->base || off > mapped || bytes > mapped - off) {
    WARN(
        "CUDA IPC: rank %d named %llu bytes at 0x%llx, outside its allocation at 0x%llx (%zu "
        "bytes mapped here): refused",
        peer, (unsigned long long)bytes, (unsigned long long)ptr, (unsigned long long)d->base,
        mapped);
    return ncclInvalidUsage;
  }
  *out = (char*)local + off;
  return ncclSuccess;
}

void cudaipc_cache_stats(const struct cudaipc_cache* c, uint64_t* maps, uint64_t* stale) {
  *maps = c->maps;
  *stale = c->stale;
}
