/* Multi-process tests on device buffers: the CUDA driver that the library
 * uses too (BRAID_CUDA_LIB: the simulated one in `make test`, libcuda.so.1
 * on a GPU), opened by the test itself for what a user program does with
 * the runtime: streams, copies, synchronization. Device memory comes from
 * ncclMemAlloc. Nothing here needs cuda.h, so every mp test links it. */
#ifndef MP_DEVMEM_H_
#define MP_DEVMEM_H_

#include <stddef.h>

#include "collcheck.h"
#include "nccl.h"

/* Opens the driver and makes device `dev`'s primary context current on
 * this thread. 0 on success; prints why not. */
int dev_open(const mp_env* env, int dev);
/* A new non-blocking stream (non-NULL), or NULL after printing why. */
cudaStream_t dev_stream(const mp_env* env);
int dev_sync(const mp_env* env, cudaStream_t s);
/* A call on stream s: what it returned, else what the comm reports once
 * the stream drained (which it must, whatever failed). */
ncclResult_t dev_outcome(const mp_env* env, ncclComm_t comm, cudaStream_t s, ncclResult_t rc);
/* Copies between host and device memory (either direction), waited for, on
 * this thread's own stream (not the legacy one). */
int dev_copy(const mp_env* env, void* dst, const void* src, size_t bytes);
/* Enqueue a copy on a stream. */
int dev_copy_async(const mp_env* env, void* dst, const void* src, size_t bytes, cudaStream_t s);

/* Enqueue a wait until *flag >= value (flag: host memory the driver can
 * read; the simulated driver reads any). */
int dev_wait_flag(const mp_env* env, cudaStream_t s, volatile uint64_t* flag, uint64_t value);

/* A prepared host call moved to device memory: device copies of its send
 * and receive allocations (guards included), and the call pointed at them.
 * dev_call_fetch copies them back into the host call for cc_verify. */
typedef struct dev_call {
  cc_call host; /* cc_prepare'd */
  cc_call dev;  /* the same call on the device allocations */
  void* dsend;
  void* drecv;
} dev_call;
int dev_call_prepare(dev_call* d, const mp_env* env);
int dev_call_fetch(dev_call* d, const mp_env* env);
void dev_call_release(dev_call* d);

/* Device memory from cuMemAlloc (dev_open first), which CUDA IPC shares
 * by legacy handle; ncclMemAlloc's is cuMem memory, shared by fd. */
void* dev_alloc_legacy(const mp_env* env, size_t bytes);
void dev_free_legacy(void* p);

#endif /* MP_DEVMEM_H_ */
