/*
 * Host streams. A handle is the stream's address with a tag bit that no
 * CUDA stream pointer carries, so any cudaStream_t argument can be told
 * apart without a lookup. Each stream owns a thread that runs queued items
 * in order; finished items go to a free list and are reused, so steady
 * state enqueueing does not allocate once the item's data room has grown.
 */
#include "engine/stream.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"
#include "core.h"

#define STREAM_TAG ((uintptr_t)4) /* CUDA streams are 8-aligned; 1, 2 are its specials */
#define STREAM_MAGIC 0x6273747265616d21ull

struct stream_item {
  const struct stream_job* job;
  unsigned char* data; /* the job's, copied: `bytes` of them; room for cap */
  size_t bytes, cap;
  struct gpu_gate gates[WORK_MAX_GATES];
  int ngates;
  struct stream_item* next;
};

struct braid_stream {
  uint64_t magic;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake; /* items queued, or stopping */
  pthread_cond_t idle; /* queue drained */
  struct stream_item *head, *tail, *free_items;
  int stopping;
  ncclResult_t error; /* sticky first error */
};

struct braid_stream* stream_from_handle(cudaStream_t handle) {
  uintptr_t v = (uintptr_t)handle;
  if ((v & 7) != STREAM_TAG) return NULL;
  struct braid_stream* s = (struct braid_stream*)(v & ~(uintptr_t)7);
  return s->magic == STREAM_MAGIC ? s : NULL;
}

static cudaStream_t stream_handle(struct braid_stream* s) {
  return (cudaStream_t)((uintptr_t)s | STREAM_TAG);
}

static int gates_ready(const struct stream_item* it) {
  for (int i = 0; i < it->ngates; i++)
    if ((int64_t)(__atomic_load_n(it->gates[i].ready, __ATOMIC_ACQUIRE) - it->gates[i].value) < 0)
      return 0;
  return 1;
}

static int item_aborted(const struct stream_item* it) {
  return it->job->aborted && it->job->aborted(it->data, it->bytes);
}

/* A gate whose stream can no longer reach it, checked now and then (not at
 * every poll: it asks the driver). */
static ncclResult_t gates_check(const struct stream_item* it) {
  for (int i = 0; i < it->ngates; i++) {
    const struct gpu_gate* g = &it->gates[i];
    if ((int64_t)(__atomic_load_n(g->ready, __ATOMIC_ACQUIRE) - g->value) >= 0 || !g->check)
      continue;
    ncclResult_t res = g->check(g);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* Wait for the streams to reach the unit. They may be busy with the user's
 * kernels for long: after a short spin the wait sleeps, up to 100 us, so a
 * proxy thread costs little while its GPU computes. It ends early when a
 * job says it was aborted, or when a stream fails (the job is told). */
static ncclResult_t gates_wait(const struct stream_item* it) {
  long nap_ns = 0;
  uint64_t next_check = braid_now_ns() + 100000000ull;
  while (!gates_ready(it) && !item_aborted(it)) {
    if (!braid_backoff(&nap_ns)) continue;
    if (braid_now_ns() < next_check) continue;
    next_check = braid_now_ns() + 100000000ull;
    ncclResult_t res = gates_check(it);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

static void gates_open(struct stream_item* it) {
  for (int i = 0; i < it->ngates; i++)
    __atomic_store_n(it->gates[i].done, it->gates[i].value, __ATOMIC_RELEASE);
  it->ngates = 0;
}

static void* stream_main(void* p) {
  struct braid_stream* s = p;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (s->head == NULL && !s->stopping) pthread_cond_wait(&s->wake, &s->lock);
    if (s->head == NULL) break;
    struct stream_item* it = s->head;
    pthread_mutex_unlock(&s->lock);
    /* after an error the queue drains without running (order is lost), but
     * each job is cancelled (a unit gives up its turns on its comms). A
     * gated job (a device call) always runs: its comms' own error state
     * decides, so one comm's failure never drops another comm's later calls
     * that share the proxy, and the stream's error stays with host-stream
     * work. */
    int gated = it->ngates > 0, run = gated || s->error == ncclSuccess;
    ncclResult_t res = gated ? gates_wait(it) : ncclSuccess;
    if (res != ncclSuccess) { /* a stream failed: the job cannot run */
      if (it->job->failed) it->job->failed(it->data, it->bytes, res);
      run = 0;
    }
    ncclResult_t why = res != ncclSuccess ? res : s->error; /* if it does not run */
    res = run ? it->job->run(it->data, it->bytes) : why;
    if (!run && it->job->cancel) it->job->cancel(it->data, it->bytes, why);
    gates_open(it);
    pthread_mutex_lock(&s->lock);
    if (s->error == ncclSuccess && !gated) s->error = res;
    s->head = it->next;
    if (s->head == NULL) s->tail = NULL;
    it->next = s->free_items;
    s->free_items = it;
    if (s->head == NULL) pthread_cond_broadcast(&s->idle);
  }
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

ncclResult_t stream_create(struct braid_stream** out) {
  struct braid_stream* s = NULL;
  ncclResult_t res = braid_calloc(&s, 1, sizeof(*s));
  if (res != ncclSuccess) return res;
  s->magic = STREAM_MAGIC;
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->wake, NULL);
  pthread_cond_init(&s->idle, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    WARN("braidStreamCreate : cannot start the stream's thread");
    free(s);
    return ncclSystemError;
  }
  *out = s;
  return ncclSuccess;
}

void stream_destroy(struct braid_stream* s) {
  if (s == NULL) return;
  pthread_mutex_lock(&s->lock);
  s->stopping = 1;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->lock);
  pthread_join(s->thread, NULL);
  while (s->free_items) {
    struct stream_item* it = s->free_items;
    s->free_items = it->next;
    free(it->data);
    free(it);
  }
  s->magic = 0;
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->wake);
  pthread_cond_destroy(&s->idle);
  free(s);
}

/* A reusable item with room for `bytes` of data (called with the lock
 * held). */
static struct stream_item* item_get(struct braid_stream* s, size_t bytes) {
  struct stream_item* it = s->free_items;
  if (it) s->free_items = it->next;
  if (it == NULL && braid_calloc(&it, 1, sizeof(*it)) != ncclSuccess) return NULL;
  if (bytes > it->cap) {
    if (braid_realloc(&it->data, bytes, 1) != ncclSuccess) {
      it->next = s->free_items;
      s->free_items = it;
      return NULL;
    }
    it->cap = bytes;
  }
  it->ngates = 0;
  it->next = NULL;
  return it;
}

static void item_push(struct braid_stream* s, struct stream_item* it) {
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  pthread_cond_signal(&s->wake);
}

ncclResult_t stream_submit(struct braid_stream* s, const struct stream_job* job, const void* data,
                           size_t bytes, const struct gpu_gate* gates, int ngates) {
  pthread_mutex_lock(&s->lock);
  struct stream_item* it = item_get(s, bytes);
  if (it) {
    it->job = job;
    it->bytes = bytes;
    if (bytes) memcpy(it->data, data, bytes);
    if (ngates) memcpy(it->gates, gates, (size_t)ngates * sizeof(*gates));
    it->ngates = ngates;
    item_push(s, it);
  }
  pthread_mutex_unlock(&s->lock);
  if (it == NULL) WARN("Host stream: out of memory queueing a job of %zu bytes", bytes);
  return it ? ncclSuccess : ncclSystemError;
}

/* A function and its argument as a job. */
struct fn_call {
  ncclResult_t (*fn)(void*);
  void* arg;
};

static ncclResult_t fn_call_run(void* data, size_t bytes) {
  struct fn_call* f = data;
  (void)bytes;
  return f->fn(f->arg);
}

static const struct stream_job kFnJob = {fn_call_run, NULL, NULL, NULL};

ncclResult_t stream_submit_fn(struct braid_stream* s, ncclResult_t (*fn)(void*), void* arg) {
  struct fn_call f = {fn, arg};
  return stream_submit(s, &kFnJob, &f, sizeof(f), NULL, 0);
}

/* braidStreamLaunchHostFunc's call as a job: it runs in the stream's order
 * whatever came before it did, told the outcome so far, and changes nothing
 * (its run succeeds; its cancel is the run after an error). */
struct host_call {
  braidHostFn_t fn;
  void* arg;
};

static ncclResult_t host_call_run(void* data, size_t bytes) {
  struct host_call* h = data;
  (void)bytes;
  h->fn(h->arg, ncclSuccess);
  return ncclSuccess;
}

static void host_call_after_error(void* data, size_t bytes, ncclResult_t why) {
  struct host_call* h = data;
  (void)bytes;
  h->fn(h->arg, why);
}

static const struct stream_job kHostCallJob = {host_call_run, host_call_after_error, NULL, NULL};

ncclResult_t stream_sync(struct braid_stream* s) {
  pthread_mutex_lock(&s->lock);
  while (s->head != NULL) pthread_cond_wait(&s->idle, &s->lock);
  ncclResult_t res = s->error;
  pthread_mutex_unlock(&s->lock);
  return res;
}

ncclResult_t stream_query(struct braid_stream* s) {
  pthread_mutex_lock(&s->lock);
  ncclResult_t res = s->error != ncclSuccess ? s->error
                     : s->head != NULL       ? ncclInProgress
                                             : ncclSuccess;
  pthread_mutex_unlock(&s->lock);
  return res;
}

/* ---- braid.h API ---- */

static ncclResult_t stream_arg(cudaStream_t handle, const char* fn, struct braid_stream** s) {
  *s = stream_from_handle(handle);
  if (*s == NULL) {
    WARN("%s : %p is not a stream made by braidStreamCreate", fn, (void*)handle);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

BRAID_API(ncclResult_t, braidStreamCreate, cudaStream_t* stream);
ncclResult_t braidStreamCreate(cudaStream_t* stream) {
  struct braid_stream* s;
  if (stream == NULL) {
    WARN("braidStreamCreate : stream is NULL");
    return ncclInvalidArgument;
  }
  ncclResult_t res = stream_create(&s);
  if (res == ncclSuccess) *stream = stream_handle(s);
  return res;
}

BRAID_API(ncclResult_t, braidStreamDestroy, cudaStream_t stream);
ncclResult_t braidStreamDestroy(cudaStream_t stream) {
  struct braid_stream* s;
  ncclResult_t res = stream_arg(stream, "braidStreamDestroy", &s);
  if (res == ncclSuccess) stream_destroy(s);
  return res;
}

BRAID_API(ncclResult_t, braidStreamSynchronize, cudaStream_t stream);
ncclResult_t braidStreamSynchronize(cudaStream_t stream) {
  struct braid_stream* s;
  ncclResult_t res = stream_arg(stream, "braidStreamSynchronize", &s);
  return res == ncclSuccess ? stream_sync(s) : res;
}

BRAID_API(ncclResult_t, braidStreamQuery, cudaStream_t stream);
ncclResult_t braidStreamQuery(cudaStream_t stream) {
  struct braid_stream* s;
  ncclResult_t res = stream_arg(stream, "braidStreamQuery", &s);
  return res == ncclSuccess ? stream_query(s) : res;
}

BRAID_API(ncclResult_t, braidStreamLaunchHostFunc, cudaStream_t stream, braidHostFn_t fn,
          void* userData);
ncclResult_t braidStreamLaunchHostFunc(cudaStream_t stream, braidHostFn_t fn, void* userData) {
  struct braid_stream* s;
  ncclResult_t res = stream_arg(stream, "braidStreamLaunchHostFunc", &s);
  if (res != ncclSuccess) return res;
  if (fn == NULL) {
    WARN("braidStreamLaunchHostFunc : fn is NULL");
    return ncclInvalidArgument;
  }
  struct host_call h = {fn, userData};
  return stream_submit(s, &kHostCallJob, &h, sizeof(h), NULL, 0);
}
