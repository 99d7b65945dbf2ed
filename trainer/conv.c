/* 2-D convolution, stride 1, as im2col + GEMM: each sample's input is unfolded into a
 * (in_c*k*k) x (out_h*out_w) matrix kept for backward, so forward, the weight gradient and the
 * input gradient are each one OpenBLAS call per sample. */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"

typedef struct {
  layer_t base;
  int k, pad;
  size_t col_rows, col_cols; /* in_c*k*k, out_h*out_w */
  float* cols;               /* max_batch unfolded inputs */
  float* dcol;               /* one sample's unfolded input gradient */
} conv_t;

typedef struct {
  const float* dout;
  int batch;
} conv_grad_t;

static void im2col(const conv_t* c, const float* in, float* col) {
  const layer_t* l = &c->base;
  const int k = c->k, oh = l->out_h, ow = l->out_w, h = l->in_h, w = l->in_w;
  for (int ch = 0; ch < l->in_c; ch++)
    for (int ky = 0; ky < k; ky++)
      for (int kx = 0; kx < k; kx++) {
        float* row = col + ((size_t)(ch * k + ky) * k + kx) * c->col_cols;
        const float* plane = in + (size_t)ch * h * w;
        for (int oy = 0; oy < oh; oy++) {
          const int iy = oy + ky - c->pad;
          for (int ox = 0; ox < ow; ox++) {
            const int ix = ox + kx - c->pad;
            int inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
            row[oy * ow + ox] = inside ? plane[iy * w + ix] : 0.0f;
          }
        }
      }
}

/* The adjoint of im2col: adds every unfolded entry back onto the pixel it came from. */
static void col2im(const conv_t* c, const float* col, float* in) {
  const layer_t* l = &c->base;
  const int k = c->k, oh = l->out_h, ow = l->out_w, h = l->in_h, w = l->in_w;
  memset(in, 0, sizeof(float) * l->in_size);
  for (int ch = 0; ch < l->in_c; ch++)
    for (int ky = 0; ky < k; ky++)
      for (int kx = 0; kx < k; kx++) {
        const float* row = col + ((size_t)(ch * k + ky) * k + kx) * c->col_cols;
        float* plane = in + (size_t)ch * h * w;
        for (int oy = 0; oy < oh; oy++) {
          const int iy = oy + ky - c->pad;
          if (iy < 0 || iy >= h) continue;
          for (int ox = 0; ox < ow; ox++) {
            const int ix = ox + kx - c->pad;
            if (ix >= 0 && ix < w) plane[iy * w + ix] += row[oy * ow + ox];
          }
        }
      }
}

static void conv_forward(layer_t* l, const float* in, float* out, int batch) {
  conv_t* c = (conv_t*)l;
  const int m = l->out_c, n = (int)c->col_cols, kk = (int)c->col_rows;
  const float* bias = l->params;
  const float* w = l->params + l->nbias;
  for (int b = 0; b < batch; b++) {
    float* col = c->cols + (size_t)b * c->col_rows * c->col_cols;
    float* y = out + (size_t)b * l->out_size;
    im2col(c, in + (size_t)b * l->in_size, col);
    for (int o = 0; o < m; o++)
      for (int j = 0; j < n; j++) y[(size_t)o * n + j] = bias[o];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, kk, 1.0f, w, kk, col, n, 1.0f, y,
                n);
  }
}

/* dW[r0..r1) = sum over samples of dout[r0..r1) col^T */
static void conv_weight_rows(layer_t* l, int r0, int r1, void* ctx) {
  const conv_t* c = (const conv_t*)l;
  const conv_grad_t* g = ctx;
  const int n = (int)c->col_cols, kk = (int)c->col_rows;
  float* dw = l->grads + l->nbias + (size_t)r0 * kk;
  for (int b = 0; b < g->batch; b++) {
    const float* col = c->cols + (size_t)b * c->col_rows * c->col_cols;
    const float* dy = g->dout + (size_t)b * l->out_size + (size_t)r0 * n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, kk, n, 1.0f, dy, n, col, n,
                b ? 1.0f : 0.0f, dw, kk);
  }
}

static void conv_backward(layer_t* l, const float* in, const float* out, const float* dout,
                          float* din, int batch, const grad_sink_t* sink) {
  (void)in;
  (void)out;
  conv_t* c = (conv_t*)l;
  const int m = l->out_c, n = (int)c->col_cols, kk = (int)c->col_rows;
  float* db = l->grads;
  memset(db, 0, sizeof(float) * m);
  for (int b = 0; b < batch; b++)
    for (int o = 0; o < m; o++) {
      const float* dy = dout + (size_t)b * l->out_size + (size_t)o * n;
      float s = 0.0f;
      for (int j = 0; j < n; j++) s += dy[j];
      db[o] += s;
    }
  conv_grad_t g = {dout, batch};
  layer_weight_pieces(l, sink, (size_t)kk, conv_weight_rows, &g);
  if (din == NULL) return;
  const float* w = l->params + l->nbias;
  for (int b = 0; b < batch; b++) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kk, n, m, 1.0f, w, kk,
                dout + (size_t)b * l->out_size, n, 0.0f, c->dcol, n);
    col2im(c, c->dcol, din + (size_t)b * l->in_size);
  }
}

static void conv_destroy(layer_t* l) {
  conv_t* c = (conv_t*)l;
  free(c->cols);
  free(c->dcol);
  free(c);
}

static const layer_ops_t kConvOps = {"conv", conv_forward, conv_backward, conv_destroy};

layer_t* layer_conv(int in_c, int h, int w, int out_c, int k, int pad, int max_batch) {
  const int oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
  if (in_c <= 0 || out_c <= 0 || k <= 0 || pad < 0 || oh <= 0 || ow <= 0 || max_batch <= 0)
    return NULL;
  conv_t* c = calloc(1, sizeof(*c));
  if (c == NULL) return NULL;
  layer_t* l = &c->base;
  l->ops = &kConvOps;
  l->in_c = in_c;
  l->in_h = h;
  l->in_w = w;
  l->out_c = out_c;
  l->out_h = oh;
  l->out_w = ow;
  l->in_size = in_c * h * w;
  l->out_size = out_c * oh * ow;
  l->nbias = (size_t)out_c;
  l->nweight = (size_t)out_c * in_c * k * k;
  l->fan_in = (size_t)in_c * k * k;
  c->k = k;
  c->pad = pad;
  c->col_rows = (size_t)in_c * k * k;
  c->col_cols = (size_t)oh * ow;
  c->cols = malloc(sizeof(float) * c->col_rows * c->col_cols * (size_t)max_batch);
  c->dcol = malloc(sizeof(float) * c->col_rows * c->col_cols);
  if (c->cols == NULL || c->dcol == NULL) {
    conv_destroy(l);
    return NULL;
  }
  return l;
}
