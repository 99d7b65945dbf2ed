/* Max pooling over non-overlapping size x size windows. Forward remembers where each maximum
 * came from, so backward routes each output gradient to exactly that input. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef struct {
  layer_t base;
  int size;
  int32_t* argmax; /* per output of each sample: index of the chosen input inside the sample */
} pool_t;

static void pool_forward(layer_t* l, const float* in, float* out, int batch) {
  pool_t* p = (pool_t*)l;
  const int s = p->size, h = l->in_h, w = l->in_w;
  for (int b = 0; b < batch; b++) {
    const float* x = in + (size_t)b * l->in_size;
    float* y = out + (size_t)b * l->out_size;
    int32_t* arg = p->argmax + (size_t)b * l->out_size;
    for (int c = 0; c < l->out_c; c++)
      for (int oy = 0; oy < l->out_h; oy++)
        for (int ox = 0; ox < l->out_w; ox++) {
          int best = (c * h + oy * s) * w + ox * s;
          for (int dy = 0; dy < s; dy++)
            for (int dx = 0; dx < s; dx++) {
              int i = (c * h + oy * s + dy) * w + ox * s + dx;
              if (x[i] > x[best]) best = i;
            }
          int o = (c * l->out_h + oy) * l->out_w + ox;
          y[o] = x[best];
          arg[o] = best;
        }
  }
}

static void pool_backward(layer_t* l, const float* in, const float* out, const float* dout,
                          float* din, int batch, const grad_sink_t* sink) {
  (void)in;
  (void)out;
  (void)sink;
  if (din == NULL) return;
  pool_t* p = (pool_t*)l;
  memset(din, 0, sizeof(float) * (size_t)batch * l->in_size);
  for (int b = 0; b < batch; b++) {
    const int32_t* arg = p->argmax + (size_t)b * l->out_size;
    const float* dy = dout + (size_t)b * l->out_size;
    float* dx = din + (size_t)b * l->in_size;
    for (int o = 0; o < l->out_size; o++) dx[arg[o]] += dy[o];
  }
}

static void pool_destroy(layer_t* l) {
  free(((pool_t*)l)->argmax);
  free(l);
}

static const layer_ops_t kPoolOps = {"maxpool", pool_forward, pool_backward, pool_destroy};

layer_t* layer_maxpool(int c, int h, int w, int size, int max_batch) {
  if (c <= 0 || size <= 0 || h < size || w < size || max_batch <= 0) return NULL;
  pool_t* p = calloc(1, sizeof(*p));
  if (p == NULL) return NULL;
  layer_t* l = &p->base;
  l->ops = &kPoolOps;
  l->in_c = l->out_c = c;
  l->in_h = h;
  l->in_w = w;
  l->out_h = h / size;
  l->out_w = w / size;
  l->in_size = c * h * w;
  l->out_size = c * l->out_h * l->out_w;
  p->size = size;
  p->argmax = malloc(sizeof(int32_t) * l->out_size * (size_t)max_batch);
  if (p->argmax == NULL) {
    pool_destroy(l);
    return NULL;
  }
  return l;
}
