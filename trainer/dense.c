/* Fully connected layer: out = in W^T + b with W stored out x in, row-major, all through
 * OpenBLAS. The weight gradient is computed in row blocks so buckets can leave early. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef struct {
  const float* in;
  const float* dout;
  int batch;
} dense_grad_t;

static void dense_forward(layer_t* l, const float* in, float* out, int batch) {
  const int nin = l->in_size, nout = l->out_size;
  const float* bias = l->params;
  const float* w = l->params + l->nbias;
  for (int b = 0; b < batch; b++) memcpy(out + (size_t)b * nout, bias, sizeof(float) * nout);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, nout, nin, 1.0f, in, nin, w, nin,
              1.0f, out, nout);
}

/* dW[r0..r1) = dout[:, r0..r1)^T in */
static void dense_weight_rows(layer_t* l, int r0, int r1, void* ctx) {
  const dense_grad_t* g = ctx;
  const int nin = l->in_size, nout = l->out_size;
  float* dw = l->grads + l->nbias;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1 - r0, nin, g->batch, 1.0f, g->dout + r0,
              nout, g->in, nin, 0.0f, dw + (size_t)r0 * nin, nin);
}

static void dense_backward(layer_t* l, const float* in, const float* out, const float* dout,
                           float* din, int batch, const grad_sink_t* sink) {
  (void)out;
  const int nin = l->in_size, nout = l->out_size;
  float* restrict db = l->grads;
  const float* restrict dy = dout;
  memset(db, 0, sizeof(float) * nout);
  for (int b = 0; b < batch; b++)
    for (int o = 0; o < nout; o++) db[o] += dy[(size_t)b * nout + o];
  dense_grad_t g = {in, dout, batch};
  layer_weight_pieces(l, sink, (size_t)nin, dense_weight_rows, &g);
  if (din == NULL) return;
  const float* w = l->params + l->nbias;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, nin, nout, 1.0f, dout, nout, w, nin,
              0.0f, din, nin);
}

static void dense_destroy(layer_t* l) {
  free(l);
}

static const layer_ops_t kDenseOps = {"dense", dense_forward, dense_backward, dense_destroy};

layer_t* layer_dense(int in, int out, int max_batch) {
  (void)max_batch; /* no workspace: the model's activations are enough */
  if (in <= 0 || out <= 0) return NULL;
  layer_t* l = calloc(1, sizeof(*l));
  if (l == NULL) return NULL;
  l->ops = &kDenseOps;
  l->in_c = in;
  l->out_c = out;
  l->in_h = l->in_w = l->out_h = l->out_w = 1;
  l->in_size = in;
  l->out_size = out;
  l->nbias = (size_t)out;
  l->nweight = (size_t)out * in;
  l->fan_in = (size_t)in;
  return l;
}
