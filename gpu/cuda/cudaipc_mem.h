/*
 * Device buffers shared between processes of one node. The exporter
 * describes the allocation that holds a buffer: a legacy IPC handle
 * (cuMemAlloc'ed memory), or a cuMem allocation whose POSIX fd travels
 * beside the description (cudaipc_fd.h). The importer maps an allocation
 * once and keeps it in a cache keyed by exporter rank, allocation base and
 * buffer id: a buffer freed and reallocated at the same address has a new
 * id, so its stale mapping is dropped, never read.
 */
#ifndef BRAID_CUDAIPC_MEM_H_
#define BRAID_CUDAIPC_MEM_H_

#include <cuda.h>
#include <stdint.h>

#include "nccl.h"

enum cudaipc_kind { CUDAIPC_LEGACY = 1, CUDAIPC_VMM = 2 };

/* What a peer needs to map an allocation; plain bytes on the wire. */
struct cudaipc_desc {
  uint64_t base; /* the allocation, at the exporter's address */
  uint64_t size;
  uint64_t buffer_id; /* the driver's: never the same for two allocations */
  uint32_t kind;      /* enum cudaipc_kind */
  uint32_t reserved;
  CUipcMemHandle legacy; /* CUDAIPC_LEGACY's handle */
};

/* Describe the allocation holding `ptr` (device memory of the current
 * context's device). CUDAIPC_VMM: *fd gets a new descriptor of it, for the
 * caller to pass on and close; else *fd = -1. */
ncclResult_t cudaipc_describe(const void* ptr, struct cudaipc_desc* desc, int* fd);

/* A buffer's description and (cuMem) fd made once and kept: what
 * ncclCommRegister caches, so calls on registered buffers export nothing. */
struct cudaipc_export {
  struct cudaipc_desc desc;
  int fd; /* -1: a legacy handle */
};

/* The export of the allocation holding `ptr`, or NULL (*out) where there is
 * none to make (host memory, no driver, no IPC for it: calls then describe
 * their buffers themselves). */
void cudaipc_export_make(const void* ptr, struct cudaipc_export** out);
void cudaipc_export_free(struct cudaipc_export* ex);
/* Whether `ex` still describes the allocation holding ptr (inside it, and
 * the same buffer id: not freed and reallocated meanwhile). */
int cudaipc_export_covers(const struct cudaipc_export* ex, const void* ptr);

struct cudaipc_cache;

/* An empty cache whose mappings are made for device `dev` in the current
 * context; cudaipc_cache_destroy unmaps all (in that context). */
ncclResult_t cudaipc_cache_create(CUdevice dev, struct cudaipc_cache** out);
void cudaipc_cache_destroy(struct cudaipc_cache* cache);

/* Whether peer's allocation `desc` is mapped already: a VMM one then needs
 * no fd. */
int cudaipc_cache_holds(const struct cudaipc_cache* cache, int peer,
                        const struct cudaipc_desc* desc);

/* Where peer's allocation `desc` is mapped here, mapping it on a miss (a
 * VMM allocation from `fd`, which the caller keeps); a mapping of the same
 * base with another buffer id is unmapped first. *mapped gets how many
 * bytes from *local the mapping holds, as the driver made it: the bound
 * for what the peer may name in it, whatever its description claims. */
ncclResult_t cudaipc_cache_map(struct cudaipc_cache* cache, int peer,
                               const struct cudaipc_desc* desc, int fd, void** local,
                               size_t* mapped);
/* Where `bytes` at the peer's address `ptr`, inside its allocation `desc`
 * mapped here at (local, mapped), are here; ncclInvalidUsage (with a WARN
 * naming the peer) when they do not lie inside the mapping. */
ncclResult_t cudaipc_translate(const struct cudaipc_desc* desc, void* local, size_t mapped,
                               uint64_t ptr, uint64_t bytes, int peer, char** out);

/* The mappings made and dropped as stale so far (for tests and INFO). */
void cudaipc_cache_stats(const struct cudaipc_cache* cache, uint64_t* maps, uint64_t* stale);

#endif /* BRAID_CUDAIPC_MEM_H_ */
