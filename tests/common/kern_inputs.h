/*
 * Inputs for the reduce-copy kernel tests, shared by the CPU grid
 * emulation's test (tests/unit/test_kern_cuda.c) and the GPU's
 * (tests/gpu/kern_bitwise.cu, C++): random bits salted with each float
 * width's special values, and premul factors; the canonical tree's
 * reference. Header-only, deterministic.
 */
#ifndef BRAID_KERN_INPUTS_H_
#define BRAID_KERN_INPUTS_H_

#include <stdint.h>
#include <string.h>

#include "kernels.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t rnd(void) {
  g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
  return g_rng;
}

/* Special bit patterns of each float width, mixed into the random inputs. */
static const uint64_t k_special16[] = {0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfe55, 0x8000,
                                       0x0000, 0x0001, 0x03ff, 0x7bff, 0x3c00};
static const uint64_t k_special_bf[] = {0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffa5,
                                        0x8000, 0x0001, 0x007f, 0x7f7f, 0x3f80};
static const uint64_t k_special8[] = {0x7f, 0xff, 0x7e, 0x7b, 0x7c, 0x7d, 0x80, 0x00, 0x01, 0xfb};
static const uint64_t k_special32[] = {0x7f800000, 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345,
                                       0x80000000, 0x00000001, 0x007fffff, 0x7f7fffff, 0x3f800000};
static const uint64_t k_special64[] = {
    0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull, 0x7ff0000000000001ull,
    0xfff8000000001234ull, 0x8000000000000000ull, 0x0000000000000001ull, 0x3ff0000000000000ull};

static inline void fill(ncclDataType_t type, void* buf, size_t n) {
  size_t es = kern_type_size(type);
  const uint64_t* sp = NULL;
  size_t nsp = 0;
  switch (type) {
    case ncclFloat16:
      sp = k_special16, nsp = sizeof(k_special16) / 8;
      break;
    case ncclBfloat16:
      sp = k_special_bf, nsp = sizeof(k_special_bf) / 8;
      break;
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      sp = k_special8, nsp = sizeof(k_special8) / 8;
      break;
    case ncclFloat32:
      sp = k_special32, nsp = sizeof(k_special32) / 8;
      break;
    case ncclFloat64:
      sp = k_special64, nsp = sizeof(k_special64) / 8;
      break;
    default:
      break;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t v = rnd();
    if (nsp && v % 8 == 0) v = sp[(v >> 8) % nsp];
    /* keep most float values in a range where sums and products stay finite */
    else if (type == ncclFloat32 && v % 3)
      v = (v & 0x807fffffull) | ((uint64_t)(120 + (v >> 40) % 16) << 23);
    else if (type == ncclFloat64 && v % 3)
      v = (v & 0x800fffffffffffffull) | ((uint64_t)(1015 + (v >> 50) % 16) << 52);
    memcpy((char*)buf + i * es, &v, es);
  }
}

/* A random premul factor in the type's encoding (finite for floats). */
static inline uint64_t scalar_for(ncclDataType_t type) {
  uint64_t v = rnd();
  switch (type) {
    case ncclFloat16:
      return 0x3800 + v % 0x800; /* [0.5, 2) */
    case ncclBfloat16:
      return 0x3f00 + v % 0x100; /* [0.5, 2) */
    case ncclFloat8e4m3:
      return 0x30 + v % 0x10; /* [0.5, 2) */
    case ncclFloat8e5m2:
      return 0x38 + v % 0x8; /* [0.5, 2) */
    case ncclFloat32:
      return 0x3f000000u + v % 0x1000000u; /* [0.5, 2) */
    case ncclFloat64:
      return 0x3fe0000000000000ull + v % 0x20000000000000ull;
    default:
      return v;
  }
}

/* A CPU task of `type` and `op` on n elements, its premul factor
 * scalar_for's and, where `post`, avg's division by 1 to 7; its sources,
 * destinations and premul bits left to the caller. */
static inline void kern_task_like(struct kern_task* t, ncclDataType_t type, int op, int post,
                                  size_t n) {
  memset(t, 0, sizeof(*t));
  t->redop.type = type;
  t->redop.op = (enum kern_op)op;
  t->redop.scalar = scalar_for(type);
  t->redop.postdiv = post ? 1 + (uint32_t)(rnd() % 7) : 0;
  t->flags = post ? KERN_POST : 0;
  t->n = n;
}

/* The canonical tree (a task's `tree`: docs/determinism.md) made of the
 * CPU kernels' one- and two-source calls, level by level, into vals[0]:
 * each of the ns sources (n elements) multiplied on its own where its bit
 * of `pre` says, block base's value then base OP base + size where that
 * half holds a source, the root's combine (the last) with like's flags
 * (avg's division). vals[k] holds n elements; tmp too. */
static inline void kern_tree_reference(const struct kern_task* like, int ns, unsigned pre,
                                       const void* const* srcs, unsigned char* const* vals,
                                       unsigned char* tmp) {
  struct kern_task t = *like;
  size_t len = like->n * kern_type_size(like->redop.type);
  int combines = 0;
  t.ndsts = 1;
  for (int k = 0; k < ns; k++) {
    if (((pre >> k) & 1u) == 0) {
      memcpy(vals[k], srcs[k], len);
      continue;
    }
    t.pre = 1u, t.flags = 0, t.nsrcs = 1, t.srcs[0] = srcs[k], t.dsts[0] = vals[k];
    kern_task_run(&t);
  }
  for (int size = 1; size < ns; size *= 2)
    for (int base = 0; base + size < ns; base += 2 * size) {
      t.pre = 0, t.flags = ++combines == ns - 1 ? like->flags : 0u;
      t.nsrcs = 2, t.srcs[0] = vals[base], t.srcs[1] = vals[base + size], t.dsts[0] = tmp;
      kern_task_run(&t);
      memcpy(vals[base], tmp, len);
    }
}

#endif
