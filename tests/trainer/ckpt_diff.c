/*
 * trainer_ckpt_diff A B [TOL]: compares the weights and momentum of two braid-train
 * checkpoints (rank 0's, and their position in the run). TOL 0 (the default) asks for bitwise
 * equality, and of every rank's state too (parameters, momentum, residuals, queued gradients:
 * a resumed run must carry on exactly); otherwise every weight and momentum value may differ
 * by TOL x (1 + |value|). Exit 0 when they match, 1 when not, 2 when a file cannot be read.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"

typedef struct {
  ckpt_meta_t meta;
  float *params, *velocity;
  size_t n;
  float* states; /* a copy */
  int state_ranks;
  size_t state_floats;
} loaded_t;

static int load(const char* path, loaded_t* out) {
  ckpt_blob_t blob;
  char err[8192];
  epoch_row_t rows[1];
  if (ckpt_read(path, &blob, err, sizeof(err)) != 0) goto fail;
  out->n = ckpt_nparams(&blob);
  out->params = malloc((out->n + 1) * sizeof(float));
  out->velocity = malloc((out->n + 1) * sizeof(float));
  if (out->n == 0 || !out->params || !out->velocity ||
      ckpt_parse(&blob, &out->meta, rows, 1, out->params, out->velocity, out->n, err,
                 sizeof(err)) != 0) {
    if (out->n == 0) snprintf(err, sizeof(err), "not a valid checkpoint");
    goto fail;
  }
  const float* states = ckpt_states(&blob, &out->state_ranks, &out->state_floats);
  size_t nstates = (size_t)out->state_ranks * out->state_floats;
  out->states = malloc((nstates + 1) * sizeof(float));
  if (out->states == NULL) goto fail;
  if (nstates) memcpy(out->states, states, nstates * sizeof(float));
  ckpt_blob_free(&blob);
  return 0;
fail:
  fprintf(stderr, "trainer_ckpt_diff: %s: %s\n", path, err);
  return -1;
}

/* Largest |a-b| / (1+|a|) and where. */
static double worst(const float* a, const float* b, size_t n, size_t* at, size_t* differing) {
  double w = 0;
  *differing = 0;
  for (size_t i = 0; i < n; i++) {
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) ++*differing;
    double d = fabs((double)a[i] - b[i]) / (1.0 + fabs((double)a[i]));
    if (d > w || isnan(d)) {
      w = isnan(d) ? INFINITY : d;
      *at = i;
    }
  }
  return w;
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: trainer_ckpt_diff A B [TOL]\n");
    return 2;
  }
  const double tol = argc == 4 ? atof(argv[3]) : 0.0;
  loaded_t a, b;
  if (load(argv[1], &a) != 0 || load(argv[2], &b) != 0) return 2;
  if (a.n != b.n) {
    printf("different models: %zu vs %zu parameters\n", a.n, b.n);
    return 1;
  }
  if (a.meta.epoch != b.meta.epoch || a.meta.step != b.meta.step ||
      a.meta.global_step != b.meta.global_step) {
    printf("different positions: epoch %d step %d (%lld updates) vs epoch %d step %d (%lld)\n",
           a.meta.epoch, a.meta.step, (long long)a.meta.global_step, b.meta.epoch, b.meta.step,
           (long long)b.meta.global_step);
    return 1;
  }
  size_t pat = 0, vat = 0, pdiff, vdiff;
  double pw = worst(a.params, b.params, a.n, &pat, &pdiff);
  double vw = worst(a.velocity, b.velocity, a.n, &vat, &vdiff);
  printf(
      "%zu parameters: %zu weights and %zu momentum values differ bitwise; largest relative "
      "difference %.3g (weight %zu), %.3g (momentum %zu); tolerance %g\n",
      a.n, pdiff, vdiff, pw, pat, vw, vat, tol);
  int same = tol == 0 ? pdiff == 0 && vdiff == 0 : pw <= tol && vw <= tol;
  if (tol == 0 && same) { /* every rank's state, bitwise */
    size_t nstates = (size_t)a.state_ranks * a.state_floats, sdiff = 0;
    if (a.state_ranks != b.state_ranks || a.state_floats != b.state_floats) {
      printf("different rank states: %d x %zu vs %d x %zu floats\n", a.state_ranks, a.state_floats,
             b.state_ranks, b.state_floats);
      return 1;
    }
    for (size_t i = 0; i < nstates; i++)
      sdiff += memcmp(&a.states[i], &b.states[i], sizeof(float)) != 0;
    printf("%d ranks' states of %zu floats: %zu differ bitwise\n", a.state_ranks, a.state_floats,
           sdiff);
    same = sdiff == 0;
  }
  return same ? 0 : 1;
}
