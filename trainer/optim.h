/* SGD with momentum and decoupled-from-bias weight decay, and the learning-rate schedule:
 * linear scaling with the global batch, linear warmup, then cosine or step decay. */
#ifndef TRAIN_OPTIM_H_
#define TRAIN_OPTIM_H_

#include <stddef.h>

#include "model.h"

#define OPTIM_REFERENCE_BATCH 256 /* --lr is the rate for this global batch */

typedef enum { SCHEDULE_COSINE, SCHEDULE_STEP } schedule_kind_t;

typedef struct {
  double lr; /* at OPTIM_REFERENCE_BATCH */
  double momentum;
  double weight_decay;  /* on weights, not biases */
  double warmup_epochs; /* may be fractional */
  schedule_kind_t schedule;
  int step_epochs; /* step decay: multiply by gamma every step_epochs epochs */
  double gamma;
  int epochs, steps_per_epoch, global_batch;
} optim_config_t;

/* Learning rate for the update that ends step `step` (0-based) of epoch `epoch`. */
double optim_lr(const optim_config_t* c, int epoch, int step);

/* One update of m->params from m->grads (sums over the global batch): the gradient is scaled by
 * grad_scale (1 / global batch), weight decay is added, then momentum (velocity, nparams floats)
 * and the step. The arithmetic is the same on every rank, so identical inputs stay identical. */
void optim_step(model_t* m, float* velocity, const optim_config_t* c, double lr, float grad_scale);

#endif /* TRAIN_OPTIM_H_ */
