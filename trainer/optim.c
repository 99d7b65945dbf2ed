/* Momentum SGD as PyTorch defines it: v = mu v + (g + wd w), w -= lr v. */
#include "optim.h"

#include <math.h>

double optim_lr(const optim_config_t* c, int epoch, int step) {
  const double peak = c->lr * c->global_batch / OPTIM_REFERENCE_BATCH;
  const double spe = c->steps_per_epoch;
  const double t = epoch * spe + step; /* updates done before this one */
  const double warmup = c->warmup_epochs * spe;
  if (t < warmup) return peak * (t + 1.0) / warmup;
  if (c->schedule == SCHEDULE_STEP) {
    int drops = c->step_epochs > 0 ? epoch / c->step_epochs : 0;
    return peak * pow(c->gamma, drops);
  }
  const double total = c->epochs * spe;
  double progress = total > warmup ? (t - warmup) / (total - warmup) : 1.0;
  if (progress > 1.0) progress = 1.0;
  return peak * 0.5 * (1.0 + cos(M_PI * progress));
}

typedef struct {
  model_t* m;
  float* velocity;
  float lr, mu, wd, scale;
} step_ctx_t;

static void step_tensor(size_t offset, size_t count, int decay, void* p) {
  const step_ctx_t* s = p;
  float* restrict w = s->m->params + offset;
  const float* restrict g = s->m->grads + offset;
  float* restrict v = s->velocity + offset;
  const float wd = decay ? s->wd : 0.0f;
  for (size_t i = 0; i < count; i++) {
    float d = g[i] * s->scale + wd * w[i];
    v[i] = s->mu * v[i] + d;
    w[i] -= s->lr * v[i];
  }
}

void optim_step(model_t* m, float* velocity, const optim_config_t* c, double lr, float grad_scale) {
  step_ctx_t s = {m, velocity, (float)lr, (float)c->momentum, (float)c->weight_decay, grad_scale};
  model_tensors(m, step_tensor, &s);
}
