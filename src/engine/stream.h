/*
 * Host streams: an in-order queue of jobs executed by one library thread
 * per stream (braid.h documents the user-facing semantics). Non-blocking
 * communicators use one internally for their init and their calls, the
 * device path one per comm as its proxy. A job is opaque here: units of
 * work are queued by work.c (work_submit), the stream runs what they say.
 */
#ifndef BRAID_STREAM_H_
#define BRAID_STREAM_H_

#include <stddef.h>

#include "nccl.h"
#include "engine/work_op.h"

struct braid_stream;

ncclResult_t stream_create(struct braid_stream** out);
/* Waits for the queued work, stops the thread, frees the stream. */
void stream_destroy(struct braid_stream* s);

/* What a stream runs: `bytes` of data copied into the item (no allocation
 * once the item's room has grown), and what to do with them; each call
 * gets the data and its size. */
struct stream_job {
  ncclResult_t (*run)(void* data, size_t bytes);
  /* It will not run, for `why` (the stream's earlier error, or its gates'
   * streams failed): let go of what it holds. */
  void (*cancel)(void* data, size_t bytes, ncclResult_t why);
  /* Whether to stop waiting for its gates (whoever it belongs to aborted). */
  int (*aborted)(const void* data, size_t bytes);
  /* Its gates' streams failed with res: tell whoever it belongs to. */
  void (*failed)(void* data, size_t bytes, ncclResult_t res);
};

/* Queue a job on `bytes` of `data`, to run once every gate is ready (or
 * the job says it was aborted); the gates are opened after the run
 * whatever its outcome, even when an earlier error keeps it from running,
 * so their streams drain. A gated job always runs: its owner's own error
 * state decides, and the stream's first error stays with ungated work. */
ncclResult_t stream_submit(struct braid_stream* s, const struct stream_job* job, const void* data,
                           size_t bytes, const struct gpu_gate* gates, int ngates);
/* Queue fn(arg); fn owns arg. */
ncclResult_t stream_submit_fn(struct braid_stream* s, ncclResult_t (*fn)(void*), void* arg);

/* Block until idle; the stream's first error or ncclSuccess. */
ncclResult_t stream_sync(struct braid_stream* s);
/* ncclInProgress while busy, else the first error or ncclSuccess. */
ncclResult_t stream_query(struct braid_stream* s);

/* The host stream behind a cudaStream_t handle, NULL for anything else. */
struct braid_stream* stream_from_handle(cudaStream_t handle);

#endif /* BRAID_STREAM_H_ */
