/* The layer interface of braid-train. A layer maps a batch of `in_size` floats per sample to
 * `out_size` floats per sample; its parameters live in the model's flat buffers as
 * [bias | weight rows], and backward hands finished gradient pieces to a sink so that the
 * buckets holding them can be all-reduced while the rest of backward runs. */
#ifndef TRAIN_LAYER_H_
#define TRAIN_LAYER_H_

#include <stddef.h>
#include <stdint.h>

/* Where backward reports gradients. Offsets index the flat gradient buffer; a model lays its
 * layers out in backward order, so `ready` only ever grows during one backward pass. */
typedef struct {
  void* ctx;
  /* End of the bucket holding element `offset`: weight gradients are computed in pieces that
   * end there, so each bucket can leave as soon as its last piece exists. */
  size_t (*boundary)(void* ctx, size_t offset);
  /* Every gradient before `end` is final for this step. */
  void (*ready)(void* ctx, size_t end);
  /* When not NULL, called between two pieces of backward work (see cores.h). */
  void (*turn)(void);
  /* 1: pieces end on a fixed grid of rows, never at bucket ends. OpenBLAS's bits for an element
   * depend on the shape of the GEMM that computes it, so only then do the gradients, and a
   * deterministic run's weights, not depend on the bucket sizes (--deterministic). */
  int fixed_grid;
} grad_sink_t;

typedef struct layer layer_t;

typedef struct {
  const char* kind;
  void (*forward)(layer_t* l, const float* in, float* out, int batch);
  /* din may be NULL (the first layer): then the input gradient is not computed. */
  void (*backward)(layer_t* l, const float* in, const float* out, const float* dout, float* din,
                   int batch, const grad_sink_t* sink);
  void (*destroy)(layer_t* l);
} layer_ops_t;

struct layer {
  const layer_ops_t* ops;
  int in_c, in_h, in_w;    /* input shape per sample (dense: in_c features, 1 x 1) */
  int out_c, out_h, out_w; /* output shape per sample */
  int in_size, out_size;   /* floats per sample */
  size_t nbias, nweight;   /* parameters: nbias biases then nweight weights */
  size_t offset;           /* of the bias in the model's flat buffers */
  float* params;           /* bias, then weight rows: set by the model */
  float* grads;            /* same layout in the gradient buffer */
  size_t fan_in;           /* inputs per output unit, for initialization */
};

/* Constructors: workspace for up to max_batch samples is allocated here, once. NULL when
 * allocation fails or the shape is impossible. */
layer_t* layer_dense(int in, int out, int max_batch);
layer_t* layer_relu(int c, int h, int w);
/* Stride 1, square kernel k, zero padding pad on every side. */
layer_t* layer_conv(int in_c, int h, int w, int out_c, int k, int pad, int max_batch);
/* Non-overlapping max pooling over size x size windows (a ragged edge is dropped). */
layer_t* layer_maxpool(int c, int h, int w, int size, int max_batch);

/* Softmax cross-entropy over `classes` logits per sample: writes dlogits = softmax - onehot
 * (the gradient of the summed loss), returns the summed loss, adds the correct count. */
double loss_softmax_xent(const float* logits, const uint8_t* labels, int batch, int classes,
                         float* dlogits, int* correct);

/* Number of correct argmax predictions (evaluation, no gradient). */
int loss_count_correct(const float* logits, const uint8_t* labels, int batch, int classes);

/* Shared by the parametric layers: report the bias, then compute weight rows [0, rows) in
 * pieces that end on bucket boundaries, calling piece(l, r0, r1, ctx) for each. */
void layer_weight_pieces(layer_t* l, const grad_sink_t* sink, size_t row_len,
                         void (*piece)(layer_t* l, int r0, int r1, void* ctx), void* ctx);

#endif /* TRAIN_LAYER_H_ */
