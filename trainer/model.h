/* Model assembly: a chain of layers with a softmax cross-entropy head, one flat parameter
 * buffer and one flat gradient buffer laid out in backward order (last layer first), and the
 * activations for the largest batch, all allocated once. */
#ifndef TRAIN_MODEL_H_
#define TRAIN_MODEL_H_

#include <stddef.h>
#include <stdint.h>

#include "layer.h"
#include "rng.h"

#define MODEL_MAX_LAYERS 24
#define MODEL_MAX_WIDTHS 8

typedef enum { MODEL_MLP, MODEL_CNN } model_kind_t;

typedef struct {
  model_kind_t kind;
  int hidden[MODEL_MAX_WIDTHS]; /* dense hidden widths (for the CNN: after the conv layers) */
  int nhidden;
  int channels[MODEL_MAX_WIDTHS]; /* CNN: output channels of each conv+pool stage */
  int nchannels;
  int kernel; /* CNN: square kernel size, odd; padding keeps the size */
} model_spec_t;

typedef struct {
  int nlayers, max_batch, classes;
  layer_t* layers[MODEL_MAX_LAYERS];
  size_t nparams;
  float* params;
  float* grads;
  float* acts[MODEL_MAX_LAYERS + 1];  /* acts[0] is the input, acts[i+1] layer i's output */
  float* dacts[MODEL_MAX_LAYERS + 1]; /* their gradients (dacts[0] unused) */
  char desc[256];
  void (*turn)(void); /* when not NULL, called between layers (see cores.h) */
} model_t;

/* Builds the model for inputs of in_c x in_h x in_w and `classes` outputs. Returns 0, or -1
 * with a message. */
int model_build(model_t* m, const model_spec_t* spec, int in_c, int in_h, int in_w, int classes,
                int max_batch, char* err, size_t errlen);

/* He-normal weights, zero biases, drawn from rng layer by layer. */
void model_init_params(model_t* m, train_rng_t* rng);

/* Fill acts[0] (batch x input floats) before forward. */
static inline float* model_input(model_t* m) {
  return m->acts[0];
}

/* Returns the logits (batch x classes). */
const float* model_forward(model_t* m, int batch);

/* Loss head and backward pass: fills grads (sums over the batch, not means), reporting pieces
 * to sink (may be NULL). Returns the summed loss; adds correct predictions to *correct. */
double model_backward(model_t* m, const uint8_t* labels, int batch, const grad_sink_t* sink,
                      int* correct);

/* Whether parameter tensors decay: weights yes, biases no. Calls fn for each tensor. */
void model_tensors(const model_t* m, void (*fn)(size_t offset, size_t count, int decay, void* ctx),
                   void* ctx);

void model_free(model_t* m);

/* "mlp" / "cnn" <-> kind; widths "512,256" <-> array. 0 on success. */
int model_kind_parse(const char* s, model_kind_t* kind);
const char* model_kind_name(model_kind_t kind);
int model_widths_parse(const char* s, int* out, int* n);
void model_widths_format(const int* w, int n, char* out, size_t outlen);

#endif /* TRAIN_MODEL_H_ */
