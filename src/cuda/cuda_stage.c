/*
 * Pinned mirrors of device buffers (cuda_stage.h).
 */
#include "cuda_stage.h"

#include <stdlib.h>
#include <time.h>

#include "comm/comm.h"
#include "device_comm.h"
#include "core.h"
#include "kernels.h"
#include "engine/mem.h"

#define STAGE_ALIGN 256 /* every span starts on a boundary the copy engines like */

/* A device range a call touches, and its place in the mirror. */
struct stage_span {
  CUdeviceptr dev;
  char* host;
  size_t bytes;
  int in, out; /* copied in before / out after the call */
};

struct old_block {
  void* host;
  struct old_block* next;
};

struct cuda_mirror {
  unsigned long long stream_id; /* the key: a handle can name another stream later */
  CUstream stream;
  char* host; /* pinned */
  size_t cap;
  /* the stream writes *passed = n once past the n-th call's copy-out (and
   * so past its gate): until then the mirror and the gates may not be freed */
  uint64_t* passed; /* pinned, device-mapped */
  CUdeviceptr passed_dev;
  uint64_t issued;
  struct old_block* old;    /* outgrown blocks, freed with the comm */
  struct stage_span* spans; /* of the call being staged */
  int nspans, cap_spans;
  struct cuda_mirror* next;
};

static int is_device(const void* p) {
  return p != NULL && mem_query(p) != MEM_HOST;
}

/* The spans of one collective: what it reads of sendbuff and writes of
 * recvbuff on this rank. In place, one range holds the other (all-gather's
 * send block inside recvbuff, reduce-scatter's recv block inside
 * sendbuff): one span, their union, copied in and out whole. */
static void coll_uses(const struct work_op* op, int* reads, int* writes) {
  const struct exec_args* a = &op->args;
  *reads = sched_coll_reads_send(a->coll, op->comm->rank, a->root);
  *writes = sched_coll_writes_recv(a->coll, op->comm->rank, a->root);
}

static int coll_spans(const struct work_op* op, struct stage_span* sp) {
  const struct exec_args* a = &op->args;
  int nranks = op->comm->nranks, m = 0, reads, writes;
  size_t es = kern_type_size(a->type), block = a->count * es;
  size_t sbytes = a->coll == COLL_REDUCESCATTER ? block * (size_t)nranks : block;
  size_t rbytes = a->coll == COLL_ALLGATHER ? block * (size_t)nranks : block;
  coll_uses(op, &reads, &writes);
  uintptr_t s = (uintptr_t)a->sendbuff, r = (uintptr_t)a->recvbuff;
  if (block == 0) return 0;
  if (reads && writes && s < r + rbytes && r < s + sbytes) {
    uintptr_t lo = MIN(s, r), hi = MAX(s + sbytes, r + rbytes);
    if (is_device(a->recvbuff)) sp[m++] = (struct stage_span){lo, NULL, hi - lo, 1, 1};
    return m;
  }
  if (writes && is_device(a->recvbuff)) sp[m++] = (struct stage_span){r, NULL, rbytes, 0, 1};
  if (reads && is_device(a->sendbuff)) sp[m++] = (struct stage_span){s, NULL, sbytes, 1, 0};
  return m;
}

/* A device-resident PreMulSum scalar is staged like an input. */
static int scalar_span(const struct work_op* op, struct stage_span* sp) {
  const void* p = op->args.scalar_src;
  if (!is_device(p)) return 0;
  *sp = (struct stage_span){(uintptr_t)p, NULL, kern_type_size(op->args.type), 1, 0};
  return 1;
}

/* Whether a collective runs on the device where its buffers are: direct,
 * or on the device backend:
 * not with `colls` (everything staged), not without a backend (its setup
 * failed), nor when a buffer it uses is host memory (kernels cannot read
 * pageable memory; the device ones are staged and it runs on the host). */
static int coll_stays(const struct work_op* op, int colls) {
  int reads, writes;
  if (op->direct) return 1;        /* its kernels read and write the buffers (cuda_direct.h) */
  if (op->args.no_tasks) return 1; /* a network moves them as they are (cuda_unit.c) */
  coll_uses(op, &reads, &writes);
  return !colls && op->comm->exec.dev_backend != NULL && op->args.mem != MEM_HOST &&
         (!reads || is_device(op->args.sendbuff)) && (!writes || is_device(op->args.recvbuff));
}

/* A collective's buffers are staged unless it stays on the device (then
 * only its scalar is: work.c reads it on the host). */
static int op_spans(const struct work_op* op, int colls, struct stage_span* sp) {
  if (op->kind == WORK_COLL) {
    int m = coll_stays(op, colls) ? 0 : coll_spans(op, sp);
    return m + scalar_span(op, sp + m);
  }
  if (op->bytes == 0 || !is_device(op->buf) || op->ipc) return 0; /* ipc: device to device */
  sp[0] = (struct stage_span){(uintptr_t)op->buf, NULL, op->bytes, op->kind == WORK_SEND,
                              op->kind == WORK_RECV};
  return 1;
}

static ncclResult_t mirror_new(CUstream stream, const struct cuda_api* cu,
                               struct cuda_mirror** out) {
  ncclResult_t res = ncclSuccess;
  struct cuda_mirror* m = NULL;
  void* flag = NULL;
  CHECK(braid_calloc(&m, 1, sizeof(*m)));
  CHECK(cuda_flags_alloc(cu, 64, "cuMemHostAlloc(staging flag)", &flag, &m->passed_dev));
  m->passed = flag;
  m->stream = stream;
  *out = m;
  return ncclSuccess;
fail:
  free(m);
  return res;
}

/* The mirror of the stream by its driver id, not its handle: a destroyed
 * stream's handle may come back for a new stream while staged work of the
 * old one is pending, and cudaStreamPerThread names a different stream on
 * each thread. A stream seen for the first time takes over a mirror whose
 * stream has passed all it staged (ids are never reused: a program making
 * a stream per step would otherwise add a mirror per step). */
static ncclResult_t mirror_of(struct cuda_mirror** mirrors, CUstream stream,
                              struct cuda_mirror** out) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  unsigned long long id = 0;
  CHECK(cuda_check(cu->cuStreamGetId(stream, &id), "cuStreamGetId"));
  struct cuda_mirror* m = *mirrors;
  while (m && m->stream_id != id) m = m->next;
  for (struct cuda_mirror* idle = *mirrors; m == NULL && idle; idle = idle->next)
    if (idle->nspans == 0 && __atomic_load_n(idle->passed, __ATOMIC_ACQUIRE) >= idle->issued)
      m = idle;
  if (m == NULL) {
    CHECK(mirror_new(stream, cu, &m));
    m->next = *mirrors;
    *mirrors = m;
  }
  m->stream_id = id;
  m->stream = stream;
  *out = m;
fail:
  return res;
}

static ncclResult_t mirror_reserve(struct cuda_mirror* m, const struct cuda_api* cu, size_t bytes,
                                   int nspans) {
  ncclResult_t res = ncclSuccess;
  struct old_block* old = NULL;
  void* mem = NULL;
  if (nspans > m->cap_spans) {
    CHECK(braid_realloc(&m->spans, (size_t)nspans, sizeof(*m->spans)));
    m->cap_spans = nspans;
  }
  if (bytes <= m->cap) return ncclSuccess;
  size_t cap = MAX(ALIGN_UP(bytes, (size_t)1 << 20), 2 * m->cap);
  CHECK(braid_calloc(&old, 1, sizeof(*old)));
  CHECK(cuda_check(cu->cuMemHostAlloc(&mem, cap, CU_MEMHOSTALLOC_PORTABLE),
                   "cuMemHostAlloc(staging)"));
  if (m->host) {
    old->host = m->host;
    old->next = m->old;
    m->old = old;
    old = NULL;
  }
  free(old);
  m->host = mem;
  m->cap = cap;
  return ncclSuccess;
fail:
  free(old);
  return res;
}

static void* redirect(const void* p, const struct stage_span* sp, int m) {
  uintptr_t v = (uintptr_t)p;
  for (int i = 0; i < m; i++)
    if (v >= sp[i].dev && v - sp[i].dev < sp[i].bytes) return sp[i].host + (v - sp[i].dev);
  return (void*)p;
}

/* Point the op at the mirror of each device range it uses. What is not
 * redirected is not touched (a count of 0, a buffer this rank does not
 * use): the op runs on host memory either way, unless its collective
 * buffers stay on the device (not `colls`). */
static void op_redirect(struct work_op* op, int colls, const struct stage_span* sp, int m) {
  if (op->kind == WORK_COLL) {
    int stays = coll_stays(op, colls); /* before the pointers change */
    op->args.sendbuff = redirect(op->args.sendbuff, sp, m);
    op->args.recvbuff = redirect(op->args.recvbuff, sp, m);
    op->args.scalar_src = redirect(op->args.scalar_src, sp, m);
    if (!stays) op->args.mem = MEM_HOST;
  } else if (!op->ipc) { /* an ipc op moves device to device */
    op->buf = redirect(op->buf, sp, m);
    op->mem = MEM_HOST;
  }
}

/* The op is staged on this (comm, stream). */
static int op_here(const struct work_op* op, const struct ncclComm* comm, CUstream stream) {
  return op->comm == comm && (CUstream)op->stream == stream;
}

/* A gated call that runs with no task (cuda_unit.c, op_net_direct) runs
 * in place: the copy of its own block (all-gather) or of the root's input
 * (broadcast) goes on the stream before the gate, and the call reads it
 * there. */
static ncclResult_t op_in_place(struct work_op* op, CUstream stream, const struct cuda_api* cu) {
  ncclResult_t res = ncclSuccess;
  struct exec_args* a = &op->args;
  size_t es = kern_type_size(a->type), bytes = a->count * es;
  char* own = a->recvbuff;
  if (a->coll == COLL_ALLGATHER)
    own += (size_t)op->comm->rank * (a->stride ? a->stride : a->count) * es;
  else if (op->comm->rank != a->root)
    return ncclSuccess; /* a broadcast's other ranks read nothing */
  if ((const char*)a->sendbuff != own)
    CHECK(cuda_check(cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)own,
                                       (CUdeviceptr)(uintptr_t)a->sendbuff, bytes, stream),
                     "cuMemcpyAsync(own block, in place)"));
  a->sendbuff = own;
fail:
  return res;
}

ncclResult_t cuda_stage_in(struct device_comm* cc, const struct ncclComm* comm, CUstream stream,
                           struct work_op* ops, int n, int colls) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  struct cuda_mirror* m = NULL;
  struct stage_span sp[3];
  size_t need = 0;
  int nspans = 0;
  CHECK(mirror_of(&cc->mirrors, stream, &m));
  for (int i = 0; i < n; i++) {
    if (!op_here(&ops[i], comm, stream)) continue;
    int k = op_spans(&ops[i], colls, sp);
    for (int j = 0; j < k; j++) need += ALIGN_UP(sp[j].bytes, STAGE_ALIGN);
    nspans += k;
  }
  CHECK(mirror_reserve(m, cu, need, nspans));
  m->nspans = 0;
  size_t off = 0;
  for (int i = 0; i < n; i++) {
    if (!op_here(&ops[i], comm, stream)) continue;
    if (ops[i].kind == WORK_COLL && ops[i].args.no_tasks) CHECK(op_in_place(&ops[i], stream, cu));
    int k = op_spans(&ops[i], colls, sp);
    for (int j = 0; j < k; j++) {
      sp[j].host = m->host + off;
      off += ALIGN_UP(sp[j].bytes, STAGE_ALIGN);
      if (sp[j].in)
        CHECK(cuda_check(
            cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)sp[j].host, sp[j].dev, sp[j].bytes, stream),
            "cuMemcpyAsync(stage in)"));
      m->spans[m->nspans++] = sp[j];
    }
    op_redirect(&ops[i], colls, sp, k);
  }
fail:
  return res;
}

ncclResult_t cuda_stage_out(struct device_comm* cc, CUstream stream, int gated) {
  ncclResult_t res = ncclSuccess;
  const struct cuda_api* cu = cuda_driver();
  struct cuda_mirror* m = NULL;
  CHECK(mirror_of(&cc->mirrors, stream, &m));
  for (int i = 0; i < m->nspans; i++)
    if (m->spans[i].out)
      CHECK(cuda_check(cu->cuMemcpyAsync(m->spans[i].dev, (CUdeviceptr)(uintptr_t)m->spans[i].host,
                                         m->spans[i].bytes, stream),
                       "cuMemcpyAsync(stage out)"));
  m->nspans = 0;
  m->issued++;
  if (gated)
    CHECK(cuda_check(cu->cuStreamWriteValue64(stream, m->passed_dev, m->issued, 0),
                     "cuStreamWriteValue64(staging passed)"));
  else /* the caller synchronizes the stream before anything else happens */
    __atomic_store_n(m->passed, m->issued, __ATOMIC_RELEASE);
fail:
  return res;
}

/* Wait (a while) for every stream to pass what was staged on it. */
static int mirrors_passed(struct cuda_mirror* mirrors) {
  uint64_t deadline = braid_now_ns() + (uint64_t)CUDA_STAGE_DRAIN_MS * 1000000ull;
  for (struct cuda_mirror* m = mirrors; m; m = m->next)
    while (__atomic_load_n(m->passed, __ATOMIC_ACQUIRE) < m->issued) {
      if (braid_now_ns() > deadline) return 0;
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  return 1;
}

static void mirror_free(struct cuda_mirror* m, const struct cuda_api* cu) {
  while (m->old) {
    struct old_block* o = m->old;
    m->old = o->next;
    cu->cuMemFreeHost(o->host);
    free(o);
  }
  if (m->host) cu->cuMemFreeHost(m->host);
  cu->cuMemFreeHost(m->passed);
  free(m->spans);
  free(m);
}

int cuda_mirrors_free(struct cuda_mirror** mirrors, const struct cuda_api* cu) {
  if (!mirrors_passed(*mirrors)) {
    WARN(
        "CUDA: a stream has not passed a call of this communicator %d ms after it ended; its "
        "pinned staging memory is left allocated, as the stream may still read it",
        CUDA_STAGE_DRAIN_MS);
    *mirrors = NULL;
    return 0;
  }
  while (*mirrors) {
    struct cuda_mirror* m = *mirrors;
    *mirrors = m->next;
    mirror_free(m, cu);
  }
  return 1;
}
