/*
 * Host streams: an in-order queue of work executed by one library thread
 * per stream (braid.h documents the user-facing semantics). Non-blocking
 * communicators use one internally for their init and their calls.
 */
#ifndef BRAID_STREAM_H_
#define BRAID_STREAM_H_

#include "nccl.h"
#include "work.h"

struct braid_stream;

ncclResult_t stream_create(struct braid_stream** out);
/* Waits for the queued work, stops the thread, frees the stream. */
void stream_destroy(struct braid_stream* s);

/* Queue a copy of ops[0..n) as one unit of work. */
ncclResult_t stream_submit_ops(struct braid_stream* s, const struct work_op* ops, int n);
/* Queue ops[0..n) to run once every gate is ready (or a comm of theirs is
 * aborted); the gates are opened after the run whatever its outcome, even
 * when an earlier error keeps it from running, so their streams drain. */
ncclResult_t stream_submit_gated(struct braid_stream* s, const struct work_op* ops, int n,
                                 const struct work_gate* gates, int ngates);
/* Queue fn(arg); fn owns arg. */
ncclResult_t stream_submit_fn(struct braid_stream* s, ncclResult_t (*fn)(void*), void* arg);

/* Block until idle; the stream's first error or ncclSuccess. */
ncclResult_t stream_sync(struct braid_stream* s);
/* ncclInProgress while busy, else the first error or ncclSuccess. */
ncclResult_t stream_query(struct braid_stream* s);

/* The host stream behind a cudaStream_t handle, NULL for anything else. */
struct braid_stream* stream_from_handle(cudaStream_t handle);

#endif /* BRAID_STREAM_H_ */
