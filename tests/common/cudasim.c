/*
 * A simulated CUDA driver for the tests (build/tests/libcudasim.so, never in
 * the library): BRAID_CUDA_LIB points Braid at it where there is no GPU.
 * It resolves, through cuGetProcAddress_v2 as the real driver does, the
 * subset Braid calls:
 *  - devices (CUDASIM_DEVICES, default 1) with 4 SMs; a primary context per
 *    device, current per thread, and required, as by the real driver, for
 *    allocations, copies, module loads and launches;
 *  - device memory that the host cannot touch, as on a GPU (a memfd mapped
 *    without access at the device address, and again where the simulated
 *    GPU reads and writes it; shared, so forked ranks keep it), known to
 *    cuPointerGetAttribute as device memory, not zeroed;
 *  - cuMem: physical allocations (memfds) mapped at reserved ranges in the
 *    same two views, 2 MiB granularity as on the H200; a buffer id per
 *    allocation, never reused in a process;
 *  - IPC between processes: legacy handles name the exporter's memfd
 *    (opened through /proc; refused in the exporting process, as by the
 *    driver), cuMem exports and imports POSIX fds (if requested at create);
 *  - copies (memmove between the GPU's views: unified addressing);
 *  - lazy loading, as the driver's default since CUDA 12.2: a function's
 *    first launch in a context, or cuFuncLoad, first waits for everything
 *    queued on every stream of the process (the driver may synchronize the
 *    context there), so a first launch behind a stream waiting on a flag
 *    that only a later step opens hangs here as it does on a GPU;
 *    CUDA_MODULE_LOADING=EAGER loads at cuModuleGetFunction;
 *  - modules: any image loads, and its functions "braid_reduce_copy" (the
 *    task as parameter) and "braid_reduce_copy_at" (the task read from
 *    device-reachable memory when the launch runs) run the CPU grid
 *    emulation of kernels/cuda/kern_body.h (tests/common); operands that
 *    are neither device nor pinned memory fail the launch (a task read at
 *    run time: the process aborts, as a GPU's fault ends its context);
 *  - streams as ordered queues, each run by a thread of its own (the NULL
 *    stream too): launches, async copies, 64-bit memory-op waits that
 *    really wait and writes, event records and waits. CUDASIM_ONE_QUEUE=1
 *    puts every stream on one queue, which exposes work that only completes
 *    if streams run side by side (an ordering deadlock hangs there);
 *  - pinned host memory (cuMemHostAlloc, cuMemHostRegister: host memory,
 *    its device pointer the same address); a launch whose operands are
 *    neither device nor pinned memory fails, as a GPU faults;
 *  - knobs for the tests: CUDASIM_ONE_QUEUE (above), CUDASIM_CAPTURING=all
 *    (every stream is being captured), CUDASIM_STREAM_ERROR (stream queries
 *    report a broken context), CUDASIM_HIDE=name (that entry point is
 *    missing, as from an older driver), CUDASIM_NO_EXPORT (cuMem exports
 *    fail from then on), CUDASIM_NO_IMPORT (cuMem imports fail),
 *    CUDASIM_NO_REGISTER (cuMemHostRegister fails), CUDASIM_VISIBLE=list
 *    (the physical devices behind the ordinals: their UUIDs).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include "cudasim.h"
#include "kern_emulate.h"

#define SIM_EXPORT __attribute__((visibility("default")))
#define SIM_SMS 4

/* Legacy-stream operations (cuMemcpy) under way: numbered when they start
 * and when they end, so work queued meanwhile on a blocking stream waits. */
static _Atomic uint64_t g_legacy_started, g_legacy_ended;

__thread CUcontext t_ctx;
int g_ndev = 1;

/* Contexts and functions are small tagged integers, never dereferenced. */
#define SIM_CTX(dev) ((CUcontext)(uintptr_t)(0x1000 + (dev)))
#define SIM_MODULE ((CUmodule)(uintptr_t)0x2000)
#define SIM_REDUCE_COPY ((CUfunction)(uintptr_t)0x3001)
#define SIM_REDUCE_COPY_AT ((CUfunction)(uintptr_t)0x3002)

static CUresult sim_init(unsigned flags) {
  const char* n = getenv("CUDASIM_DEVICES");
  (void)flags;
  g_ndev = n ? atoi(n) : 1;
  return CUDA_SUCCESS;
}

static CUresult sim_driver_version(int* v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

static CUresult sim_error_name(CUresult r, const char** s) {
  switch (r) {
    case CUDA_SUCCESS:
      *s = "CUDA_SUCCESS";
      break;
    case CUDA_ERROR_INVALID_VALUE:
      *s = "CUDA_ERROR_INVALID_VALUE";
      break;
    case CUDA_ERROR_OUT_OF_MEMORY:
      *s = "CUDA_ERROR_OUT_OF_MEMORY";
      break;
    case CUDA_ERROR_NOT_FOUND:
      *s = "CUDA_ERROR_NOT_FOUND";
      break;
    case CUDA_ERROR_ILLEGAL_ADDRESS:
      *s = "CUDA_ERROR_ILLEGAL_ADDRESS";
      break;
    case CUDA_ERROR_NOT_PERMITTED:
      *s = "CUDA_ERROR_NOT_PERMITTED";
      break;
    case CUDA_ERROR_INVALID_CONTEXT:
      *s = "CUDA_ERROR_INVALID_CONTEXT";
      break;
    default:
      *s = "CUDA_ERROR_UNKNOWN";
      break;
  }
  return CUDA_SUCCESS;
}

static CUresult sim_device_count(int* n) {
  *n = g_ndev;
  return CUDA_SUCCESS;
}

static CUresult sim_device_get(CUdevice* d, int ordinal) {
  if (ordinal < 0 || ordinal >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

/* A device's UUID names its physical device: the ordinal, or what
 * CUDASIM_VISIBLE maps it to (a comma list of physical numbers, as
 * CUDA_VISIBLE_DEVICES renumbers a process's devices). */
static CUresult sim_device_uuid(CUuuid* id, CUdevice d) {
  const char* visible = getenv("CUDASIM_VISIBLE");
  int physical = d;
  if (d < 0 || d >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  for (int i = 0; visible && i < d; i++)
    visible = strchr(visible, ',') ? strchr(visible, ',') + 1 : NULL;
  if (visible) physical = atoi(visible);
  memset(id, 0, sizeof(*id));
  snprintf(id->bytes, sizeof(id->bytes), "cudasim-gpu%d", physical);
  return CUDA_SUCCESS;
}

static CUresult sim_device_attribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (d < 0 || d >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
      *v = SIM_SMS;
      break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
      *v = 1;
      break;
    default:
      *v = 0;
      break;
  }
  return CUDA_SUCCESS;
}

static CUresult sim_primary_retain(CUcontext* c, CUdevice d) {
  if (d < 0 || d >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  *c = SIM_CTX(d);
  return CUDA_SUCCESS;
}

static CUresult sim_primary_release(CUdevice d) {
  return d < 0 || d >= g_ndev ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

static CUresult sim_ctx_get(CUcontext* c) {
  *c = t_ctx;
  return CUDA_SUCCESS;
}

static CUresult sim_ctx_device(CUdevice* d) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  *d = (CUdevice)((uintptr_t)t_ctx - 0x1000);
  return CUDA_SUCCESS;
}

/* CUDA 13.0's cuCtxGetDevice_v2: what cuGetProcAddress("cuCtxGetDevice")
 * returns to a caller asking at version 13000 or later, as the real driver
 * does. A caller that declared the 12.x signature passes no context: its
 * garbage crashed the real driver, so here it stops the process. */
static CUresult sim_ctx_device_v2(CUdevice* d, CUcontext c) {
  if (c == NULL) return sim_ctx_device(d);
  if ((uintptr_t)c < 0x1000 || (uintptr_t)c >= 0x1000 + (uintptr_t)g_ndev) {
    fprintf(stderr,
            "cudasim: cuCtxGetDevice_v2 called with context %p: the caller asked for the "
            "13.0 entry point with the 12.x signature\n",
            (void*)c);
    abort();
  }
  *d = (CUdevice)((uintptr_t)c - 0x1000);
  return CUDA_SUCCESS;
}

static CUresult sim_ctx_set(CUcontext c) {
  t_ctx = c;
  return CUDA_SUCCESS;
}

static CUresult sim_stream_sync(CUstream s);

static void legacy_sync(void);

/* Synchronous, on the legacy NULL stream: after its work and the work
 * already queued on every blocking stream, as the driver does it. A caller
 * that holds back work one of those streams waits for deadlocks here, as
 * it would on a GPU. */
static CUresult sim_memcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  atomic_fetch_add(&g_legacy_started, 1);
  legacy_sync();
  memmove(gpu_addr(dst), gpu_addr(src), bytes);
  atomic_fetch_add(&g_legacy_ended, 1);
  return CUDA_SUCCESS;
}

/* ---- streams ---- */

enum sim_op_kind {
  OP_LAUNCH,
  OP_LAUNCH_AT, /* the task is read at `src` when the op runs */
  OP_COPY,
  OP_WAIT64,
  OP_WRITE64,
  OP_RECORD,
  OP_WAIT_EVENT,
  OP_WAIT_LEGACY /* a blocking stream's work after a legacy-stream operation waits for it */
};

struct sim_event {
  _Atomic uint64_t recorded; /* records enqueued so far */
  _Atomic uint64_t reached;  /* records the streams have passed */
};

struct sim_op {
  enum sim_op_kind kind;
  struct kern_dev_task task;
  unsigned grid, block;
  void* dst;
  const void* src;
  size_t bytes;
  volatile uint64_t* addr;
  uint64_t value;
  unsigned flags;
  struct sim_event* event;
  uint64_t ticket; /* OP_RECORD: this record's number; OP_WAIT_EVENT: the one awaited */
  struct sim_op* next;
};

struct sim_stream {
  pthread_mutex_t lock;
  pthread_cond_t cv;
  struct sim_op *head, *tail;
  int running;                /* an op is being executed */
  int blocking;               /* made without CU_STREAM_NON_BLOCKING */
  uint64_t pushed, completed; /* ops queued and run so far (under lock) */
  pthread_t thread;
};

static struct sim_stream* g_null_stream; /* the NULL stream, and every stream under ONE_QUEUE */
struct sim_handle {
  struct sim_stream* queue;
};
/* Every handle made, so that leak checkers see them reachable: a stream
 * lives as long as the process (its thread stays, see sim_stream_destroy).
 * A slot is published with a release store after its count was taken: a
 * reader on another thread (context_synchronize) may find it still empty,
 * never half written. */
static struct sim_handle* _Atomic g_handles[1024];
static _Atomic int g_nhandles;
/* Streams made without CU_STREAM_NON_BLOCKING: the legacy NULL stream waits
 * for all of them (and they for it), as the driver's do. */
#define SIM_MAX_STREAMS 1024
static struct sim_stream* _Atomic g_blocking[SIM_MAX_STREAMS]; /* as g_handles */
static _Atomic int g_nblocking;
static pthread_once_t g_streams_once = PTHREAD_ONCE_INIT;
static int g_one_queue;

static void nap(void) {
  struct timespec ts = {0, 20000};
  nanosleep(&ts, NULL);
}

static int wait_done(const struct sim_op* op) {
  uint64_t v = __atomic_load_n(op->addr, __ATOMIC_ACQUIRE); /* the host wrote before its flag */
  switch (op->flags & 0xf) {
    case CU_STREAM_WAIT_VALUE_GEQ:
      return (int64_t)(v - op->value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
      return v == op->value;
    case CU_STREAM_WAIT_VALUE_AND:
      return (v & op->value) != 0;
    default:
      return ~(v | op->value) != 0;
  }
}

/* A kernel's operands must be device or pinned memory: a GPU faults on
 * pageable host memory (the stderr line names the pointer). */
static int operand_reachable(const void* p, size_t bytes) {
  if (gpu_reaches((uintptr_t)p, bytes)) return 1;
  fprintf(stderr, "cudasim: kernel operand %p (%zu bytes) is neither device nor pinned\n", p,
          bytes);
  return 0;
}

/* Whether row operand p translates as the first row's, `base`: the GPU's
 * address space is flat, but the simulation translates the first row's
 * pointers only, so a row in another allocation would land elsewhere. */
static int row_translates(const void* base, const void* p) {
  intptr_t moved = (intptr_t)gpu_addr((uintptr_t)p) - (intptr_t)gpu_addr((uintptr_t)base);
  if (moved == (intptr_t)p - (intptr_t)base) return 1;
  fprintf(stderr, "cudasim: kernel operand %p is not in the allocation of its first row %p\n", p,
          base);
  return 0;
}

/* A table of `rows` entries the kernel reads (device or pinned memory),
 * where the simulated GPU reads it; NULL stays NULL. */
static const int32_t* table_view(const int32_t* at, uint32_t rows, int* ok) {
  if (at == NULL) return NULL;
  if (!operand_reachable(at, (size_t)rows * sizeof(int32_t))) {
    *ok = 0;
    return NULL;
  }
  return gpu_addr((uintptr_t)at);
}

/* The first `rows` rows of every operand: device or pinned memory, each
 * in the allocation of the pointer it comes from (a spread row's, its
 * own), the rows' tables too. */
static int task_reachable(const struct kern_dev_task* t, uint32_t rows) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  size_t bytes = t->type >= 0 && t->type < 12 ? (size_t)t->n * sizes[t->type] : 0;
  struct kern_dev_task view = *t, row;
  int ok = 1;
  view.src_at = table_view(t->src_at, rows, &ok);
  view.dst_at = table_view(t->dst_at, rows, &ok);
  for (uint32_t r = 0; r < rows && ok; r++) {
    if (!kern_dev_task_row(&view, r, &row)) continue;
    int nsrcs = row.nsrcs < KB_MAX_SRCS ? row.nsrcs : KB_MAX_SRCS;
    int ndsts = row.ndsts < KB_MAX_DSTS ? row.ndsts : KB_MAX_DSTS;
    for (int i = 0; i < nsrcs && ok; i++) {
      const void* from = t->srcs[(t->spread & KB_SPREAD_SRCS) ? r : (uint32_t)i];
      ok = operand_reachable(row.srcs[i], bytes) && row_translates(from, row.srcs[i]);
    }
    for (int i = 0; i < ndsts && ok; i++) {
      const void* from = t->dsts[(t->spread & KB_SPREAD_DSTS) ? r : (uint32_t)i];
      ok = operand_reachable(row.dsts[i], bytes) && row_translates(from, row.dsts[i]);
    }
  }
  return ok;
}

/* The task as the simulated GPU addresses its operands. */
static void task_to_gpu(struct kern_dev_task* t) {
  if (t->src_at) t->src_at = gpu_addr((uintptr_t)t->src_at);
  if (t->dst_at) t->dst_at = gpu_addr((uintptr_t)t->dst_at);
  for (int i = 0; i < t->nsrcs && i < KB_MAX_SRCS; i++)
    t->srcs[i] = gpu_addr((uintptr_t)t->srcs[i]);
  for (int i = 0; i < t->ndsts && i < KB_MAX_DSTS; i++)
    t->dsts[i] = gpu_addr((uintptr_t)t->dsts[i]);
}

/* A task read when its launch runs: a GPU faults on a bad operand there,
 * and the context is lost (here, the process). */
static void launch_at_run(struct sim_op* op) {
  struct kern_dev_task t;
  memset(&t, 0, sizeof(t)); /* what gcc cannot see the word-by-word load fill */
  kern_dev_task_load(&t, op->src);
  if (t.n == 0) return;
  if (!task_reachable(&t, kern_dev_task_rows(&t))) {
    fprintf(stderr, "cudasim: braid_reduce_copy_at faulted: the context is lost\n");
    abort();
  }
  task_to_gpu(&t);
  kern_emulate_reduce_copy_at(&t, op->grid, op->block);
}

static void op_run(struct sim_op* op) {
  switch (op->kind) {
    case OP_LAUNCH:
      kern_emulate_reduce_copy(&op->task, op->grid, op->block);
      break;
    case OP_LAUNCH_AT:
      launch_at_run(op);
      break;
    case OP_COPY:
      memmove(op->dst, op->src, op->bytes);
      break;
    case OP_WAIT64:
      while (!wait_done(op)) nap(); /* really waits, as the GPU's front end does */
      break;
    case OP_WRITE64:
      __atomic_store_n(op->addr, op->value, __ATOMIC_SEQ_CST);
      break;
    case OP_RECORD:
      atomic_store(&op->event->reached, op->ticket);
      break;
    case OP_WAIT_EVENT:
      while (atomic_load(&op->event->reached) < op->ticket) nap();
      break;
    case OP_WAIT_LEGACY:
      while (atomic_load(&g_legacy_ended) < op->ticket) nap();
      break;
  }
}

static void* stream_main(void* p) {
  struct sim_stream* st = p;
  for (;;) {
    pthread_mutex_lock(&st->lock);
    while (st->head == NULL) pthread_cond_wait(&st->cv, &st->lock);
    struct sim_op* op = st->head;
    st->running = 1;
    pthread_mutex_unlock(&st->lock);
    op_run(op);
    pthread_mutex_lock(&st->lock);
    st->head = op->next;
    if (st->head == NULL) st->tail = NULL;
    st->running = 0;
    st->completed++;
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->lock);
    free(op);
  }
  return NULL;
}

static struct sim_stream* stream_new(void) {
  struct sim_stream* st = calloc(1, sizeof(*st));
  if (st == NULL) return NULL;
  pthread_mutex_init(&st->lock, NULL);
  pthread_cond_init(&st->cv, NULL);
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&st->thread, &a, stream_main, st) != 0) {
    free(st);
    st = NULL;
  }
  pthread_attr_destroy(&a);
  return st;
}

static void streams_init(void) {
  const char* one = getenv("CUDASIM_ONE_QUEUE");
  g_one_queue = one != NULL && atoi(one) != 0;
  g_null_stream = stream_new();
}

static struct sim_stream* stream_of(CUstream s) {
  pthread_once(&g_streams_once, streams_init);
  /* the legacy and per-thread default streams run on the NULL stream's queue */
  if (s == NULL || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return g_null_stream;
  return ((struct sim_handle*)s)->queue;
}

/* Append op to st's queue and wake its thread. */
static void queue_append(struct sim_stream* st, struct sim_op* op) {
  op->next = NULL;
  pthread_mutex_lock(&st->lock);
  st->pushed++;
  if (st->tail)
    st->tail->next = op;
  else
    st->head = op;
  st->tail = op;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->lock);
}

/* A blocking stream's next work waits for legacy operations under way. */
static CUresult legacy_fence(struct sim_stream* st) {
  uint64_t started = atomic_load(&g_legacy_started);
  if (!st->blocking || started == atomic_load(&g_legacy_ended)) return CUDA_SUCCESS;
  struct sim_op* op = calloc(1, sizeof(*op));
  if (op == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  op->kind = OP_WAIT_LEGACY;
  op->ticket = started;
  queue_append(st, op);
  return CUDA_SUCCESS;
}

static CUresult stream_push(CUstream s, const struct sim_op* proto) {
  struct sim_stream* st = stream_of(s);
  struct sim_op* op = malloc(sizeof(*op));
  if (st == NULL || op == NULL || legacy_fence(st) != CUDA_SUCCESS) {
    free(op);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *op = *proto;
  queue_append(st, op);
  return CUDA_SUCCESS;
}

/* A stream handle: its own identity, and the queue that runs its work (the
 * shared one under CUDASIM_ONE_QUEUE, where streams stay distinct to their
 * users while their work is serialized). */
static CUresult sim_stream_create(CUstream* s, unsigned flags) {
  pthread_once(&g_streams_once, streams_init);
  struct sim_handle* h = calloc(1, sizeof(*h));
  struct sim_stream* st = g_one_queue ? g_null_stream : stream_new();
  if (st == NULL || h == NULL) {
    free(h);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  h->queue = st;
  int slot = atomic_fetch_add(&g_nhandles, 1);
  if (slot < SIM_MAX_STREAMS) atomic_store_explicit(&g_handles[slot], h, memory_order_release);
  if (!g_one_queue && !(flags & CU_STREAM_NON_BLOCKING)) {
    st->blocking = 1;
    int i = atomic_fetch_add(&g_nblocking, 1);
    if (i < SIM_MAX_STREAMS) atomic_store_explicit(&g_blocking[i], st, memory_order_release);
  }
  *s = (CUstream)h;
  return CUDA_SUCCESS;
}

/* A stream's thread stays (detached, idle): work already queued still
 * completes, as the driver promises for a destroyed stream. */
static CUresult sim_stream_destroy(CUstream s) {
  (void)s;
  return CUDA_SUCCESS;
}

/* No graphs here: nothing is ever captured, unless CUDASIM_CAPTURING names
 * streams as being captured ("all"), for the library's refusal. */
static CUresult sim_stream_capturing(CUstream s, CUstreamCaptureStatus* status) {
  const char* all = getenv("CUDASIM_CAPTURING");
  (void)s;
  *status = all && strcmp(all, "all") == 0 ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                           : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

/* A stream's unique id: its handle's (handles are never freed here, so
 * never reused); the NULL stream is 0, the per-thread one differs per thread. */
static CUresult sim_stream_id(CUstream s, unsigned long long* id) {
  static __thread char per_thread;
  *id = s == CU_STREAM_PER_THREAD ? (unsigned long long)(uintptr_t)&per_thread
                                  : (unsigned long long)(uintptr_t)s;
  return CUDA_SUCCESS;
}

static CUresult sim_capture_mode(CUstreamCaptureMode* mode) {
  static __thread CUstreamCaptureMode current = CU_STREAM_CAPTURE_MODE_GLOBAL;
  CUstreamCaptureMode old = current;
  current = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

/* Every simulated device reaches every other's memory (as on one NVLink
 * board). */
static CUresult sim_can_access_peer(int* can, CUdevice d, CUdevice peer) {
  if (d < 0 || d >= g_ndev || peer < 0 || peer >= g_ndev) return CUDA_ERROR_INVALID_DEVICE;
  *can = d != peer;
  return CUDA_SUCCESS;
}

static CUresult sim_stream_query(CUstream s) {
  if (getenv("CUDASIM_STREAM_ERROR")) return CUDA_ERROR_ILLEGAL_ADDRESS; /* a broken context */
  struct sim_stream* st = stream_of(s);
  pthread_mutex_lock(&st->lock);
  int idle = st->head == NULL;
  pthread_mutex_unlock(&st->lock);
  return idle ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult sim_stream_wait64(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned flags) {
  struct sim_op op = {.kind = OP_WAIT64, .addr = gpu_addr(addr), .value = value, .flags = flags};
  return stream_push(s, &op);
}

static CUresult sim_stream_write64(CUstream s, CUdeviceptr addr, cuuint64_t value, unsigned flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE; /* as the H200's driver answered */
  struct sim_op op = {.kind = OP_WRITE64, .addr = gpu_addr(addr), .value = value};
  return stream_push(s, &op);
}

static CUresult sim_event_create(CUevent* e, unsigned flags) {
  (void)flags;
  struct sim_event* ev = calloc(1, sizeof(*ev));
  if (ev == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
  *e = (CUevent)ev;
  return CUDA_SUCCESS;
}

static CUresult sim_event_destroy(CUevent e) {
  free((struct sim_event*)e); /* callers destroy events no stream still holds */
  return CUDA_SUCCESS;
}

static CUresult sim_event_record(CUevent e, CUstream s) {
  struct sim_event* ev = (struct sim_event*)e;
  struct sim_op op = {
      .kind = OP_RECORD, .event = ev, .ticket = atomic_fetch_add(&ev->recorded, 1) + 1};
  return stream_push(s, &op);
}

static CUresult sim_event_query(CUevent e) {
  struct sim_event* ev = (struct sim_event*)e;
  return atomic_load(&ev->reached) >= atomic_load(&ev->recorded) ? CUDA_SUCCESS
                                                                 : CUDA_ERROR_NOT_READY;
}

static CUresult sim_event_sync(CUevent e) {
  while (sim_event_query(e) == CUDA_ERROR_NOT_READY) nap();
  return CUDA_SUCCESS;
}

static CUresult sim_stream_wait_event(CUstream s, CUevent e, unsigned flags) {
  struct sim_event* ev = (struct sim_event*)e;
  (void)flags;
  struct sim_op op = {.kind = OP_WAIT_EVENT, .event = ev, .ticket = atomic_load(&ev->recorded)};
  return stream_push(s, &op);
}

static CUresult sim_memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  struct sim_op op = {.kind = OP_COPY, .dst = gpu_addr(dst), .src = gpu_addr(src), .bytes = bytes};
  return stream_push(s, &op);
}

static _Atomic int* fn_loaded_flag(CUfunction f);

static CUresult sim_module_load(CUmodule* m, const void* image) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (image == NULL) return CUDA_ERROR_INVALID_VALUE;
  *m = SIM_MODULE;
  return CUDA_SUCCESS;
}

static CUresult sim_module_function(CUfunction* f, CUmodule m, const char* name) {
  if (m != SIM_MODULE) return CUDA_ERROR_NOT_FOUND;
  if (strcmp(name, "braid_reduce_copy") == 0)
    *f = SIM_REDUCE_COPY;
  else if (strcmp(name, "braid_reduce_copy_at") == 0)
    *f = SIM_REDUCE_COPY_AT;
  else
    return CUDA_ERROR_NOT_FOUND;
  const char* mode = getenv("CUDA_MODULE_LOADING");
  if (mode && strcmp(mode, "EAGER") == 0) atomic_store(fn_loaded_flag(*f), 1);
  return CUDA_SUCCESS;
}

/* Lazy loading: whether each of the two functions is loaded, per device's
 * context. */
#define SIM_MAX_LOADED_DEVICES 16
static _Atomic int g_fn_loaded[SIM_MAX_LOADED_DEVICES][2];

static void stream_wait_pushed(struct sim_stream* st);

/* What the driver may do to finish a lazy load: wait for every stream's
 * queued work (the NULL stream's and every handle's). */
static void context_synchronize(void) {
  int n = atomic_load(&g_nhandles);
  stream_wait_pushed(stream_of(NULL));
  for (int i = 0; i < n && i < SIM_MAX_STREAMS; i++) {
    struct sim_handle* h = atomic_load_explicit(&g_handles[i], memory_order_acquire);
    if (h) stream_wait_pushed(h->queue);
  }
}

static _Atomic int* fn_loaded_flag(CUfunction f) {
  unsigned dev = (unsigned)((uintptr_t)t_ctx - 0x1000);
  if (dev >= SIM_MAX_LOADED_DEVICES) dev = 0;
  return &g_fn_loaded[dev][f == SIM_REDUCE_COPY_AT];
}

static void fn_finish_load(CUfunction f) {
  _Atomic int* loaded = fn_loaded_flag(f);
  if (atomic_load(loaded)) return;
  context_synchronize();
  atomic_store(loaded, 1);
}

static CUresult sim_func_load(CUfunction f) {
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if (f != SIM_REDUCE_COPY && f != SIM_REDUCE_COPY_AT) return CUDA_ERROR_INVALID_HANDLE;
  fn_finish_load(f);
  return CUDA_SUCCESS;
}

static CUresult sim_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                           unsigned by, unsigned bz, unsigned shmem, CUstream s, void** args,
                           void** extra) {
  (void)shmem, (void)extra;
  if (t_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  if ((f != SIM_REDUCE_COPY && f != SIM_REDUCE_COPY_AT) || gy != 1 || gz != 1 || by != 1 ||
      bz != 1 || args == NULL)
    return CUDA_ERROR_INVALID_VALUE;
  fn_finish_load(f);
  struct sim_op op = {.kind = OP_LAUNCH, .grid = gx, .block = bx};
  if (f == SIM_REDUCE_COPY_AT) {
    CUdeviceptr at;
    memcpy(&at, args[0], sizeof(at));
    if (!gpu_reaches(at, sizeof(struct kern_dev_task))) return CUDA_ERROR_ILLEGAL_ADDRESS;
    op.kind = OP_LAUNCH_AT;
    op.src = gpu_addr(at);
    return stream_push(s, &op);
  }
  memcpy(&op.task, args[0], sizeof(op.task)); /* parameters are taken at the launch */
  if (op.task.rows > 1 || op.task.src_at || op.task.dst_at || op.task.spread) {
    /* reduce.cu runs the task as is: one row */
    fprintf(stderr, "cudasim: braid_reduce_copy given rows\n");
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!task_reachable(&op.task, 1)) return CUDA_ERROR_ILLEGAL_ADDRESS; /* it runs one row */
  task_to_gpu(&op.task);
  return stream_push(s, &op);
}

/* The legacy stream's implicit synchronization: what is queued now on the
 * NULL stream and on every blocking stream completes first. */
static void stream_wait_pushed(struct sim_stream* st) {
  pthread_mutex_lock(&st->lock);
  uint64_t upto = st->pushed; /* not what others queue meanwhile: that waits for us */
  while (st->completed < upto) pthread_cond_wait(&st->cv, &st->lock);
  pthread_mutex_unlock(&st->lock);
}

static void legacy_sync(void) {
  int n = atomic_load(&g_nblocking);
  stream_wait_pushed(stream_of(NULL));
  for (int i = 0; i < n && i < SIM_MAX_STREAMS; i++) {
    struct sim_stream* st = atomic_load_explicit(&g_blocking[i], memory_order_acquire);
    if (st) stream_wait_pushed(st);
  }
}

static CUresult sim_stream_sync(CUstream s) {
  struct sim_stream* st = stream_of(s);
  pthread_mutex_lock(&st->lock);
  while (st->head != NULL) pthread_cond_wait(&st->cv, &st->lock);
  pthread_mutex_unlock(&st->lock);
  return CUDA_SUCCESS;
}

static const struct {
  const char* name;
  void* fn;
} k_entry_points[] = {
    {"cuInit", (void*)sim_init},
    {"cuDriverGetVersion", (void*)sim_driver_version},
    {"cuGetErrorName", (void*)sim_error_name},
    {"cuDeviceGetCount", (void*)sim_device_count},
    {"cuDeviceGet", (void*)sim_device_get},
    {"cuDeviceGetAttribute", (void*)sim_device_attribute},
    {"cuDeviceGetUuid", (void*)sim_device_uuid},
    {"cuDevicePrimaryCtxRetain", (void*)sim_primary_retain},
    {"cuDevicePrimaryCtxRelease", (void*)sim_primary_release},
    {"cuCtxGetCurrent", (void*)sim_ctx_get},
    {"cuCtxGetDevice", (void*)sim_ctx_device},
    {"cuCtxSetCurrent", (void*)sim_ctx_set},
    {"cuPointerGetAttribute", (void*)sim_pointer_attribute},
    {"cuMemcpy", (void*)sim_memcpy},
    {"cuMemAlloc", (void*)sim_mem_alloc},
    {"cuMemFree", (void*)sim_mem_free},
    {"cuModuleLoadData", (void*)sim_module_load},
    {"cuModuleGetFunction", (void*)sim_module_function},
    {"cuLaunchKernel", (void*)sim_launch},
    {"cuFuncLoad", (void*)sim_func_load},
    {"cuStreamSynchronize", (void*)sim_stream_sync},
    {"cuStreamCreate", (void*)sim_stream_create},
    {"cuStreamDestroy", (void*)sim_stream_destroy},
    {"cuStreamQuery", (void*)sim_stream_query},
    {"cuStreamIsCapturing", (void*)sim_stream_capturing},
    {"cuStreamGetId", (void*)sim_stream_id},
    {"cuThreadExchangeStreamCaptureMode", (void*)sim_capture_mode},
    {"cuDeviceCanAccessPeer", (void*)sim_can_access_peer},
    {"cuStreamWaitValue64", (void*)sim_stream_wait64},
    {"cuStreamWriteValue64", (void*)sim_stream_write64},
    {"cuStreamWaitEvent", (void*)sim_stream_wait_event},
    {"cuEventCreate", (void*)sim_event_create},
    {"cuEventDestroy", (void*)sim_event_destroy},
    {"cuEventRecord", (void*)sim_event_record},
    {"cuEventQuery", (void*)sim_event_query},
    {"cuEventSynchronize", (void*)sim_event_sync},
    {"cuMemcpyAsync", (void*)sim_memcpy_async},
    {"cuMemHostAlloc", (void*)sim_host_alloc},
    {"cuMemFreeHost", (void*)sim_host_free},
    {"cuMemHostGetDevicePointer", (void*)sim_host_device_pointer},
    {"cuMemHostRegister", (void*)sim_host_register},
    {"cuMemHostUnregister", (void*)sim_host_unregister},
    {"cuMemGetAllocationGranularity", (void*)sim_vmm_granularity},
    {"cuMemCreate", (void*)sim_vmm_create},
    {"cuMemRelease", (void*)sim_vmm_release},
    {"cuMemAddressReserve", (void*)sim_vmm_reserve},
    {"cuMemAddressFree", (void*)sim_vmm_address_free},
    {"cuMemMap", (void*)sim_vmm_map},
    {"cuMemUnmap", (void*)sim_vmm_unmap},
    {"cuMemSetAccess", (void*)sim_vmm_set_access},
    {"cuMemRetainAllocationHandle", (void*)sim_vmm_retain},
    {"cuMemGetAddressRange", (void*)sim_address_range},
    {"cuIpcGetMemHandle", (void*)sim_ipc_get},
    {"cuIpcOpenMemHandle", (void*)sim_ipc_open},
    {"cuIpcCloseMemHandle", (void*)sim_ipc_close},
    {"cuMemExportToShareableHandle", (void*)sim_vmm_export},
    {"cuMemImportFromShareableHandle", (void*)sim_vmm_import},
};

SIM_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                        cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  (void)flags;
  const char* hide = getenv("CUDASIM_HIDE"); /* an older driver, without this entry point */
  if (hide && strcmp(hide, symbol) == 0) {
    *pfn = NULL;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  if (strcmp(symbol, "cuCtxGetDevice") == 0 && version >= 13000) { /* the ABI changed in 13.0 */
    *pfn = (void*)sim_ctx_device_v2;
    if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < sizeof(k_entry_points) / sizeof(k_entry_points[0]); i++)
    if (strcmp(symbol, k_entry_points[i].name) == 0) {
      *pfn = k_entry_points[i].fn;
      if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
      return CUDA_SUCCESS;
    }
  *pfn = NULL;
  if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_ERROR_NOT_FOUND;
}
