/* How workers synchronise (--sync) and how much they send (--compress): the taxonomy of
 * distributed training, one scheme per flag, on the same model and data.
 *
 *   allreduce  synchronous data parallelism: every step's gradients summed by all-reduce,
 *              bucketed and overlapped with backward; identical replicas
 *   ps[:R]     a centralised parameter server on rank R: gradients reduced to R
 *              (ncclReduce), R steps the optimizer, the new weights broadcast; the workers
 *              hold no optimizer state
 *   local:K    local SGD / periodic model averaging: each rank steps on its own gradients;
 *              every K steps the parameters are averaged (their change since the last
 *              average is all-reduced). Momentum stays local: averaging it too would double
 *              the bytes. The averages are counted back from the last step, so training
 *              ends on one (the first interval is K plus the remainder of steps / K)
 *   gossip     decentralised averaging (D-PSGD): each step a rank averages its parameters
 *              with its two ring neighbours' (send/recv, overlapped with forward and
 *              backward), then steps on its own gradients; one all-reduce averages the
 *              model at the end
 *   stale:S    bounded staleness: a step's gradient all-reduce runs behind the next S
 *              steps' compute, and its sum is applied S steps late. Applied alone (as the
 *              update) a late gradient diverges here: on a quadratic, heavy-ball momentum mu
 *              with a one-step delay is stable only for lr x curvature < 1 - mu (0.1 at mu
 *              0.9, against 3.8 without delay), and the MLP went to NaN in its first epoch.
 *              So it is delayed gradient averaging (Zhu et al., NeurIPS 2021): a rank steps
 *              at once on its own gradient, and when the sum of step t arrives at step t+S
 *              it adds the difference between that mean and its own gradient of step t.
 *              The ranks' models differ by their last S own steps until the end, where the
 *              last S differences are applied and one all-reduce averages the model
 *
 * Compression (compress.h) applies to allreduce, ps and local (local compresses the change
 * it averages). Every scheme is deterministic for a seed. */
#ifndef TRAIN_SYNC_H_
#define TRAIN_SYNC_H_

#include <stddef.h>
#include <stdint.h>

#include "buckets.h"
#include "compress.h"
#include "model.h"
#include "optim.h"
#include "wire.h"

typedef enum { SYNC_ALLREDUCE, SYNC_PS, SYNC_LOCAL, SYNC_GOSSIP, SYNC_STALE } sync_kind_t;

#define SYNC_MAX_STALE (BUCKETS_MAX_STREAMS - 1)

typedef struct {
  sync_kind_t kind;
  int arg; /* ps: the server rank; local: K; stale: S */
  compress_spec_t compress;
} sync_spec_t;

/* --sync's value: "allreduce", "ps", "ps:R", "local:K", "gossip", "stale:S". 0 on success. */
int sync_parse(const char* s, sync_spec_t* out);
/* "local:8", "ps:0", ...; and with the compression: "local:8 fp16". */
void sync_format(const sync_spec_t* s, char* out, size_t outlen);
void sync_describe(const sync_spec_t* s, char* out, size_t outlen);
/* Whether the scheme, its argument and its compression fit `world` ranks; a message if not. */
int sync_validate(const sync_spec_t* s, int world, char* err, size_t errlen);
/* Streams the buckets need: stale keeps S + 1 steps' calls apart. */
int sync_streams(const sync_spec_t* s);

/* One update's inputs. */
typedef struct {
  model_t* model;
  float* velocity;
  const optim_config_t* optim;
  double lr;
  int local_n;      /* samples this rank's gradients sum over */
  int global_batch; /* samples of all ranks */
  int64_t step;     /* this update's number, from 0 */
  int64_t total_steps;
} sync_step_t;

typedef struct {
  sync_spec_t spec;
  ncclComm_t comm;
  int rank, world;
  buckets_t* buckets;
  size_t n;           /* parameters */
  float* params;      /* the model's */
  float* grads;       /* the model's gradients */
  float* residual;    /* lossy: what encoding lost, fed into the next encoding */
  float* work;        /* local: the change to average, then its sum; stale: none */
  void* packed;       /* dense: n encoded values; topk: the pairs of every bucket */
  uint32_t* gathered; /* topk: every rank's pairs */
  uint32_t* scratch;  /* topk: selection */
  size_t* pair_off;   /* topk: bucket b's pairs start at pair_off[b], end at pair_off[b+1] */
  float* amax;        /* fp8: per bucket, the largest |sum| last time (agreed by every rank) */
  float* scale;       /* fp8: per bucket, this step's */
  float* anchor;      /* local: the parameters at the last average */
  float* peers[2];    /* gossip: the left and right neighbours' parameters */
  float* queue;       /* stale: S + 1 slots of summed gradients, slot = step % (S + 1) */
  float* mine;        /* stale: this rank's own gradients of the same steps (summed from) */
  int64_t step;       /* the step being sent */
  wire_t wire;
} sync_t;

int sync_init(sync_t* y, const sync_spec_t* spec, ncclComm_t comm, int rank, int world,
              buckets_t* b, model_t* m, char* err, size_t errlen);
void sync_free(sync_t* y);
/* The parameters are the run's first ones, the same on every rank (local's anchor). */
void sync_start(sync_t* y);

/* Before forward (gossip starts its exchange). */
ncclResult_t sync_step_begin(sync_t* y, const sync_step_t* st);
/* Whether backward reports to the buckets (schemes that send during backward). */
int sync_uses_buckets(const sync_t* y);
/* After backward: the scheme's communication and the update. */
ncclResult_t sync_step_end(sync_t* y, const sync_step_t* st);
/* Whether every rank holds the same parameters after update `step` (for --check-sync). */
int sync_replicas_after(const sync_t* y, int64_t step, int64_t total_steps);
/* End of training: stale's queued differences applied, stale's and gossip's replicas
 * averaged (local's last step averaged them); every rank then holds the same model. st:
 * the last step's. */
ncclResult_t sync_end_training(sync_t* y, const sync_step_t* st);
/* Nothing left in flight (before a checkpoint). */
ncclResult_t sync_quiesce(sync_t* y);

/* Per-rank state of a checkpoint: parameters, momentum and what the scheme keeps. */
size_t sync_state_floats(const sync_t* y);
void sync_state_save(const sync_t* y, const float* velocity, float* out);
void sync_state_load(sync_t* y, float* velocity, const float* in);

#endif /* TRAIN_SYNC_H_ */
