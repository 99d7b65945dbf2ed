/* The synchronisation schemes (sync.h): what each sends, when, and how the update follows. */
#include "sync.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"

/* ---- setup ---- */

static int compressed_buffers(sync_t* y) {
  const compress_spec_t* c = &y->spec.compress;
  const buckets_t* b = y->buckets;
  if (compress_lossy(c) && (y->residual = calloc(y->n, sizeof(float))) == NULL) return -1;
  if (c->kind == COMPRESS_FP8 && ((y->amax = calloc((size_t)b->nbuckets, sizeof(float))) == NULL ||
                                  (y->scale = calloc((size_t)b->nbuckets, sizeof(float))) == NULL))
    return -1;
  if (c->kind != COMPRESS_TOPK)
    return (y->packed = calloc(y->n, compress_elem_bytes(c->kind))) == NULL ? -1 : 0;
  if ((y->pair_off = calloc((size_t)b->nbuckets + 1, sizeof(size_t))) == NULL) return -1;
  size_t largest = 0;
  for (int i = 0; i < b->nbuckets; i++) {
    size_t begin = i ? b->ends[i - 1] : 0, n = b->ends[i] - begin;
    y->pair_off[i + 1] = y->pair_off[i] + compress_topk_count(c->fraction, n);
    if (n > largest) largest = n;
  }
  size_t pairs = y->pair_off[b->nbuckets];
  y->packed = calloc(2 * pairs, sizeof(uint32_t));
  y->gathered = calloc(2 * pairs * (size_t)y->world, sizeof(uint32_t));
  y->scratch = calloc(COMPRESS_TOPK_SCRATCH(largest), sizeof(uint32_t));
  return y->packed && y->gathered && y->scratch ? 0 : -1;
}

static int scheme_buffers(sync_t* y) {
  switch (y->spec.kind) {
    case SYNC_LOCAL:
      y->work = calloc(y->n, sizeof(float));
      y->anchor = calloc(y->n, sizeof(float));
      return y->work && y->anchor ? 0 : -1;
    case SYNC_GOSSIP:
      y->peers[0] = calloc(y->n, sizeof(float));
      y->peers[1] = calloc(y->n, sizeof(float));
      return y->peers[0] && y->peers[1] ? 0 : -1;
    case SYNC_STALE:
      y->queue = calloc(y->n * (size_t)(y->spec.arg + 1), sizeof(float));
      y->mine = calloc(y->n * (size_t)(y->spec.arg + 1), sizeof(float));
      y->work = calloc(y->n, sizeof(float));
      return y->queue && y->mine && y->work ? 0 : -1;
    default:
      return 0;
  }
}

static ncclResult_t bucket_send(void* ctx, int bucket, size_t begin, size_t n, cudaStream_t stream);

int sync_init(sync_t* y, const sync_spec_t* spec, ncclComm_t comm, int rank, int world,
              buckets_t* b, model_t* m, char* err, size_t errlen) {
  memset(y, 0, sizeof(*y));
  y->spec = *spec;
  y->comm = comm;
  y->rank = rank;
  y->world = world;
  y->buckets = b;
  y->n = m->nparams;
  y->params = m->params;
  y->grads = m->grads;
  if (sync_validate(spec, world, err, errlen) != 0) return -1;
  if (compressed_buffers(y) != 0 || scheme_buffers(y) != 0) {
    snprintf(err, errlen, "out of memory for the synchronisation scheme's buffers");
    return -1;
  }
  int sends = spec->kind == SYNC_ALLREDUCE || spec->kind == SYNC_PS || spec->kind == SYNC_STALE;
  buckets_set_send(b, sends ? bucket_send : NULL, y);
  return 0;
}

void sync_free(sync_t* y) {
  free(y->residual);
  free(y->work);
  free(y->packed);
  free(y->gathered);
  free(y->scratch);
  free(y->pair_off);
  free(y->amax);
  free(y->scale);
  free(y->anchor);
  free(y->peers[0]);
  free(y->peers[1]);
  free(y->queue);
  free(y->mine);
  memset(y, 0, sizeof(*y));
}

void sync_start(sync_t* y) {
  if (y->anchor) memcpy(y->anchor, y->params, y->n * sizeof(float));
}

int sync_uses_buckets(const sync_t* y) {
  return y->buckets->send != NULL;
}

/* ---- one range of values, encoded, sent, and taken back ---- */

static int to_server(const sync_t* y) {
  return y->spec.kind == SYNC_PS;
}

/* fp8's scale for range b: from the largest sum last time, which every rank knows; the
 * first time (or after a bucket summed to zero), from the ranks' largest values, agreed by
 * an all-reduce that this call waits for. */
static ncclResult_t fp8_scale(sync_t* y, int b, const float* src, size_t begin, size_t n,
                              cudaStream_t stream) {
  float scale = compress_fp8_scale(y->amax[b]);
  if (scale == 0.0f) {
    float m = compress_amax(src + begin, y->residual + begin, n);
    ncclResult_t res = ncclAllReduce(&m, &m, 1, ncclFloat32, ncclMax, y->comm, stream);
    if (res == ncclSuccess) res = braidStreamSynchronize(stream);
    if (res != ncclSuccess) return res;
    wire_add(&y->wire, WIRE_ALLREDUCE, ncclFloat32, 1);
    scale = compress_fp8_scale(m * (float)y->world);
  }
  y->scale[b] = scale > 0.0f ? scale : 1.0f;
  return ncclSuccess;
}

/* Sums [begin, begin + n) of `src` over the ranks (at the server only, for ps) in the
 * scheme's encoding, enqueued on `stream`: uncompressed values into `sum` (src itself, but
 * for stale, whose own gradients stay beside their sum), encoded ones in `packed`, pairs in
 * `gathered`. The residual is indexed as src is (src is the gradients, a stale slot or
 * local's change, each n long). */
static ncclResult_t range_send(sync_t* y, int b, float* src, float* sum, size_t begin, size_t n,
                               cudaStream_t stream) {
  const compress_spec_t* c = &y->spec.compress;
  int root = y->spec.arg;
  if (c->kind == COMPRESS_TOPK) {
    size_t k = y->pair_off[b + 1] - y->pair_off[b];
    uint32_t* pairs = (uint32_t*)y->packed + 2 * y->pair_off[b];
    uint32_t* all = y->gathered + 2 * y->pair_off[b] * (size_t)y->world;
    compress_topk_encode(src + begin, y->residual + begin, n, k, (uint32_t)begin, pairs,
                         y->scratch);
    wire_add(&y->wire, to_server(y) ? WIRE_GATHER : WIRE_ALLGATHER, ncclUint32, 2 * k);
    return to_server(y) ? ncclGather(pairs, all, 2 * k, ncclUint32, root, y->comm, stream)
                        : ncclAllGather(pairs, all, 2 * k, ncclUint32, y->comm, stream);
  }
  ncclDataType_t type = compress_nccl_type(c->kind);
  void *buf = src + begin, *out = sum + begin;
  if (c->kind == COMPRESS_FP8) {
    ncclResult_t res = fp8_scale(y, b, src, begin, n, stream);
    if (res != ncclSuccess) return res;
  }
  if (c->kind != COMPRESS_NONE) {
    buf = out = (char*)y->packed + begin * compress_elem_bytes(c->kind);
    compress_encode(c->kind, src + begin, y->residual + begin, buf, n,
                    c->kind == COMPRESS_FP8 ? y->scale[b] : 1.0f);
  }
  wire_add(&y->wire, to_server(y) ? WIRE_REDUCE : WIRE_ALLREDUCE, type, n);
  return to_server(y) ? ncclReduce(buf, out, n, type, ncclSum, root, y->comm, stream)
                      : ncclAllReduce(buf, out, n, type, ncclSum, y->comm, stream);
}

/* Range b's sums into src (after its call completed: uncompressed ones are there already);
 * fp8 keeps their largest magnitude for the next scale. */
static void range_take(sync_t* y, int b, float* src, size_t begin, size_t n) {
  const compress_spec_t* c = &y->spec.compress;
  if (c->kind == COMPRESS_NONE) return;
  if (c->kind == COMPRESS_TOPK) {
    size_t k = y->pair_off[b + 1] - y->pair_off[b];
    const uint32_t* all = y->gathered + 2 * y->pair_off[b] * (size_t)y->world;
    memset(src + begin, 0, n * sizeof(float));
    for (int r = 0; r < y->world; r++) /* in rank order: the same sums on every rank */
      compress_topk_add(all + 2 * k * (size_t)r, k, src);
    return;
  }
  compress_decode(c->kind, (const char*)y->packed + begin * compress_elem_bytes(c->kind),
                  src + begin, n, c->kind == COMPRESS_FP8 ? y->scale[b] : 1.0f);
  if (c->kind == COMPRESS_FP8) y->amax[b] = compress_amax(src + begin, NULL, n);
}

static void bucket_range(const buckets_t* b, int i, size_t* begin, size_t* n) {
  *begin = i ? b->ends[i - 1] : 0;
  *n = b->ends[i] - *begin;
}

/* Every range of `src` taken back. */
static void ranges_take(sync_t* y, float* src) {
  for (int i = 0; i < y->buckets->nbuckets; i++) {
    size_t begin, n;
    bucket_range(y->buckets, i, &begin, &n);
    range_take(y, i, src, begin, n);
  }
}

/* A step's slot of one of stale's rings (queue or mine). */
static float* slot_of(const sync_t* y, float* ring, int64_t step) {
  return ring + y->n * (size_t)(step % (y->spec.arg + 1));
}

/* A bucket backward finished: the scheme's call for it. Stale keeps a copy of its own
 * gradients in this step's slot (the next backward overwrites the gradients, and the
 * correction S steps on needs them) and sums from there into the step's queue slot. */
static ncclResult_t bucket_send(void* ctx, int bucket, size_t begin, size_t n,
                                cudaStream_t stream) {
  sync_t* y = ctx;
  if (y->spec.kind != SYNC_STALE)
    return range_send(y, bucket, y->grads, y->grads, begin, n, stream);
  float* mine = slot_of(y, y->mine, y->step);
  memcpy(mine + begin, y->grads + begin, n * sizeof(float));
  return range_send(y, bucket, mine, slot_of(y, y->queue, y->step), begin, n, stream);
}

/* Every range of y->work as one call (local's average). */
static ncclResult_t work_send(void* ctx, int bucket, size_t begin, size_t n, cudaStream_t stream) {
  sync_t* y = ctx;
  (void)bucket, (void)begin, (void)n;
  for (int i = 0; i < y->buckets->nbuckets; i++) {
    size_t b0, bn;
    bucket_range(y->buckets, i, &b0, &bn);
    ncclResult_t res = range_send(y, i, y->work, y->work, b0, bn, stream);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* ---- the update ---- */

/* One call of the scheme's own, waited for (on this step's stream). */
static ncclResult_t call_and_wait(sync_t* y, buckets_send_fn fn) {
  ncclResult_t res = buckets_call(y->buckets, fn, y);
  return res != ncclSuccess ? res : buckets_wait(y->buckets, y->buckets->cur);
}

/* The optimizer's step on `grads` (gradient sums over `samples`). */
static void apply(const sync_step_t* st, float* grads, int samples) {
  model_t view = *st->model;
  view.grads = grads;
  optim_step(&view, st->velocity, st->optim, st->lr, 1.0f / (float)samples);
}

/* ps: the server's new weights (and fp8's scales) to every rank. */
static ncclResult_t server_broadcast(void* ctx, int bucket, size_t begin, size_t n,
                                     cudaStream_t stream) {
  sync_t* y = ctx;
  int root = y->spec.arg, nb = y->buckets->nbuckets;
  (void)bucket, (void)begin, (void)n;
  if (y->rank == root) wire_add(&y->wire, WIRE_BROADCAST, ncclFloat32, y->n);
  ncclResult_t res = ncclBroadcast(y->params, y->params, y->n, ncclFloat32, root, y->comm, stream);
  if (res != ncclSuccess || y->amax == NULL) return res;
  if (y->rank == root) wire_add(&y->wire, WIRE_BROADCAST, ncclFloat32, (size_t)nb);
  return ncclBroadcast(y->amax, y->amax, (size_t)nb, ncclFloat32, root, y->comm, stream);
}

/* gossip: this rank's parameters to its ring neighbours, theirs into peers[]. */
static ncclResult_t gossip_send(void* ctx, int bucket, size_t begin, size_t n,
                                cudaStream_t stream) {
  sync_t* y = ctx;
  int left = (y->rank + y->world - 1) % y->world, right = (y->rank + 1) % y->world;
  int sides = y->world == 2 ? 1 : 2; /* two ranks: the one neighbour is both */
  ncclResult_t res = ncclGroupStart();
  (void)bucket, (void)begin, (void)n;
  for (int i = 0; i < sides && res == ncclSuccess; i++) {
    int peer = i ? right : left;
    res = ncclSend(y->params, y->n, ncclFloat32, peer, y->comm, stream);
    if (res == ncclSuccess) res = ncclRecv(y->peers[i], y->n, ncclFloat32, peer, y->comm, stream);
    wire_add(&y->wire, WIRE_SEND, ncclFloat32, y->n);
  }
  ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

/* The sum of every rank's parameters, in place (gossip's final average). */
static ncclResult_t params_sum(void* ctx, int bucket, size_t begin, size_t n, cudaStream_t stream) {
  sync_t* y = ctx;
  (void)bucket, (void)begin, (void)n;
  wire_add(&y->wire, WIRE_ALLREDUCE, ncclFloat32, y->n);
  return ncclAllReduce(y->params, y->params, y->n, ncclFloat32, ncclSum, y->comm, stream);
}

/* Whether local:K averages after update `step` of `total`: every K steps counted back from
 * the last, so the run ends on an average; the first interval takes the remainder. */
static int local_averages(int k, int64_t step, int64_t total) {
  return step == total - 1 || (step >= k - 1 && (total - 1 - step) % k == 0);
}

int sync_replicas_after(const sync_t* y, int64_t step, int64_t total_steps) {
  switch (y->spec.kind) {
    case SYNC_LOCAL:
      return local_averages(y->spec.arg, step, total_steps);
    case SYNC_GOSSIP:
    case SYNC_STALE:
      return y->world == 1;
    default:
      return 1;
  }
}

ncclResult_t sync_step_begin(sync_t* y, const sync_step_t* st) {
  y->step = st->step;
  buckets_begin(y->buckets, (int)(y->spec.kind == SYNC_STALE ? st->step % (y->spec.arg + 1) : 0));
  if (y->spec.kind == SYNC_GOSSIP && y->world > 1) return buckets_call(y->buckets, gossip_send, y);
  return ncclSuccess;
}

/* local: every K steps, the change since the last average, summed (encoded as asked, its
 * loss kept in the residual), divided among the ranks and added to the last average. */
static ncclResult_t local_average(sync_t* y) {
  ncclResult_t res;
  for (size_t i = 0; i < y->n; i++) y->work[i] = y->params[i] - y->anchor[i];
  if ((res = call_and_wait(y, work_send)) != ncclSuccess) return res;
  ranges_take(y, y->work);
  for (size_t i = 0; i < y->n; i++) y->params[i] = y->anchor[i] + y->work[i] / (float)y->world;
  memcpy(y->anchor, y->params, y->n * sizeof(float));
  return ncclSuccess;
}

/* stale (delayed gradient averaging): this step's own gradient now, plus, once step t-S's
 * sum has arrived, what it says this rank's gradient of step t-S missed. */
static ncclResult_t stale_step(sync_t* y, const sync_step_t* st) {
  const int S = y->spec.arg;
  const float own = 1.0f / (float)st->local_n, all = 1.0f / (float)st->global_batch;
  ncclResult_t res = buckets_flush(y->buckets);
  if (res != ncclSuccess) return res;
  for (size_t i = 0; i < y->n; i++) y->work[i] = y->grads[i] * own;
  if (st->step >= S) {
    const float *sum = slot_of(y, y->queue, st->step - S), *was = slot_of(y, y->mine, st->step - S);
    if ((res = buckets_wait(y->buckets, (int)((st->step - S) % (S + 1)))) != ncclSuccess)
      return res;
    for (size_t i = 0; i < y->n; i++) y->work[i] += sum[i] * all - was[i] * own;
  }
  apply(st, y->work, 1);
  return ncclSuccess;
}

/* stale's last S corrections, owed at the end: plain steps, the optimizer's state done. */
static ncclResult_t stale_drain(sync_t* y, const sync_step_t* st) {
  const int S = y->spec.arg;
  const float own = 1.0f / (float)st->local_n, all = 1.0f / (float)st->global_batch;
  const float lr = (float)st->lr;
  for (int64_t s = st->step - S + 1 < 0 ? 0 : st->step - S + 1; s <= st->step; s++) {
    const float *sum = slot_of(y, y->queue, s), *was = slot_of(y, y->mine, s);
    ncclResult_t res = buckets_wait(y->buckets, (int)(s % (S + 1)));
    if (res != ncclSuccess) return res;
    for (size_t i = 0; i < y->n; i++) y->params[i] -= lr * (sum[i] * all - was[i] * own);
  }
  return ncclSuccess;
}

/* gossip: the mean of this rank's parameters and its neighbours'. */
static void gossip_mix(sync_t* y) {
  if (y->world == 2)
    for (size_t i = 0; i < y->n; i++) y->params[i] = (y->params[i] + y->peers[0][i]) * 0.5f;
  else
    for (size_t i = 0; i < y->n; i++)
      y->params[i] = (y->peers[0][i] + y->params[i] + y->peers[1][i]) / 3.0f;
}

ncclResult_t sync_step_end(sync_t* y, const sync_step_t* st) {
  ncclResult_t res = ncclSuccess;
  int S = y->spec.arg;
  switch (y->spec.kind) {
    case SYNC_ALLREDUCE:
      if ((res = buckets_finish(y->buckets)) != ncclSuccess) return res;
      ranges_take(y, y->grads);
      apply(st, y->grads, st->global_batch);
      return ncclSuccess;
    case SYNC_PS:
      if ((res = buckets_finish(y->buckets)) != ncclSuccess) return res;
      if (y->rank == S) { /* the server: the only optimizer */
        ranges_take(y, y->grads);
        apply(st, y->grads, st->global_batch);
      }
      return call_and_wait(y, server_broadcast);
    case SYNC_STALE:
      return stale_step(y, st);
    case SYNC_LOCAL:
      apply(st, y->grads, st->local_n);
      return local_averages(S, st->step, st->total_steps) ? local_average(y) : ncclSuccess;
    case SYNC_GOSSIP:
      if (y->world > 1 && (res = buckets_wait(y->buckets, 0)) != ncclSuccess) return res;
      if (y->world > 1) gossip_mix(y);
      apply(st, y->grads, st->local_n);
      return ncclSuccess;
  }
  return ncclInternalError;
}

ncclResult_t sync_end_training(sync_t* y, const sync_step_t* st) {
  ncclResult_t res = ncclSuccess;
  if (y->spec.kind == SYNC_STALE && (res = stale_drain(y, st)) != ncclSuccess) return res;
  if ((y->spec.kind == SYNC_GOSSIP || y->spec.kind == SYNC_STALE) && y->world > 1) {
    if ((res = call_and_wait(y, params_sum)) != ncclSuccess) return res;
    for (size_t i = 0; i < y->n; i++) y->params[i] /= (float)y->world;
  }
  return res;
}

ncclResult_t sync_quiesce(sync_t* y) {
  for (int i = 0; i < y->buckets->nstreams; i++) {
    ncclResult_t res = buckets_wait(y->buckets, i);
    if (res != ncclSuccess) return res;
  }
  return ncclSuccess;
}

/* ---- checkpoint state ---- */

/* The arrays a rank's state is made of, in order, and their lengths: its parameters and
 * momentum, then what the scheme keeps. velocity may be NULL when only the lengths count. */
#define STATE_PARTS 7
static int state_parts(const sync_t* y, float* velocity, float** out, size_t* lens) {
  size_t ring = y->n * (size_t)(y->spec.arg + 1);
  float* all[STATE_PARTS] = {y->params, velocity, y->residual, y->anchor,
                             y->queue,  y->mine,  y->amax};
  size_t len[STATE_PARTS] = {y->n, y->n, y->n, y->n, ring, ring, (size_t)y->buckets->nbuckets};
  int k = 0;
  for (int i = 0; i < STATE_PARTS; i++)
    if (all[i] || i == 1) out[k] = all[i], lens[k++] = len[i];
  return k;
}

size_t sync_state_floats(const sync_t* y) {
  float* parts[STATE_PARTS];
  size_t lens[STATE_PARTS], total = 0;
  int k = state_parts(y, NULL, parts, lens);
  for (int i = 0; i < k; i++) total += lens[i];
  return total;
}

void sync_state_save(const sync_t* y, const float* velocity, float* out) {
  float* parts[STATE_PARTS];
  size_t lens[STATE_PARTS];
  int k = state_parts(y, (float*)velocity, parts, lens);
  for (int i = 0; i < k; out += lens[i], i++) memcpy(out, parts[i], lens[i] * sizeof(float));
}

void sync_state_load(sync_t* y, float* velocity, const float* in) {
  float* parts[STATE_PARTS];
  size_t lens[STATE_PARTS];
  int k = state_parts(y, velocity, parts, lens);
  for (int i = 0; i < k; in += lens[i], i++) memcpy(parts[i], in, lens[i] * sizeof(float));
}
