/*
 * braid-train's layers against finite differences: dense, ReLU, conv (im2col + GEMM), max
 * pooling, softmax cross-entropy, and whole small MLP and CNN models. Also checks that
 * computing a weight gradient in bucket-sized pieces gives the same gradient.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layer.h"
#include "model.h"
#include "rng.h"

#define STEP 1e-2 /* finite-difference step: the layers are (piecewise) linear or smooth */
#define ABS_TOL 2e-3
#define REL_TOL 1e-2
#define BATCH 3

typedef struct {
  layer_t* l;
  float *params, *grads, *x, *y, *dy, *dx;
  int batch;
} rig_t;

static train_rng_t g_rng;

static float uniform(double lo, double hi) {
  return (float)(lo + (hi - lo) * (train_rng_unit(&g_rng)));
}

/* Values at least `gap` away from zero, so ReLU's kink is never inside a difference step. */
static float away_from_zero(double gap) {
  float v = uniform(gap, 1.0);
  return train_rng_below(&g_rng, 2) ? v : -v;
}

static rig_t rig_new(layer_t* l, int batch) {
  assert_non_null(l);
  rig_t r = {.l = l, .batch = batch};
  size_t np = l->nbias + l->nweight;
  r.params = calloc(np + 1, sizeof(float));
  r.grads = calloc(np + 1, sizeof(float));
  r.x = calloc((size_t)batch * l->in_size, sizeof(float));
  r.y = calloc((size_t)batch * l->out_size, sizeof(float));
  r.dy = calloc((size_t)batch * l->out_size, sizeof(float));
  r.dx = calloc((size_t)batch * l->in_size, sizeof(float));
  l->params = r.params;
  l->grads = r.grads;
  l->offset = 0;
  for (size_t i = 0; i < np; i++) r.params[i] = uniform(-0.5, 0.5);
  for (int i = 0; i < batch * l->in_size; i++) r.x[i] = away_from_zero(0.05);
  for (int i = 0; i < batch * l->out_size; i++) r.dy[i] = uniform(-1, 1);
  return r;
}

static void rig_free(rig_t* r) {
  r->l->ops->destroy(r->l);
  free(r->params);
  free(r->grads);
  free(r->x);
  free(r->y);
  free(r->dy);
  free(r->dx);
}

/* L = sum(dy * layer(x)): its gradient is what backward computes from dout = dy. */
static double objective(rig_t* r) {
  r->l->ops->forward(r->l, r->x, r->y, r->batch);
  double s = 0;
  for (int i = 0; i < r->batch * r->l->out_size; i++) s += (double)r->dy[i] * r->y[i];
  return s;
}

static void expect_close(double numeric, double analytic, const char* what, size_t i) {
  double tol = ABS_TOL + REL_TOL * fmax(fabs(numeric), fabs(analytic));
  if (fabs(numeric - analytic) > tol) {
    print_error("%s[%zu]: finite difference %.6f, backward %.6f\n", what, i, numeric, analytic);
    fail();
  }
}

static double central_difference(rig_t* r, float* v) {
  const float saved = *v;
  *v = saved + (float)STEP;
  double up = objective(r);
  *v = saved - (float)STEP;
  double down = objective(r);
  *v = saved;
  return (up - down) / (2 * STEP);
}

static void check_layer(rig_t* r) {
  objective(r);
  r->l->ops->backward(r->l, r->x, r->y, r->dy, r->dx, r->batch, NULL);
  const size_t np = r->l->nbias + r->l->nweight;
  float* grads = malloc((np + 1) * sizeof(float));
  float* dx = malloc((size_t)r->batch * r->l->in_size * sizeof(float));
  memcpy(grads, r->grads, np * sizeof(float));
  memcpy(dx, r->dx, (size_t)r->batch * r->l->in_size * sizeof(float));
  for (size_t i = 0; i < np; i++)
    expect_close(central_difference(r, &r->params[i]), grads[i], "param", i);
  for (int i = 0; i < r->batch * r->l->in_size; i++)
    expect_close(central_difference(r, &r->x[i]), dx[i], "input", (size_t)i);
  free(grads);
  free(dx);
}

static void test_dense(void** state) {
  (void)state;
  rig_t r = rig_new(layer_dense(7, 5, BATCH), BATCH);
  check_layer(&r);
  rig_free(&r);
}

static void test_relu(void** state) {
  (void)state;
  rig_t r = rig_new(layer_relu(2, 3, 4), BATCH);
  check_layer(&r);
  rig_free(&r);
}

static void test_conv(void** state) {
  (void)state;
  rig_t r = rig_new(layer_conv(2, 6, 5, 3, 3, 1, BATCH), BATCH);
  check_layer(&r);
  rig_free(&r);
}

static void test_conv_no_padding(void** state) {
  (void)state;
  rig_t r = rig_new(layer_conv(1, 7, 7, 2, 5, 0, BATCH), BATCH);
  assert_int_equal(r.l->out_h, 3);
  check_layer(&r);
  rig_free(&r);
}

/* Window values are spread on a grid much coarser than the step, so no maximum changes. */
static void test_maxpool(void** state) {
  (void)state;
  rig_t r = rig_new(layer_maxpool(2, 4, 6, 2, BATCH), BATCH);
  const int n = BATCH * r.l->in_size;
  for (int i = 0; i < n; i++) r.x[i] = (float)i * 0.1f;
  for (int i = n - 1; i > 0; i--) { /* shuffle the distinct values */
    int j = (int)train_rng_below(&g_rng, (uint64_t)i + 1);
    float t = r.x[i];
    r.x[i] = r.x[j];
    r.x[j] = t;
  }
  check_layer(&r);
  rig_free(&r);
}

static void test_softmax_xent(void** state) {
  (void)state;
  enum { B = 4, C = 6 };
  float z[B * C], dz[B * C], scratch[B * C];
  uint8_t y[B] = {0, 5, 2, 2};
  for (int i = 0; i < B * C; i++) z[i] = uniform(-3, 3);
  int correct = 0;
  loss_softmax_xent(z, y, B, C, dz, &correct);
  for (int i = 0; i < B * C; i++) {
    const float saved = z[i];
    int ignored = 0;
    z[i] = saved + 1e-2f;
    double up = loss_softmax_xent(z, y, B, C, scratch, &ignored);
    z[i] = saved - 1e-2f;
    double down = loss_softmax_xent(z, y, B, C, scratch, &ignored);
    z[i] = saved;
    expect_close((up - down) / 2e-2, dz[i], "logit", (size_t)i);
  }
  /* a confident right answer costs almost nothing and counts as correct */
  float sure[C] = {0, 0, 30, 0, 0, 0};
  uint8_t two = 2;
  correct = 0;
  assert_true(loss_softmax_xent(sure, &two, 1, C, scratch, &correct) < 1e-6);
  assert_int_equal(correct, 1);
  assert_int_equal(loss_count_correct(sure, &two, 1, C), 1);
}

/* ---------------------------------------------------------------- whole models */

static double model_loss(model_t* m, const float* x, const uint8_t* y, int batch) {
  memcpy(model_input(m), x, sizeof(float) * batch * m->layers[0]->in_size);
  model_forward(m, batch);
  float* scratch = malloc(sizeof(float) * batch * m->classes);
  int ignored = 0;
  double loss = loss_softmax_xent(m->acts[m->nlayers], y, batch, m->classes, scratch, &ignored);
  free(scratch);
  return loss;
}

static void check_model(const model_spec_t* spec, int c, int h, int w, int classes) {
  model_t m;
  char err[256];
  assert_int_equal(model_build(&m, spec, c, h, w, classes, BATCH, err, sizeof(err)), 0);
  train_rng_t init;
  train_rng_seed(&init, 7, 1);
  model_init_params(&m, &init);
  const int in = m.layers[0]->in_size;
  float* x = malloc(sizeof(float) * BATCH * in);
  uint8_t y[BATCH];
  for (int i = 0; i < BATCH * in; i++) x[i] = uniform(-1, 1);
  for (int b = 0; b < BATCH; b++) y[b] = (uint8_t)train_rng_below(&g_rng, (uint64_t)classes);
  model_loss(&m, x, y, BATCH);
  int correct = 0;
  model_backward(&m, y, BATCH, NULL, &correct);
  float* grads = malloc(sizeof(float) * m.nparams);
  memcpy(grads, m.grads, sizeof(float) * m.nparams);
  for (size_t i = 0; i < m.nparams; i++) {
    const float saved = m.params[i];
    m.params[i] = saved + 1e-3f;
    double up = model_loss(&m, x, y, BATCH);
    m.params[i] = saved - 1e-3f;
    double down = model_loss(&m, x, y, BATCH);
    m.params[i] = saved;
    expect_close((up - down) / 2e-3, grads[i], "model param", i);
  }
  free(grads);
  free(x);
  model_free(&m);
}

static void test_mlp_model(void** state) {
  (void)state;
  model_spec_t spec = {.kind = MODEL_MLP, .hidden = {9, 6}, .nhidden = 2};
  check_model(&spec, 1, 4, 4, 5);
}

static void test_cnn_model(void** state) {
  (void)state;
  model_spec_t spec = {.kind = MODEL_CNN,
                       .hidden = {5},
                       .nhidden = 1,
                       .channels = {2, 3},
                       .nchannels = 2,
                       .kernel = 3};
  check_model(&spec, 1, 8, 8, 4);
}

/* ---------------------------------------------------------------- gradient pieces */

typedef struct {
  size_t every;      /* a bucket boundary every this many elements */
  size_t last_ready; /* ready offsets must grow */
  int calls;
} fake_buckets_t;

static size_t fake_boundary(void* ctx, size_t offset) {
  const fake_buckets_t* f = ctx;
  return (offset / f->every + 1) * f->every;
}

static void fake_ready(void* ctx, size_t end) {
  fake_buckets_t* f = ctx;
  assert_true(end >= f->last_ready);
  f->last_ready = end;
  f->calls++;
}

static int g_turns; /* calls of count_turn: a turn has no context by design */

static void count_turn(void) {
  g_turns++;
}

static void check_pieces(layer_t* l) {
  rig_t r = rig_new(l, BATCH);
  const size_t np = l->nbias + l->nweight;
  objective(&r);
  l->ops->backward(l, r.x, r.y, r.dy, r.dx, BATCH, NULL);
  float* whole = malloc(np * sizeof(float));
  memcpy(whole, r.grads, np * sizeof(float));
  memset(r.grads, 0, np * sizeof(float));
  fake_buckets_t f = {.every = 13};
  grad_sink_t sink = {
      .ctx = &f, .boundary = fake_boundary, .ready = fake_ready, .turn = count_turn};
  g_turns = 0;
  l->ops->backward(l, r.x, r.y, r.dy, r.dx, BATCH, &sink);
  assert_int_equal(f.last_ready, np);
  assert_true(f.calls > 2); /* the weight really came in pieces */
  /* one ready for the bias, then one per piece; a turn between every two pieces */
  assert_int_equal(g_turns, f.calls - 2);
  for (size_t i = 0; i < np; i++) expect_close(whole[i], r.grads[i], "piecewise grad", i);
  free(whole);
  rig_free(&r);
}

static void test_pieces_dense(void** state) {
  (void)state;
  check_pieces(layer_dense(6, 9, BATCH));
}

static void test_pieces_conv(void** state) {
  (void)state;
  check_pieces(layer_conv(2, 5, 5, 6, 3, 1, BATCH));
}

/* Parameters are laid out last layer first, so backward finishes them front to back. */
static void test_backward_order(void** state) {
  (void)state;
  model_t m;
  char err[256];
  model_spec_t spec = {.kind = MODEL_MLP, .hidden = {8}, .nhidden = 1};
  assert_int_equal(model_build(&m, &spec, 1, 3, 3, 4, 2, err, sizeof(err)), 0);
  assert_int_equal(m.layers[m.nlayers - 1]->offset, 0);
  assert_true(m.layers[0]->offset > 0);
  assert_int_equal(m.layers[0]->offset + m.layers[0]->nbias + m.layers[0]->nweight, m.nparams);
  model_free(&m);
}

/* Turns between layers (cores.h) change when a rank computes, never what it computes. */
static void test_turns_keep_results(void** state) {
  (void)state;
  model_t m;
  char err[256];
  model_spec_t spec = {.kind = MODEL_MLP, .hidden = {8, 5}, .nhidden = 2};
  assert_int_equal(model_build(&m, &spec, 1, 3, 3, 4, BATCH, err, sizeof(err)), 0);
  model_init_params(&m, &g_rng);
  uint8_t labels[BATCH];
  for (int b = 0; b < BATCH; b++) labels[b] = (uint8_t)(b % 4);
  for (size_t i = 0; i < (size_t)BATCH * 9; i++) m.acts[0][i] = (float)train_rng_normal(&g_rng);
  fake_buckets_t f = {.every = 7};
  grad_sink_t sink = {.ctx = &f, .boundary = fake_boundary, .ready = fake_ready};
  int correct = 0;
  model_forward(&m, BATCH);
  double plain = model_backward(&m, labels, BATCH, &sink, &correct);
  float* grads = malloc(m.nparams * sizeof(float));
  memcpy(grads, m.grads, m.nparams * sizeof(float));
  m.turn = count_turn;
  g_turns = 0;
  f.last_ready = 0;
  model_forward(&m, BATCH);
  const int forward_turns = g_turns;
  double turned = model_backward(&m, labels, BATCH, &sink, &correct);
  assert_int_equal(forward_turns, m.nlayers - 1);
  assert_true(g_turns > forward_turns + m.nlayers); /* every layer, and between pieces */
  assert_true(plain == turned);
  assert_memory_equal(grads, m.grads, m.nparams * sizeof(float));
  free(grads);
  model_free(&m);
}

int main(void) {
  train_rng_seed(&g_rng, 12345, 99);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_dense),          cmocka_unit_test(test_relu),
      cmocka_unit_test(test_conv),           cmocka_unit_test(test_conv_no_padding),
      cmocka_unit_test(test_maxpool),        cmocka_unit_test(test_softmax_xent),
      cmocka_unit_test(test_mlp_model),      cmocka_unit_test(test_cnn_model),
      cmocka_unit_test(test_pieces_dense),   cmocka_unit_test(test_pieces_conv),
      cmocka_unit_test(test_backward_order), cmocka_unit_test(test_turns_keep_results),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
