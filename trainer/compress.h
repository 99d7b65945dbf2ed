/* Gradient compression for braid-train (--compress): what a rank hands to Braid instead of
 * its float32 values, and the error feedback that makes lossy schemes converge. Every lossy
 * scheme keeps a residual per rank: what this step's encoding lost is added to the next
 * step's values before they are encoded (Seide et al.; Karimireddy et al., "Error Feedback
 * Fixes SignSGD"), so nothing is dropped, only delayed.
 *
 *   fp16, bf16  values rounded to nearest even; Braid all-reduces them in that type
 *   fp8         e4m3 (max 448, saturating) after multiplying by a scale all ranks agree on,
 *               so small gradients do not flush to zero
 *   topk:F      the largest F of the values by magnitude as (index, value) pairs; the
 *               others stay in the residual */
#ifndef TRAIN_COMPRESS_H_
#define TRAIN_COMPRESS_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

typedef enum {
  COMPRESS_NONE,
  COMPRESS_FP16,
  COMPRESS_BF16,
  COMPRESS_FP8,
  COMPRESS_TOPK
} compress_kind_t;

typedef struct {
  compress_kind_t kind;
  double fraction; /* topk: the share of values sent, (0, 1] */
} compress_spec_t;

/* "none", "fp16", "bf16", "fp8", "topk:F"; 0 on success. */
int compress_parse(const char* s, compress_spec_t* out);
/* The same text back ("topk:0.01"). */
void compress_format(const compress_spec_t* c, char* out, size_t outlen);

/* Whether the scheme loses information (and so keeps a residual). */
static inline int compress_lossy(const compress_spec_t* c) {
  return c->kind != COMPRESS_NONE;
}

/* The element type a dense scheme hands to Braid, and its size. */
ncclDataType_t compress_nccl_type(compress_kind_t kind);
size_t compress_elem_bytes(compress_kind_t kind);

/* Dense encoding (fp16, bf16 or fp8) of n values x plus the residual r: out gets the
 * encoding of x + r (times `scale` first for fp8, 1 otherwise), r what it lost (in x's
 * units). */
void compress_encode(compress_kind_t kind, const float* x, float* r, void* out, size_t n,
                     float scale);
/* out = encoded values (fp16, bf16 or fp8) x (1 / scale), as the encoder reckons what it
 * sent. */
void compress_decode(compress_kind_t kind, const void* in, float* out, size_t n, float scale);

/* The largest magnitude of x + r (what fp8's scale is taken from). */
float compress_amax(const float* x, const float* r, size_t n);
/* fp8's scale for values whose sum over `world` ranks reached `amax`: room for twice that
 * before the sum saturates at e4m3's 448. 0 when amax is 0 or not finite. */
float compress_fp8_scale(float amax);

/* How many pairs topk sends of n values: ceil(fraction * n), at least 1. */
size_t compress_topk_count(double fraction, size_t n);
/* topk: the k largest |x + r| of n (ties to the lower index) into pairs (2k words: index
 * offset by `base`, then the float's bits), r what was not sent; scratch holds
 * COMPRESS_TOPK_SCRATCH(n) words. */
#define COMPRESS_TOPK_SCRATCH(n) ((n) + 65536)
void compress_topk_encode(const float* x, float* r, size_t n, size_t k, uint32_t base,
                          uint32_t* pairs, uint32_t* scratch);
/* out[index] += value for k pairs, in order. */
void compress_topk_add(const uint32_t* pairs, size_t k, float* out);

#endif /* TRAIN_COMPRESS_H_ */
