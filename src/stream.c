/*
 * Host streams. A handle is the stream's address with a tag bit that no
 * CUDA stream pointer carries, so any cudaStream_t argument can be told
 * apart without a lookup. Each stream owns a thread that runs queued items
 * in order; finished items go to a free list and are reused, so steady
 * state enqueueing does not allocate once the item's op array has grown.
 */
#include "stream.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"
#include "comm.h"
#include "core.h"

#define STREAM_TAG ((uintptr_t)4) /* CUDA streams are 8-aligned; 1, 2 are its specials */
#define STREAM_MAGIC 0x6273747265616d21ull

struct stream_item {
  struct work_op* ops;
  int nops, cap;
  struct work_gate gates[WORK_MAX_GATES];
  int ngates;
  ncclResult_t (*fn)(void*);
  void* arg;
  braidHostFn_t host_fn; /* braidStreamLaunchHostFunc: runs whatever came before */
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

static ncclResult_t item_run(struct stream_item* it) {
  return it->fn ? it->fn(it->arg) : work_run(it->ops, it->nops);
}

static int gates_ready(const struct stream_item* it) {
  for (int i = 0; i < it->ngates; i++)
    if ((int64_t)(__atomic_load_n(it->gates[i].ready, __ATOMIC_ACQUIRE) - it->gates[i].value) < 0)
      return 0;
  return 1;
}

static int item_aborted(const struct stream_item* it) {
  for (int i = 0; i < it->nops; i++)
    if (atomic_load(&it->ops[i].comm->aborted)) return 1;
  return 0;
}

/* A gate whose stream can no longer reach it, checked now and then (not at
 * every poll: it asks the driver). */
static ncclResult_t gates_check(const struct stream_item* it) {
  for (int i = 0; i < it->ngates; i++) {
    const struct work_gate* g = &it->gates[i];
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
 * comm is aborted, or when a stream fails (its error goes to the comms). */
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
    if (it->host_fn) { /* told the outcome so far; changes nothing */
      it->host_fn(it->arg, s->error);
      pthread_mutex_lock(&s->lock);
      s->head = it->next;
      if (s->head == NULL) s->tail = NULL;
      it->host_fn = NULL;
      it->next = s->free_items;
      s->free_items = it;
      if (s->head == NULL) pthread_cond_broadcast(&s->idle);
      continue;
    }
    /* after an error the queue drains without running (order is lost), but
     * its units still give up their turns on their comms. A gated unit (a
     * device call) always runs: its comms' own error state decides, so one
     * comm's failure never drops another comm's later calls that share the
     * proxy, and the stream's error stays with host-stream work. */
    int gated = it->ngates > 0, run = gated || s->error == ncclSuccess;
    ncclResult_t res = gated ? gates_wait(it) : ncclSuccess;
    if (res != ncclSuccess) { /* a stream failed: the unit cannot run */
      for (int i = 0; i < it->nops; i++) comm_set_error(it->ops[i].comm, res);
      run = 0;
    }
    res = run ? item_run(it) : res != ncclSuccess ? res : s->error;
    if (!run && it->fn == NULL) work_cancel(it->ops, it->nops);
    gates_open(it);
    pthread_mutex_lock(&s->lock);
    if (s->error == ncclSuccess && !gated) s->error = res;
    s->head = it->next;
    if (s->head == NULL) s->tail = NULL;
    it->fn = NULL;
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
    free(it->ops);
    free(it);
  }
  s->magic = 0;
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->wake);
  pthread_cond_destroy(&s->idle);
  free(s);
}

/* A reusable item with room for n ops (called with the lock held). */
static struct stream_item* item_get(struct braid_stream* s, int n) {
  struct stream_item* it = s->free_items;
  if (it) s->free_items = it->next;
  if (it == NULL && braid_calloc(&it, 1, sizeof(*it)) != ncclSuccess) return NULL;
  if (n > it->cap) {
    if (braid_realloc(&it->ops, (size_t)n, sizeof(*it->ops)) != ncclSuccess) {
      it->next = s->free_items;
      s->free_items = it;
      return NULL;
    }
    it->cap = n;
  }
  it->nops = it->ngates = 0;
  it->fn = NULL;
  it->host_fn = NULL;
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

ncclResult_t stream_submit_ops(struct braid_stream* s, const struct work_op* ops, int n) {
  return stream_submit_gated(s, ops, n, NULL, 0);
}

ncclResult_t stream_submit_gated(struct braid_stream* s, const struct work_op* ops, int n,
                                 const struct work_gate* gates, int ngates) {
  pthread_mutex_lock(&s->lock);
  struct stream_item* it = item_get(s, n);
  if (it) {
    memcpy(it->ops, ops, (size_t)n * sizeof(*ops));
    if (ngates) memcpy(it->gates, gates, (size_t)ngates * sizeof(*gates));
    it->nops = n;
    it->ngates = ngates;
    item_push(s, it);
  }
  pthread_mutex_unlock(&s->lock);
  if (it == NULL) WARN("Host stream: out of memory queueing %d operations", n);
  return it ? ncclSuccess : ncclSystemError;
}

ncclResult_t stream_submit_fn(struct braid_stream* s, ncclResult_t (*fn)(void*), void* arg) {
  pthread_mutex_lock(&s->lock);
  struct stream_item* it = item_get(s, 0);
  if (it) {
    it->fn = fn;
    it->arg = arg;
    item_push(s, it);
  }
  pthread_mutex_unlock(&s->lock);
  if (it == NULL) WARN("Host stream: out of memory queueing a job");
  return it ? ncclSuccess : ncclSystemError;
}

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

static ncclResult_t stream_submit_host_fn(struct braid_stream* s, braidHostFn_t fn, void* arg) {
  pthread_mutex_lock(&s->lock);
  struct stream_item* it = item_get(s, 0);
  if (it) {
    it->host_fn = fn;
    it->arg = arg;
    item_push(s, it);
  }
  pthread_mutex_unlock(&s->lock);
  if (it == NULL) WARN("braidStreamLaunchHostFunc : out of memory queueing a host function");
  return it ? ncclSuccess : ncclSystemError;
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
  return stream_submit_host_fn(s, fn, userData);
}
