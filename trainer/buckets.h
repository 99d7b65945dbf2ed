/* Gradient buckets: the flat gradient buffer cut into ranges (a small first one, then
 * --bucket-mb each), each sent by the synchronisation scheme (sync.h: an all-reduce, a reduce
 * to the server, an all-gather of pairs) on a Braid host stream the moment backward has
 * finished it, so communication runs while the rest of backward computes.
 *
 * Accounting. "busy" is the time during which some all-reduce was queued or running: from a
 * launch (or the previous drain, if later) to the drain of the stream that follows it. A
 * watcher thread timestamps the drains; the trainer's own wake-up after a step bounds the last
 * one, so a watcher that is scheduled late cannot inflate it. "wait" is the time the trainer
 * was stopped by communication: inside the launch calls and blocked waiting. What
 * was busy but not waited for was hidden behind compute. */
#ifndef TRAIN_BUCKETS_H_
#define TRAIN_BUCKETS_H_

#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>

#include "braid.h"
#include "layer.h"

#define BUCKETS_RING 1024     /* launches the watcher may lag behind */
#define BUCKETS_MAX_STREAMS 9 /* stale:8 keeps 9 steps' gradients in flight */

/* Enqueues one call on `stream`: bucket `bucket` ([begin, begin + n) of the gradients), or
 * -1 for a call of the scheme's own (buckets_call). */
typedef ncclResult_t (*buckets_send_fn)(void* ctx, int bucket, size_t begin, size_t n,
                                        cudaStream_t stream);

typedef struct {
  ncclComm_t comm;
  cudaStream_t streams[BUCKETS_MAX_STREAMS];
  int nstreams;
  int cur; /* the stream of this step */
  size_t count;
  int nbuckets;
  size_t* ends;         /* bucket b is [b ? ends[b-1] : 0, ends[b]) */
  int overlap;          /* 0: launch every bucket only after backward (for comparison) */
  int fixed_grid;       /* gradient pieces on a fixed grid, not at bucket ends (layer.h) */
  int next;             /* first bucket of this step not launched yet */
  buckets_send_fn send; /* NULL: gradients stay on the rank */
  void* send_ctx;
  ncclResult_t launch_error;

  /* watcher */
  pthread_t watcher;
  int watcher_started;
  sem_t posted;
  pthread_mutex_t lock;
  pthread_cond_t caught_up;
  uint64_t launches, watched; /* launch sequence numbers */
  double launch_time[BUCKETS_RING];
  int launch_stream[BUCKETS_RING];
  double last_end;
  uint64_t finished_launches; /* launches when the trainer last saw the streams drain */
  double finished_time;       /* and when */
  int stopping;

  /* since the last buckets_take_times */
  double busy_s; /* some call queued or running */
  double wait_s; /* the trainer blocked on them */
} buckets_t;

/* nstreams: how many steps may have calls in flight at once (1 but for stale). Returns 0, or
 * -1 with a message. */
int buckets_init(buckets_t* b, ncclComm_t comm, size_t count, double first_mb, double bucket_mb,
                 int overlap, int nstreams, char* err, size_t errlen);
void buckets_destroy(buckets_t* b);

/* What each bucket does when backward has finished it (NULL: nothing). */
void buckets_set_send(buckets_t* b, buckets_send_fn send, void* ctx);

/* The sink that model_backward reports to. */
grad_sink_t buckets_sink(buckets_t* b);

/* Start of a step's backward pass; its calls go on stream `stream`. */
void buckets_begin(buckets_t* b, int stream);

/* One call of the scheme's own on this step's stream, timed as the buckets are. */
ncclResult_t buckets_call(buckets_t* b, buckets_send_fn fn, void* ctx);

/* After backward: launches the buckets not launched yet. Returns the first error. */
ncclResult_t buckets_flush(buckets_t* b);

/* Waits for every call on `stream` (the time counts as waiting). */
ncclResult_t buckets_wait(buckets_t* b, int stream);

/* buckets_flush, then buckets_wait on this step's stream. */
ncclResult_t buckets_finish(buckets_t* b);

/* Communication time and waiting time since the last call (seconds); resets both. */
void buckets_take_times(buckets_t* b, double* busy_s, double* wait_s);

double buckets_now(void);

#endif /* TRAIN_BUCKETS_H_ */
