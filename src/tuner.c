/*
 * Tuner: picks the algorithm and pipeline chunk for each call. Only the
 * ring exists so far; NCCL_ALGO is honoured (and unknown names refused
 * with a WARN), and the chunk shrinks for mid-size messages so a step is
 * cut into enough slices to pipeline around the ring.
 */
#include <string.h>
#include <strings.h>

#include "comm.h"
#include "core.h"
#include "param.h"

/* Fewer slices than this per step leaves the ring mostly idle. */
#define TUNER_MIN_SLICES 4
#define TUNER_MIN_CHUNK (16 * 1024)

static int tuner_algo_from_env(void) {
  static _Atomic int cached = -2;
  int v = atomic_load_explicit(&cached, memory_order_relaxed);
  if (v != -2) return v;
  const char* s = param_read_str("NCCL_ALGO");
  v = ALGO_RING;
  if (s && strcasestr(s, "ring") == NULL)
    WARN("NCCL_ALGO=%s: no such algorithm available for all-reduce here, using Ring", s);
  atomic_store_explicit(&cached, v, memory_order_relaxed);
  return v;
}

void tuner_choose_allreduce(const struct ncclComm* comm, size_t count, size_t elem_size,
                            int* algo, size_t* chunk_bytes) {
  size_t max_chunk = comm->exec.slot_bytes;
  size_t seg = DIV_UP(count, (size_t)comm->nranks) * elem_size;
  size_t chunk = ALIGN_UP(DIV_UP(seg, TUNER_MIN_SLICES), 4096);
  *algo = tuner_algo_from_env();
  *chunk_bytes = MAX((size_t)TUNER_MIN_CHUNK, MIN(chunk, max_chunk));
  TRACE(SUB_TUNING, "AllReduce count %zu: algo Ring chunk %zu", count, *chunk_bytes);
}
