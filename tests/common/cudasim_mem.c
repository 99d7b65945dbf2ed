/*
 * The simulated driver's memory (cudasim.h): device memory the host cannot
 * touch (cuMemAlloc, and cuMem's physical allocations mapped at reserved
 * ranges), where the simulated GPU reaches it, pointer attributes, and
 * pinned host memory.
 */
#include <cuda.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudasim.h"

#define SIM_MAX_ALLOCS 4096

/* A cuMem physical allocation: a memfd, alive while a handle or a mapping
 * holds it (cuMemRelease drops a handle, cuMemUnmap a mapping). */
struct sim_vmm {
  int fd;
  size_t size;
  int refs;
  int exportable; /* created with POSIX-fd handles requested */
};

static struct {
  pthread_mutex_t lock;
  int nallocs;
  struct sim_alloc {
    uintptr_t base;   /* the device address: mapped, but no host access */
    uintptr_t shadow; /* the same pages, read and written by the "GPU" */
    size_t size;
    struct sim_vmm* vmm; /* cuMemMap'ed: its physical allocation; NULL: cuMemAlloc'ed */
    int fd;              /* cuMemAlloc'ed or IPC-opened: its memfd (legacy IPC exports it) */
    int imported;        /* opened from a legacy IPC handle: cuIpcCloseMemHandle frees it */
    uint64_t buffer_id;  /* CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused in a process */
  } allocs[SIM_MAX_ALLOCS];
  uint64_t next_buffer_id;
} g_mem = {.lock = PTHREAD_MUTEX_INITIALIZER, .next_buffer_id = 1};

#define SIM_MAX_PINNED 1024

struct sim_range {
  uintptr_t base;
  size_t size;
};

/* Pinned host ranges (cuMemHostAlloc, cuMemHostRegister), under g_mem.lock. */
static struct {
  int n;
  struct sim_range r[SIM_MAX_PINNED];
} g_pinned;

/* The allocation holding p, or -1. */
static int alloc_of(uintptr_t p) {
  for (int i = 0; i < g_mem.nallocs; i++)
    if (p >= g_mem.allocs[i].base && p - g_mem.allocs[i].base < g_mem.allocs[i].size) return i;
  return -1;
}

/* Record a mapped allocation with a fresh buffer id (0: the table is full). */
static int alloc_add(uintptr_t base, uintptr_t shadow, size_t size, struct sim_vmm* vmm, int fd,
                     int imported) {
  pthread_mutex_lock(&g_mem.lock);
  int ok = g_mem.nallocs < SIM_MAX_ALLOCS;
  if (ok) {
    g_mem.allocs[g_mem.nallocs++] =
        (struct sim_alloc){base, shadow, size, vmm, fd, imported, g_mem.next_buffer_id++};
    if (vmm) vmm->refs++;
  }
  pthread_mutex_unlock(&g_mem.lock);
  return ok;
}

/* Device memory is a memfd mapped twice: at the device address with no
 * access, so a host thread that touches it faults as it would on a GPU
 * (every access must go through copies, launches or memory operations),
 * and at a shadow address where the simulated GPU works. Both mappings
 * are shared, so forked ranks keep them. */
static CUresult map_device(int fd, size_t bytes, int imported, CUdeviceptr* p) {
  void* dev = mmap(NULL, bytes, PROT_NONE, MAP_SHARED, fd, 0);
  void* shadow = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int ok = dev != MAP_FAILED && shadow != MAP_FAILED &&
           alloc_add((uintptr_t)dev, (uintptr_t)shadow, bytes, NULL, fd, imported);
  if (!ok) {
    if (dev != MAP_FAILED) munmap(dev, bytes);
    if (shadow != MAP_FAILED) munmap(shadow, bytes);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *p = (CUdeviceptr)(uintptr_t)dev;
  return CUDA_SUCCESS;
}

CUresult sim_mem_alloc(CUdeviceptr* p, size_t bytes) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT; /* as the real driver */
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  int fd = memfd_create("cudasim", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult r =
      ftruncate(fd, (off_t)bytes) == 0 ? map_device(fd, bytes, 0, p) : CUDA_ERROR_OUT_OF_MEMORY;
  if (r != CUDA_SUCCESS) {
    close(fd);
    return r;
  }
  memset(gpu_addr(*p), 0xa5, bytes); /* as cudaMalloc'ed memory, not zeroed */
  return CUDA_SUCCESS;
}

/* Unmap and forget the allocation at exactly p, if it is of the kind asked. */
static CUresult alloc_remove(CUdeviceptr p, int imported) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  int exact = i >= 0 && g_mem.allocs[i].base == (uintptr_t)p && g_mem.allocs[i].vmm == NULL &&
              g_mem.allocs[i].imported == imported;
  struct sim_alloc a = exact ? g_mem.allocs[i] : (struct sim_alloc){0};
  if (exact) g_mem.allocs[i] = g_mem.allocs[--g_mem.nallocs];
  pthread_mutex_unlock(&g_mem.lock);
  if (!exact) return CUDA_ERROR_INVALID_VALUE;
  munmap((void*)a.base, a.size);
  munmap((void*)a.shadow, a.size);
  close(a.fd);
  return CUDA_SUCCESS;
}

CUresult sim_mem_free(CUdeviceptr p) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  return alloc_remove(p, 0);
}

/* ---- Legacy IPC: a handle names the exporter's memfd ---- */

#define SIM_IPC_MAGIC 0x43495043u

struct sim_ipc_handle {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t pad;
  uint64_t size;
};

CUresult sim_ipc_get(CUipcMemHandle* h, CUdeviceptr p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  int ok = i >= 0 && g_mem.allocs[i].vmm == NULL && !g_mem.allocs[i].imported;
  struct sim_ipc_handle s = {SIM_IPC_MAGIC, (int32_t)getpid(), ok ? g_mem.allocs[i].fd : -1, 0,
                             ok ? g_mem.allocs[i].size : 0};
  pthread_mutex_unlock(&g_mem.lock);
  if (!ok) return CUDA_ERROR_INVALID_VALUE; /* cuMem memory has no legacy handle */
  memset(h, 0, sizeof(*h));
  memcpy(h->reserved, &s, sizeof(s));
  return CUDA_SUCCESS;
}

/* The exporter's memfd through /proc, mapped anew: another process only,
 * as the driver wants. */
CUresult sim_ipc_open(CUdeviceptr* p, CUipcMemHandle h, unsigned flags) {
  struct sim_ipc_handle s;
  char path[64];
  (void)flags;
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  memcpy(&s, h.reserved, sizeof(s));
  if (s.magic != SIM_IPC_MAGIC) return CUDA_ERROR_INVALID_VALUE;
  if (s.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* a handle of this process */
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)s.pid, (int)s.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_INVALID_HANDLE; /* the exporter is gone or freed it */
  CUresult r = map_device(fd, s.size, 1, p);
  if (r != CUDA_SUCCESS) close(fd);
  return r;
}

CUresult sim_ipc_close(CUdeviceptr p) {
  return alloc_remove(p, 1);
}

/* ---- cuMem: physical allocations mapped at reserved ranges ---- */

#define SIM_VMM_GRANULARITY ((size_t)2 << 20) /* the H200's, minimum and recommended */

static void vmm_unref(struct sim_vmm* v) {
  pthread_mutex_lock(&g_mem.lock);
  int last = --v->refs == 0;
  pthread_mutex_unlock(&g_mem.lock);
  if (last) {
    close(v->fd);
    free(v);
  }
}

CUresult sim_vmm_granularity(size_t* g, const CUmemAllocationProp* prop,
                             CUmemAllocationGranularity_flags flags) {
  (void)prop, (void)flags;
  *g = SIM_VMM_GRANULARITY;
  return CUDA_SUCCESS;
}

CUresult sim_vmm_create(CUmemGenericAllocationHandle* h, size_t size,
                        const CUmemAllocationProp* prop, unsigned long long flags) {
  (void)flags;
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (size == 0 || size % SIM_VMM_GRANULARITY || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop->location.id >= g_ndev)
    return CUDA_ERROR_INVALID_VALUE;
  struct sim_vmm* v = calloc(1, sizeof(*v));
  int fd = memfd_create("cudasim-vmm", MFD_CLOEXEC);
  if (v == NULL || fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    if (fd >= 0) close(fd);
    free(v);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *v = (struct sim_vmm){
      fd, size, 1, (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0};
  *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
  return CUDA_SUCCESS;
}

/* POSIX-fd handles: a dup of the memfd out, a new allocation around one in. */
CUresult sim_vmm_export(void* out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                        unsigned long long flags) {
  struct sim_vmm* v = (struct sim_vmm*)(uintptr_t)h;
  (void)flags;
  if (v == NULL || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !v->exportable)
    return CUDA_ERROR_INVALID_VALUE;
  if (getenv("CUDASIM_NO_EXPORT")) return CUDA_ERROR_NOT_PERMITTED; /* tests: nothing new leaves */
  int fd = fcntl(v->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *(int*)out = fd;
  return CUDA_SUCCESS;
}

CUresult sim_vmm_import(CUmemGenericAllocationHandle* h, void* os_handle,
                        CUmemAllocationHandleType type) {
  struct stat st;
  int fd = (int)(intptr_t)os_handle;
  if (getenv("CUDASIM_NO_IMPORT")) return CUDA_ERROR_NOT_PERMITTED; /* tests: nothing comes in */
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(fd, &st) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  struct sim_vmm* v = calloc(1, sizeof(*v));
  int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the caller keeps its fd */
  if (v == NULL || mine < 0) {
    if (mine >= 0) close(mine);
    free(v);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *v = (struct sim_vmm){mine, (size_t)st.st_size, 1, 1};
  *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
  return CUDA_SUCCESS;
}

CUresult sim_vmm_release(CUmemGenericAllocationHandle h) {
  if (h == 0) return CUDA_ERROR_INVALID_VALUE;
  vmm_unref((struct sim_vmm*)(uintptr_t)h);
  return CUDA_SUCCESS;
}

CUresult sim_vmm_reserve(CUdeviceptr* p, size_t size, size_t align, CUdeviceptr addr,
                         unsigned long long flags) {
  (void)addr, (void)flags;
  if (align == 0) align = SIM_VMM_GRANULARITY;
  void* m = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t at = ((uintptr_t)m + align - 1) / align * align;
  if (at > (uintptr_t)m) munmap(m, at - (uintptr_t)m); /* keep only the aligned part */
  munmap((void*)(at + size), (uintptr_t)m + size + align - (at + size));
  *p = (CUdeviceptr)at;
  return CUDA_SUCCESS;
}

CUresult sim_vmm_address_free(CUdeviceptr p, size_t size) {
  return munmap((void*)(uintptr_t)p, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* The device view at p (no host access, as for cuMemAlloc), and a shadow. */
CUresult sim_vmm_map(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                     unsigned long long flags) {
  struct sim_vmm* v = (struct sim_vmm*)(uintptr_t)h;
  (void)flags;
  if (v == NULL || offset + size > v->size) return CUDA_ERROR_INVALID_VALUE;
  void* dev =
      mmap((void*)(uintptr_t)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset);
  void* shadow = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, (off_t)offset);
  if (dev == MAP_FAILED || shadow == MAP_FAILED) {
    if (shadow != MAP_FAILED) munmap(shadow, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  int ok = alloc_add((uintptr_t)p, (uintptr_t)shadow, size, v, -1, 0);
  if (!ok) munmap(shadow, size);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult sim_vmm_set_access(CUdeviceptr p, size_t size, const CUmemAccessDesc* desc, size_t count) {
  (void)size;
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  int mapped = i >= 0 && g_mem.allocs[i].vmm != NULL;
  pthread_mutex_unlock(&g_mem.lock);
  return mapped && count >= 1 && desc[0].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE
             ? CUDA_SUCCESS
             : CUDA_ERROR_INVALID_VALUE;
}

CUresult sim_vmm_unmap(CUdeviceptr p, size_t size) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  int exact = i >= 0 && g_mem.allocs[i].vmm && g_mem.allocs[i].base == (uintptr_t)p &&
              g_mem.allocs[i].size == size;
  struct sim_vmm* v = exact ? g_mem.allocs[i].vmm : NULL;
  uintptr_t shadow = exact ? g_mem.allocs[i].shadow : 0;
  if (exact) g_mem.allocs[i] = g_mem.allocs[--g_mem.nallocs];
  pthread_mutex_unlock(&g_mem.lock);
  if (!exact) return CUDA_ERROR_INVALID_VALUE;
  munmap((void*)shadow, size);
  /* the range stays reserved, without memory, until cuMemAddressFree */
  mmap((void*)(uintptr_t)p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  vmm_unref(v);
  return CUDA_SUCCESS;
}

CUresult sim_vmm_retain(CUmemGenericAllocationHandle* h, void* p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  struct sim_vmm* v = i >= 0 ? g_mem.allocs[i].vmm : NULL;
  if (v) v->refs++;
  pthread_mutex_unlock(&g_mem.lock);
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  *h = (CUmemGenericAllocationHandle)(uintptr_t)v;
  return CUDA_SUCCESS;
}

CUresult sim_address_range(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  if (i >= 0) {
    if (base) *base = (CUdeviceptr)g_mem.allocs[i].base;
    if (size) *size = g_mem.allocs[i].size;
  }
  pthread_mutex_unlock(&g_mem.lock);
  return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* Where the simulated GPU reaches address p: device memory at its shadow,
 * anything else (pinned or plain host memory) where it is. */
void* gpu_addr(uintptr_t p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of(p);
  uintptr_t at = i >= 0 ? g_mem.allocs[i].shadow + (p - g_mem.allocs[i].base) : p;
  pthread_mutex_unlock(&g_mem.lock);
  return (void*)at;
}

CUresult sim_pointer_attribute(void* out, CUpointer_attribute a, CUdeviceptr p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of((uintptr_t)p);
  pthread_mutex_unlock(&g_mem.lock);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE; /* memory the driver does not know */
  switch (a) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned int*)out = CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *(unsigned int*)out = 0;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: /* all memory is device 0's */
      *(int*)out = 0;
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      pthread_mutex_lock(&g_mem.lock);
      *(unsigned long long*)out = g_mem.allocs[i].buffer_id;
      pthread_mutex_unlock(&g_mem.lock);
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      pthread_mutex_lock(&g_mem.lock);
      *(CUdeviceptr*)out = (CUdeviceptr)g_mem.allocs[i].base;
      pthread_mutex_unlock(&g_mem.lock);
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      pthread_mutex_lock(&g_mem.lock);
      *(size_t*)out = g_mem.allocs[i].size;
      pthread_mutex_unlock(&g_mem.lock);
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

/* ---- Pinned host memory ---- */

/* The host's own memory, its device pointer the same address; the ranges
 * are recorded so that a kernel given pageable host memory fails its
 * launch, as a GPU faults on it. */
static int pinned_of(uintptr_t p) {
  for (int i = 0; i < g_pinned.n; i++)
    if (p >= g_pinned.r[i].base && p - g_pinned.r[i].base < g_pinned.r[i].size) return i;
  return -1;
}

static CUresult pinned_add(void* p, size_t bytes) {
  pthread_mutex_lock(&g_mem.lock);
  int ok = g_pinned.n < SIM_MAX_PINNED && pinned_of((uintptr_t)p) < 0;
  if (ok) g_pinned.r[g_pinned.n++] = (struct sim_range){(uintptr_t)p, bytes ? bytes : 1};
  pthread_mutex_unlock(&g_mem.lock);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
}

static CUresult pinned_remove(void* p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = pinned_of((uintptr_t)p);
  int exact = i >= 0 && g_pinned.r[i].base == (uintptr_t)p;
  if (exact) g_pinned.r[i] = g_pinned.r[--g_pinned.n];
  pthread_mutex_unlock(&g_mem.lock);
  return exact ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

CUresult sim_host_alloc(void** p, size_t bytes, unsigned flags) {
  (void)flags;
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *p = malloc(bytes ? bytes : 1);
  if (*p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  memset(*p, 0xa5, bytes); /* not zeroed, as the driver's */
  CUresult r = pinned_add(*p, bytes);
  if (r != CUDA_SUCCESS) free(*p);
  return r;
}

CUresult sim_host_free(void* p) {
  CUresult r = pinned_remove(p);
  if (r == CUDA_SUCCESS) free(p);
  return r == CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_VALUE;
}

CUresult sim_host_register(void* p, size_t bytes, unsigned flags) {
  (void)flags;
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (p == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (getenv("CUDASIM_NO_REGISTER"))
    return CUDA_ERROR_NOT_PERMITTED; /* tests: a driver that refuses */
  return pinned_add(p, bytes);
}

CUresult sim_host_unregister(void* p) {
  return pinned_remove(p);
}

CUresult sim_host_device_pointer(CUdeviceptr* d, void* p, unsigned flags) {
  (void)flags;
  pthread_mutex_lock(&g_mem.lock);
  int i = pinned_of((uintptr_t)p);
  pthread_mutex_unlock(&g_mem.lock);
  if (i < 0) return CUDA_ERROR_INVALID_VALUE; /* not pinned memory */
  *d = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

int gpu_reaches(uintptr_t p, size_t bytes) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of(p), j = i < 0 ? pinned_of(p) : -1;
  int ok = i >= 0 ? bytes <= g_mem.allocs[i].size - (p - g_mem.allocs[i].base)
                  : j >= 0 && bytes <= g_pinned.r[j].size - (p - g_pinned.r[j].base);
  pthread_mutex_unlock(&g_mem.lock);
  return ok;
}

/* What a NIC's DMA reaches at device address p (GPUDirect RDMA, for the
 * tests' fake net plugin, tests/common/fakenet): its shadow, NULL where
 * [p, p + bytes) is not all device or pinned memory. */
/* The buffer id of the allocation holding p now (0: none): what a fake NIC
 * checks its registrations against (tests/common/fakenet: a registration
 * outliving its allocation must never be used on the next one). */
__attribute__((visibility("default"))) uint64_t cudasim_buffer_id(uintptr_t p) {
  pthread_mutex_lock(&g_mem.lock);
  int i = alloc_of(p);
  uint64_t id = i >= 0 ? g_mem.allocs[i].buffer_id : 0;
  pthread_mutex_unlock(&g_mem.lock);
  return id;
}

__attribute__((visibility("default"))) void* cudasim_dma_addr(uintptr_t p, size_t bytes) {
  return gpu_reaches(p, bytes) ? gpu_addr(p) : NULL;
}
