/* Bucketed, overlapped gradient communication. Every rank cuts the same buffer the same way
 * and launches buckets in the same order, as Braid requires of one communicator's calls. */
#include "buckets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BUCKET_ALIGN 16 /* floats: bucket edges on 64-byte boundaries */

double buckets_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t floats_of_mb(double mb) {
  size_t n = (size_t)(mb * 1024.0 * 1024.0 / sizeof(float));
  n = (n + BUCKET_ALIGN - 1) / BUCKET_ALIGN * BUCKET_ALIGN;
  return n ? n : BUCKET_ALIGN;
}

static int plan(buckets_t* b, double first_mb, double bucket_mb) {
  const size_t first = floats_of_mb(first_mb), rest = floats_of_mb(bucket_mb);
  size_t n = 1 + (b->count > first ? (b->count - first + rest - 1) / rest : 0);
  b->ends = malloc(n * sizeof(size_t));
  if (b->ends == NULL) return -1;
  size_t end = first;
  b->nbuckets = 0;
  for (;;) {
    b->ends[b->nbuckets++] = end < b->count ? end : b->count;
    if (end >= b->count) break;
    end += rest;
  }
  return 0;
}

/* Time from each launch (or the previous drain, when later) to the drain that follows it:
 * the union of the intervals in which a stream had work. */
static void* watch(void* p) {
  buckets_t* b = p;
  for (;;) {
    while (sem_wait(&b->posted) != 0) continue; /* EINTR */
    pthread_mutex_lock(&b->lock);
    int stop = b->stopping && b->watched == b->launches;
    double launched = b->launch_time[b->watched % BUCKETS_RING];
    cudaStream_t stream = b->streams[b->launch_stream[b->watched % BUCKETS_RING]];
    double start = launched > b->last_end ? launched : b->last_end;
    pthread_mutex_unlock(&b->lock);
    if (stop) break;
    braidStreamSynchronize(stream); /* errors are the trainer's to report */
    double end = buckets_now();
    pthread_mutex_lock(&b->lock);
    /* the trainer saw the drain of this launch already: it happened by then */
    if (b->watched < b->finished_launches && b->finished_time < end) end = b->finished_time;
    if (end > start) b->busy_s += end - start;
    if (end > b->last_end) b->last_end = end;
    b->watched++;
    pthread_cond_broadcast(&b->caught_up);
    pthread_mutex_unlock(&b->lock);
  }
  return NULL;
}

int buckets_init(buckets_t* b, ncclComm_t comm, size_t count, double first_mb, double bucket_mb,
                 int overlap, int nstreams, char* err, size_t errlen) {
  memset(b, 0, sizeof(*b));
  b->comm = comm;
  b->count = count;
  b->overlap = overlap;
  if (plan(b, first_mb, bucket_mb) != 0) {
    snprintf(err, errlen, "out of memory planning gradient buckets");
    return -1;
  }
  for (; b->nstreams < nstreams && b->nstreams < BUCKETS_MAX_STREAMS; b->nstreams++) {
    ncclResult_t res = braidStreamCreate(&b->streams[b->nstreams]);
    if (res != ncclSuccess) {
      snprintf(err, errlen, "braidStreamCreate failed: %s", ncclGetErrorString(res));
      return -1;
    }
  }
  sem_init(&b->posted, 0, 0);
  pthread_mutex_init(&b->lock, NULL);
  pthread_cond_init(&b->caught_up, NULL);
  if (pthread_create(&b->watcher, NULL, watch, b) != 0) {
    snprintf(err, errlen, "cannot start the communication watcher thread");
    return -1;
  }
  b->watcher_started = 1;
  return 0;
}

void buckets_set_send(buckets_t* b, buckets_send_fn send, void* ctx) {
  b->send = send;
  b->send_ctx = ctx;
}

void buckets_destroy(buckets_t* b) {
  if (b->watcher_started) {
    pthread_mutex_lock(&b->lock);
    b->stopping = 1;
    pthread_mutex_unlock(&b->lock);
    sem_post(&b->posted);
    pthread_join(b->watcher, NULL);
    sem_destroy(&b->posted);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->caught_up);
  }
  for (int i = 0; i < b->nstreams; i++) braidStreamDestroy(b->streams[i]);
  free(b->ends);
  memset(b, 0, sizeof(*b));
}

/* Enqueues one call. The call's own time counts as waiting: backward stood still meanwhile. */
static ncclResult_t launch(buckets_t* b, buckets_send_fn fn, void* ctx, int bucket) {
  const size_t begin = bucket > 0 ? b->ends[bucket - 1] : 0;
  const size_t n = bucket >= 0 ? b->ends[bucket] - begin : 0;
  pthread_mutex_lock(&b->lock);
  while (b->launches - b->watched >= BUCKETS_RING) pthread_cond_wait(&b->caught_up, &b->lock);
  const double t0 = buckets_now();
  b->launch_time[b->launches % BUCKETS_RING] = t0;
  b->launch_stream[b->launches % BUCKETS_RING] = b->cur;
  pthread_mutex_unlock(&b->lock);
  ncclResult_t res = fn(ctx, bucket, begin, n, b->streams[b->cur]);
  b->wait_s += buckets_now() - t0;
  if (res != ncclSuccess) {
    if (b->launch_error == ncclSuccess) b->launch_error = res;
    return res;
  }
  pthread_mutex_lock(&b->lock);
  b->launches++;
  pthread_mutex_unlock(&b->lock);
  sem_post(&b->posted);
  return ncclSuccess;
}

ncclResult_t buckets_call(buckets_t* b, buckets_send_fn fn, void* ctx) {
  if (b->launch_error != ncclSuccess) return b->launch_error;
  return launch(b, fn, ctx, -1);
}

static void launch_ready(buckets_t* b, size_t ready) {
  while (b->send && b->next < b->nbuckets && b->ends[b->next] <= ready &&
         b->launch_error == ncclSuccess)
    launch(b, b->send, b->send_ctx, b->next++);
}

static void sink_ready(void* ctx, size_t end) {
  buckets_t* b = ctx;
  if (b->overlap) launch_ready(b, end);
}

/* The first bucket end past offset: where a layer should cut its weight gradient. */
static size_t sink_boundary(void* ctx, size_t offset) {
  const buckets_t* b = ctx;
  int lo = 0, hi = b->nbuckets - 1;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (b->ends[mid] > offset)
      hi = mid;
    else
      lo = mid + 1;
  }
  return b->ends[lo] > offset ? b->ends[lo] : b->count;
}

grad_sink_t buckets_sink(buckets_t* b) {
  grad_sink_t s = {b, b->overlap && b->send ? sink_boundary : NULL, sink_ready, NULL,
                   b->fixed_grid};
  return s;
}

void buckets_begin(buckets_t* b, int stream) {
  b->next = 0;
  b->cur = stream;
}

ncclResult_t buckets_flush(buckets_t* b) {
  launch_ready(b, b->count);
  return b->launch_error;
}

ncclResult_t buckets_wait(buckets_t* b, int stream) {
  if (b->launch_error != ncclSuccess) return b->launch_error;
  const double t0 = buckets_now();
  ncclResult_t res = braidStreamSynchronize(b->streams[stream]);
  const double t1 = buckets_now();
  b->wait_s += t1 - t0;
  pthread_mutex_lock(&b->lock);
  if (b->nstreams == 1) { /* every launch so far has drained (one stream: in order) */
    b->finished_launches = b->launches;
    b->finished_time = t1;
  }
  pthread_mutex_unlock(&b->lock);
  return res;
}

ncclResult_t buckets_finish(buckets_t* b) {
  ncclResult_t res = buckets_flush(b);
  return res != ncclSuccess ? res : buckets_wait(b, b->cur);
}

void buckets_take_times(buckets_t* b, double* busy_s, double* wait_s) {
  pthread_mutex_lock(&b->lock);
  while (b->watched != b->launches) pthread_cond_wait(&b->caught_up, &b->lock);
  *busy_s = b->busy_s;
  b->busy_s = 0;
  pthread_mutex_unlock(&b->lock);
  *wait_s = b->wait_s;
  b->wait_s = 0;
}
