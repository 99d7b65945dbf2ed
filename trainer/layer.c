/* What the layers share (the piecewise weight gradient), the parameter-free ReLU, and the
 * softmax cross-entropy loss at the top of every model. */
#include "layer.h"

#include <math.h>
#include <stdlib.h>

/* Where ranks take turns on a core, a piece also ends after this many gradient floats, so a
 * turn comes every ~0.1 ms of weight-gradient GEMM (batch 128) rather than after a whole
 * bucket; finer turns keep co-located ranks level at the end of backward. */
#define TURN_PIECE_FLOATS 65536

void layer_weight_pieces(layer_t* l, const grad_sink_t* sink, size_t row_len,
                         void (*piece)(layer_t* l, int r0, int r1, void* ctx), void* ctx) {
  const int rows = (int)(l->nweight / row_len);
  const size_t wbase = l->offset + l->nbias;
  const int turn_rows = row_len < TURN_PIECE_FLOATS ? (int)(TURN_PIECE_FLOATS / row_len) : 1;
  if (sink) sink->ready(sink->ctx, wbase); /* the bias, computed by the caller */
  for (int r = 0; r < rows;) {
    int r1 = rows;
    if (sink && sink->boundary && !sink->fixed_grid) {
      size_t end = sink->boundary(sink->ctx, wbase + (size_t)r * row_len);
      size_t need = (end - wbase + row_len - 1) / row_len; /* whole rows up to the boundary */
      r1 = need < (size_t)rows ? (int)need : rows;
      if (r1 <= r) r1 = r + 1;
    }
    if (sink && (sink->turn || sink->fixed_grid) && r1 - r > turn_rows) r1 = r + turn_rows;
    piece(l, r, r1, ctx);
    if (sink) sink->ready(sink->ctx, wbase + (size_t)r1 * row_len);
    if (sink && sink->turn && r1 < rows) sink->turn();
    r = r1;
  }
}

/* ---------------------------------------------------------------- ReLU */

/* Branch-free loops (the signs are random, a branch would mispredict half the time) over
 * restrict pointers, so the compiler vectorizes them. */
static void relu_forward(layer_t* l, const float* in, float* out, int batch) {
  const float* restrict x = in;
  float* restrict y = out;
  const size_t n = (size_t)batch * l->in_size;
  for (size_t i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

static void relu_backward(layer_t* l, const float* in, const float* out, const float* dout,
                          float* din, int batch, const grad_sink_t* sink) {
  (void)in;
  (void)sink;
  if (din == NULL) return;
  const float* restrict y = out;
  const float* restrict dy = dout;
  float* restrict dx = din;
  const size_t n = (size_t)batch * l->in_size;
  for (size_t i = 0; i < n; i++) {
    const float g = dy[i]; /* loaded unconditionally: what lets the loop vectorize */
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

static void plain_destroy(layer_t* l) {
  free(l);
}

static const layer_ops_t kReluOps = {"relu", relu_forward, relu_backward, plain_destroy};

layer_t* layer_relu(int c, int h, int w) {
  layer_t* l = calloc(1, sizeof(*l));
  if (l == NULL) return NULL;
  l->ops = &kReluOps;
  l->in_c = l->out_c = c;
  l->in_h = l->out_h = h;
  l->in_w = l->out_w = w;
  l->in_size = l->out_size = c * h * w;
  return l;
}

/* ---------------------------------------------------------------- softmax cross-entropy */

static int argmax(const float* z, int n) {
  int best = 0;
  for (int k = 1; k < n; k++)
    if (z[k] > z[best]) best = k;
  return best;
}

double loss_softmax_xent(const float* logits, const uint8_t* labels, int batch, int classes,
                         float* dlogits, int* correct) {
  double loss = 0.0;
  for (int b = 0; b < batch; b++) {
    const float* z = logits + (size_t)b * classes;
    float* dz = dlogits + (size_t)b * classes;
    const int top = argmax(z, classes);
    const float zmax = z[top];
    float sum = 0.0f;
    for (int k = 0; k < classes; k++) sum += (dz[k] = expf(z[k] - zmax));
    const float inv = 1.0f / sum;
    for (int k = 0; k < classes; k++) dz[k] *= inv;
    dz[labels[b]] -= 1.0f;
    loss += (double)(logf(sum) - (z[labels[b]] - zmax));
    if (top == labels[b]) ++*correct;
  }
  return loss;
}

int loss_count_correct(const float* logits, const uint8_t* labels, int batch, int classes) {
  int correct = 0;
  for (int b = 0; b < batch; b++)
    correct += argmax(logits + (size_t)b * classes, classes) == labels[b];
  return correct;
}
