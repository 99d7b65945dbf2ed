/* The two models of braid-train and the passes over their layer chains.
 * mlp: dense-relu ... dense.  cnn: (conv k x k, relu, maxpool 2) per stage, then the MLP part. */
#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "failure.h"

static int push(model_t* m, layer_t* l, char* err, size_t errlen) {
  if (l == NULL)
    return train_errorf(err, errlen, "cannot build layer %d: bad shape or out of memory",
                        m->nlayers);
  if (m->nlayers == MODEL_MAX_LAYERS) {
    l->ops->destroy(l);
    return train_errorf(err, errlen, "model has more than %d layers", MODEL_MAX_LAYERS);
  }
  m->layers[m->nlayers++] = l;
  return 0;
}

static void append(char* out, size_t outlen, const char* fmt, ...) {
  size_t used = strlen(out);
  if (used >= outlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(out + used, outlen - used, fmt, ap);
  va_end(ap);
}

static int add_conv_stages(model_t* m, const model_spec_t* s, int* c, int* h, int* w, char* err,
                           size_t errlen) {
  for (int i = 0; i < s->nchannels; i++) {
    if (push(m, layer_conv(*c, *h, *w, s->channels[i], s->kernel, s->kernel / 2, m->max_batch), err,
             errlen) ||
        push(m, layer_relu(s->channels[i], *h, *w), err, errlen) ||
        push(m, layer_maxpool(s->channels[i], *h, *w, 2, m->max_batch), err, errlen))
      return -1;
    *c = s->channels[i];
    *h /= 2;
    *w /= 2;
    append(m->desc, sizeof(m->desc), "conv%dx%dx%d-pool2-", s->kernel, s->kernel, *c);
  }
  return 0;
}

static int add_dense_stages(model_t* m, const model_spec_t* s, int in, int classes, char* err,
                            size_t errlen) {
  append(m->desc, sizeof(m->desc), "%d-", in);
  for (int i = 0; i < s->nhidden; i++) {
    if (push(m, layer_dense(in, s->hidden[i], m->max_batch), err, errlen) ||
        push(m, layer_relu(s->hidden[i], 1, 1), err, errlen))
      return -1;
    in = s->hidden[i];
    append(m->desc, sizeof(m->desc), "%d-", in);
  }
  append(m->desc, sizeof(m->desc), "%d", classes);
  return push(m, layer_dense(in, classes, m->max_batch), err, errlen);
}

/* Parameters in backward order, so that gradients finish front to back in the flat buffer. */
static void assign_offsets(model_t* m) {
  size_t off = 0;
  for (int i = m->nlayers - 1; i >= 0; i--) {
    m->layers[i]->offset = off;
    off += m->layers[i]->nbias + m->layers[i]->nweight;
  }
  m->nparams = off;
}

static int alloc_buffers(model_t* m, char* err, size_t errlen) {
  m->params = calloc(m->nparams ? m->nparams : 1, sizeof(float));
  m->grads = calloc(m->nparams ? m->nparams : 1, sizeof(float));
  if (m->params == NULL || m->grads == NULL)
    return train_errorf(err, errlen, "out of memory for parameters");
  for (int i = 0; i < m->nlayers; i++) {
    layer_t* l = m->layers[i];
    l->params = m->params + l->offset;
    l->grads = m->grads + l->offset;
  }
  for (int i = 0; i <= m->nlayers; i++) {
    size_t per = i == 0 ? (size_t)m->layers[0]->in_size : (size_t)m->layers[i - 1]->out_size;
    m->acts[i] = calloc(per * m->max_batch, sizeof(float));
    m->dacts[i] = i ? calloc(per * m->max_batch, sizeof(float)) : NULL;
    if (m->acts[i] == NULL || (i && m->dacts[i] == NULL))
      return train_errorf(err, errlen, "out of memory for activations");
  }
  return 0;
}

int model_build(model_t* m, const model_spec_t* spec, int in_c, int in_h, int in_w, int classes,
                int max_batch, char* err, size_t errlen) {
  memset(m, 0, sizeof(*m));
  m->max_batch = max_batch;
  m->classes = classes;
  snprintf(m->desc, sizeof(m->desc), "%s ", model_kind_name(spec->kind));
  int c = in_c, h = in_h, w = in_w, rc = 0;
  if (spec->kind == MODEL_CNN) {
    if (spec->kernel <= 0 || spec->kernel % 2 == 0)
      rc = train_errorf(err, errlen, "the CNN kernel must be odd, not %d", spec->kernel);
    if (rc == 0) rc = add_conv_stages(m, spec, &c, &h, &w, err, errlen);
    if (rc == 0 && (h < 1 || w < 1))
      rc = train_errorf(err, errlen, "too many pooling stages for %dx%d inputs", in_h, in_w);
  }
  if (rc == 0) rc = add_dense_stages(m, spec, c * h * w, classes, err, errlen);
  if (rc == 0) {
    assign_offsets(m);
    rc = alloc_buffers(m, err, errlen);
  }
  if (rc != 0) {
    model_free(m);
    return -1;
  }
  append(m->desc, sizeof(m->desc), " (%zu parameters)", m->nparams);
  return 0;
}

void model_init_params(model_t* m, train_rng_t* rng) {
  memset(m->params, 0, sizeof(float) * m->nparams);
  for (int i = 0; i < m->nlayers; i++) {
    layer_t* l = m->layers[i];
    if (l->nweight == 0) continue;
    const double std = sqrt(2.0 / (double)l->fan_in);
    float* w = l->params + l->nbias;
    for (size_t k = 0; k < l->nweight; k++) w[k] = (float)(std * train_rng_normal(rng));
  }
}

const float* model_forward(model_t* m, int batch) {
  for (int i = 0; i < m->nlayers; i++) {
    if (m->turn && i > 0) m->turn();
    m->layers[i]->ops->forward(m->layers[i], m->acts[i], m->acts[i + 1], batch);
  }
  return m->acts[m->nlayers];
}

double model_backward(model_t* m, const uint8_t* labels, int batch, const grad_sink_t* sink,
                      int* correct) {
  const int top = m->nlayers;
  double loss = loss_softmax_xent(m->acts[top], labels, batch, m->classes, m->dacts[top], correct);
  grad_sink_t with_turns;
  if (sink && m->turn) {
    with_turns = *sink;
    with_turns.turn = m->turn;
    sink = &with_turns;
  }
  for (int i = top - 1; i >= 0; i--) {
    layer_t* l = m->layers[i];
    if (m->turn) m->turn();
    l->ops->backward(l, m->acts[i], m->acts[i + 1], m->dacts[i + 1], i ? m->dacts[i] : NULL, batch,
                     sink);
  }
  return loss;
}

void model_tensors(const model_t* m, void (*fn)(size_t offset, size_t count, int decay, void* ctx),
                   void* ctx) {
  for (int i = m->nlayers - 1; i >= 0; i--) {
    const layer_t* l = m->layers[i];
    if (l->nbias) fn(l->offset, l->nbias, 0, ctx);
    if (l->nweight) fn(l->offset + l->nbias, l->nweight, 1, ctx);
  }
}

void model_free(model_t* m) {
  for (int i = 0; i < m->nlayers; i++) m->layers[i]->ops->destroy(m->layers[i]);
  for (int i = 0; i <= MODEL_MAX_LAYERS; i++) {
    free(m->acts[i]);
    free(m->dacts[i]);
  }
  free(m->params);
  free(m->grads);
  memset(m, 0, sizeof(*m));
}

int model_kind_parse(const char* s, model_kind_t* kind) {
  if (strcmp(s, "mlp") == 0)
    *kind = MODEL_MLP;
  else if (strcmp(s, "cnn") == 0)
    *kind = MODEL_CNN;
  else
    return -1;
  return 0;
}

const char* model_kind_name(model_kind_t kind) {
  return kind == MODEL_CNN ? "cnn" : "mlp";
}

int model_widths_parse(const char* s, int* out, int* n) {
  *n = 0;
  if (strcmp(s, "none") == 0 || *s == '\0') return 0;
  while (*s) {
    char* end;
    long v = strtol(s, &end, 10);
    if (end == s || v <= 0 || v > 1000000 || *n == MODEL_MAX_WIDTHS) return -1;
    out[(*n)++] = (int)v;
    if (*end == '\0') break;
    if (*end != ',') return -1;
    s = end + 1;
  }
  return 0;
}

void model_widths_format(const int* w, int n, char* out, size_t outlen) {
  out[0] = '\0';
  if (n == 0) snprintf(out, outlen, "none");
  for (int i = 0; i < n; i++) append(out, outlen, i ? ",%d" : "%d", w[i]);
}
