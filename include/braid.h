/*
 * Braid extensions to the NCCL API. Only what NCCL has no word for lives
 * here; everything else is in nccl.h.
 */
#ifndef BRAID_H_
#define BRAID_H_

#include "nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The NCCL release whose host calls all work in this Braid, which is what
 * ncclGetVersion reports (clients such as nccl-tests switch features on by
 * it). The calls Braid answers with ncclInvalidUsage by design (the
 * device-side API, one-sided signals, encryption) do not count against it
 * (docs/api.md, "API coverage").
 */
#define BRAID_NCCL_LEVEL NCCL_VERSION(2, 32, 3)

/*
 * Host streams: an in-order queue of Braid work on host memory, executed by
 * a thread of the library while the caller goes on computing.
 *
 * - braidStreamCreate returns a handle that is passed wherever NCCL takes a
 *   cudaStream_t (it is never a real CUDA stream; do not hand it to CUDA).
 * - A call on a host stream only validates and enqueues, then returns
 *   ncclSuccess; the buffers must stay untouched until the stream has run
 *   the call (braidStreamSynchronize, or braidStreamQuery == ncclSuccess).
 * - Work on one stream runs in the order it was enqueued. A group
 *   (ncclGroupStart/End) is one unit of work; its calls must all name the
 *   same stream.
 * - Different streams are independent: a call blocked on one (say waiting
 *   for a late peer) does not hold back another.
 * - Work on one communicator runs in the order the calls were issued, on
 *   whichever streams (or NULL) they were issued: a call waits for the
 *   communicator's earlier calls to finish. Ranks must still issue the
 *   calls of one communicator in the same order, as with NCCL.
 * - An error is sticky: braidStreamSynchronize/Query return it, and so does
 *   ncclCommGetAsyncError of the communicator involved.
 */
ncclResult_t braidStreamCreate(cudaStream_t* stream);
/* Waits for the stream's work, then frees it. */
ncclResult_t braidStreamDestroy(cudaStream_t stream);
/* Blocks until everything enqueued so far has run; returns its first error. */
ncclResult_t braidStreamSynchronize(cudaStream_t stream);
/* ncclSuccess when idle, ncclInProgress while work is queued or running,
 * or the stream's first error. Never blocks. */
ncclResult_t braidStreamQuery(cudaStream_t stream);

/*
 * A host function on a stream (as cudaLaunchHostFunc): fn(userData, status)
 * runs on the stream's thread once everything enqueued on the stream before
 * it has run, and before anything enqueued after it. It runs whether or not
 * that work succeeded: status is the stream's first error so far, or
 * ncclSuccess. It is how a caller learns that one call of several on a
 * stream is done (braidStreamQuery only says the whole queue is).
 * fn must return promptly and must not wait for its own stream
 * (braidStreamSynchronize or braidStreamDestroy of it never return); it may
 * enqueue further work. A NULL fn or a handle that is not a host stream is
 * ncclInvalidArgument.
 */
typedef void (*braidHostFn_t)(void* userData, ncclResult_t status);
ncclResult_t braidStreamLaunchHostFunc(cudaStream_t stream, braidHostFn_t fn, void* userData);

/*
 * Deterministic reductions (docs/determinism.md). With `enable` 1, every
 * all-reduce, reduce and reduce-scatter issued on `comm` afterwards
 * combines each element's n inputs in one canonical order (pairwise by
 * rank), so its bits depend only on those inputs and n: not on the
 * algorithm, chunk, buffer size, element offset, node layout, transport
 * or memory kind. 0 returns to the default mode. Every comm starts in the
 * mode BRAID_DETERMINISTIC names (0 when unset), those that ncclCommSplit,
 * Shrink and Grow make as well. Every rank must set the same mode before the same
 * call (a rank whose mode differs fails that call with ncclInvalidUsage,
 * as any mismatched call does). Calls already issued keep their mode.
 */
ncclResult_t braidCommSetDeterministic(ncclComm_t comm, int enable);
/* The comm's mode: 1 deterministic, 0 not. */
ncclResult_t braidCommGetDeterministic(ncclComm_t comm, int* enabled);

/*
 * Tagged point-to-point that runs on its own, as gloo's and MPI's isend
 * and irecv do: the call queues the transfer and returns; done(userData,
 * status) runs once, on a library thread, when it completed (ncclSuccess)
 * or failed. Unlike ncclSend/ncclRecv it is in no order with the comm's
 * other calls: each transfer moves as soon as its peer has posted the
 * matching one, whatever order the ranks post them in. Sends and receives
 * between two ranks with the same tag match in the order they were posted
 * (any int is a tag); a send and its receive must be the same size (else
 * both fail with ncclInvalidUsage). Host memory only (device memory is
 * ncclInvalidUsage). A transfer with nothing moving for BRAID_TIMEOUT_MS
 * fails, as do those still pending when the comm is destroyed, aborted or
 * revoked. done must not wait for other tagged transfers of its comm.
 */
ncclResult_t braidTaggedSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             int tag, ncclComm_t comm, braidHostFn_t done, void* userData);
ncclResult_t braidTaggedRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             int tag, ncclComm_t comm, braidHostFn_t done, void* userData);
/* A tagged receive from any rank (MPI_ANY_SOURCE, gloo's recv from any
 * source): it takes the oldest send with its tag that no earlier receive
 * took, from whichever rank; *source is that rank when done runs with
 * ncclSuccess. A receive posted earlier, from any source or from a named
 * rank, takes a send first. */
ncclResult_t braidTaggedRecvAny(void* recvbuff, size_t count, ncclDataType_t datatype, int tag,
                                ncclComm_t comm, int* source, braidHostFn_t done, void* userData);

/*
 * Whether calls on `comm` with a NULL stream block (1: they run on the
 * caller's thread and return when done) or not (0: they are queued on the
 * comm's own stream and return ncclInProgress; ncclCommGetAsyncError tells
 * when they are done). NCCL fixes the mode at init (config.blocking); a
 * comm made non-blocking, once ready, may change it, so that a program can
 * give its init a deadline (a blocking init waits up to BRAID_TIMEOUT_MS)
 * and then call without a thread hand-off. Calls issued before run as
 * issued; a later call still waits for them (calls of a comm run in issue
 * order). A comm made blocking, or whose init is still running, is
 * ncclInvalidUsage.
 */
ncclResult_t braidCommSetBlocking(ncclComm_t comm, int blocking);

/*
 * What a job is doing, live and post mortem (docs/debugging.md). Every
 * rank keeps a flight recorder of its last calls (BRAID_FLIGHT_ENTRIES);
 * a status gathers every rank's over the comm's own authenticated control
 * channel and says, first line, who holds the job up and where: a rank
 * that has not called a collective, one that is slow, gone, stopped, a
 * link that carries nothing, calls that do not match. The text ends with
 * a table of the ranks. Formats: the verdict as text, JSON lines (every
 * rank's recorder, then the verdict), Prometheus' text format.
 */
typedef enum {
  braidStatusText = 0,
  braidStatusJson = 1,
  braidStatusPrometheus = 2
} braidStatusFormat_t;

/* The job's status as this rank of comm gathers it now (it takes about
 * half a second: two looks, apart, tell a job that moves from one that is
 * stuck); *text is the caller's to free(). Callable while other threads
 * are inside calls on comm. */
ncclResult_t braidCommStatus(ncclComm_t comm, braidStatusFormat_t format, char** text);
/* This rank's flight recorder of comm as JSON lines, what it would write
 * to BRAID_TRACE_DIR; *text is the caller's to free(). */
ncclResult_t braidCommRecorder(ncclComm_t comm, char** text);
/* braid-status: ask process `pid` (this user's, with a communicator) for
 * the status of each of its comms, written to fd. ncclInvalidArgument when
 * no such process of this user answers status requests. */
ncclResult_t braidStatusAsk(int pid, braidStatusFormat_t format, int fd);
/* braid-status --dumps: the status of each comm whose ranks left their
 * recorders in `dir` (BRAID_TRACE_DIR), merged, written to fd. */
ncclResult_t braidStatusFromDumps(const char* dir, braidStatusFormat_t format, int fd);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* BRAID_H_ */
