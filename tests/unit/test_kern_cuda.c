/*
 * The CUDA reduce-copy kernel's body (kernels/cuda/kern_body.h), run by the
 * CPU grid emulation, against the CPU kernels (kern_task_run): every type x
 * operator x flags (premul on some sources, avg's division) x source count
 * (1, 2, 3, 8) x destination count x length x element offset, on random
 * bits salted with the special values (NaNs with payloads, infinities,
 * signed zeros, subnormals), compared bit for bit; and tasks of several
 * rows, row by row; tasks in the canonical tree's order (the
 * deterministic mode's) against that tree made of CPU calls. tests/gpu
 * runs the same
 * comparison on a real GPU.
 *
 * The kernel's fast path computes with the hardware's arithmetic and
 * conversions (emulated here with the GPU's canonical NaNs) and sends a
 * 16-byte vector with a NaN lane to the exact path: numbers alone must give
 * the CPU's bits without that fix-up (signed zeros in max and min, fp8
 * saturation, subnormals), and a NaN in any one lane must reach it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/kern_emulate.h"
#include "common/kern_inputs.h"
#include "kernels.h"

#define MAX_N 4099
#define MAX_OFF 3
static const size_t k_lens[] = {0, 1, 2, 7, 33, 64, 1000, MAX_N};
static const int k_nsrcs[] = {1, 2, 3, 8};

struct bufs { /* 64-byte aligned: offsets 0..3 reach both the vector and the scalar paths */
  _Alignas(64) unsigned char src[KERN_TASK_MAX_SRCS][(MAX_N + MAX_OFF) * 8];
  unsigned char cpu[3][(MAX_N + MAX_OFF) * 8];
  unsigned char gpu[3][(MAX_N + MAX_OFF) * 8];
};

/* Which emulation runs: the default one (sm_89 and up) or sm_80's. */
static int g_sm80;

static void emulate(const struct kern_dev_task* d, unsigned grid, unsigned block) {
  (g_sm80 ? kern_emulate_reduce_copy_sm80 : kern_emulate_reduce_copy)(d, grid, block);
}

static unsigned long fixup_count(void) {
  return g_sm80 ? kern_emulate_fixups_sm80() : kern_emulate_fixups();
}

/* Finite inputs that no task here takes to a NaN: random values in [-2, 2)
 * and, one in eight, a corner of the type (signed zeros, the smallest and
 * largest subnormals, for fp8 the largest value, which sums saturate at). */
static const uint64_t k_clean16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff};
static const uint64_t k_clean_bf[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x007f, 0x807f};
static const uint64_t k_clean_e4m3[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x87, 0x7e, 0xfe};
static const uint64_t k_clean_e5m2[] = {0x00, 0x80, 0x01, 0x81, 0x03, 0x83, 0x7b, 0xfb};
static const uint64_t k_clean32[] = {0x0, 0x80000000, 0x1, 0x80000001, 0x007fffff, 0x807fffff};
static const uint64_t k_clean64[] = {0x0,
                                     0x8000000000000000ull,
                                     0x1,
                                     0x8000000000000001ull,
                                     0x000fffffffffffffull,
                                     0x800fffffffffffffull};
#define NSP(a) (sizeof(a) / sizeof((a)[0]))

static void fill_clean(ncclDataType_t type, void* buf, size_t n) {
  size_t es = kern_type_size(type), nsp = 0;
  const uint64_t* sp = NULL;
  switch (type) {
    case ncclFloat16:
      sp = k_clean16, nsp = NSP(k_clean16);
      break;
    case ncclBfloat16:
      sp = k_clean_bf, nsp = NSP(k_clean_bf);
      break;
    case ncclFloat8e4m3:
      sp = k_clean_e4m3, nsp = NSP(k_clean_e4m3);
      break;
    case ncclFloat8e5m2:
      sp = k_clean_e5m2, nsp = NSP(k_clean_e5m2);
      break;
    case ncclFloat32:
      sp = k_clean32, nsp = NSP(k_clean32);
      break;
    case ncclFloat64:
      sp = k_clean64, nsp = NSP(k_clean64);
      break;
    default:
      break;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t v = rnd();
    float f = (float)(v >> 40) * 0x1p-22f - 2.0f; /* [-2, 2) */
    double d = f;
    if (nsp && v % 8 == 0)
      v = sp[(v >> 8) % nsp];
    else if (type == ncclFloat16)
      v = kern_float_to_half(f);
    else if (type == ncclBfloat16)
      v = kern_float_to_bf16(f);
    else if (type == ncclFloat8e4m3)
      v = kern_float_to_e4m3(f);
    else if (type == ncclFloat8e5m2)
      v = kern_float_to_e5m2(f);
    else if (type == ncclFloat32)
      memcpy(&v, &f, 4);
    else if (type == ncclFloat64)
      memcpy(&v, &d, 8);
    memcpy((char*)buf + i * es, &v, es);
  }
}

/* A NaN with a payload in the type's encoding (0 for integers). */
static uint64_t nan_of(ncclDataType_t type) {
  switch (type) {
    case ncclFloat16:
      return 0xfd55;
    case ncclBfloat16:
      return 0x7f91;
    case ncclFloat8e4m3:
      return 0xff;
    case ncclFloat8e5m2:
      return 0x7d;
    case ncclFloat32:
      return 0x7fa12345;
    case ncclFloat64:
      return 0xfff4000000000abcull;
    default:
      return 0;
  }
}

/* How one()'s sources are filled: with fill() (random bits and specials)
 * or fill_clean(), and then a NaN in element nan_at of source nan_src. */
struct inputs {
  int clean;
  int nan_src; /* < 0: none */
  size_t nan_at;
};
static const struct inputs k_random = {0, -1, 0};

/* One task both ways; returns the number of differing elements. */
static size_t one_in(struct bufs* b, ncclDataType_t type, int op, unsigned pre, int post, int ns,
                     int nd, size_t n, int off, const struct inputs* in) {
  size_t es = kern_type_size(type);
  struct kern_task t;
  struct kern_dev_task d;
  kern_task_like(&t, type, op, post, n);
  memset(&d, 0, sizeof(d));
  t.pre = pre;
  t.nsrcs = ns;
  t.ndsts = nd;
  d.type = (int32_t)type;
  d.op = ns == 1 ? KB_COPY : op;
  d.pre = pre & ((1u << ns) - 1u);
  d.post = (uint32_t)post;
  d.nsrcs = ns;
  d.ndsts = nd;
  d.n = n;
  d.scalar = t.redop.scalar;
  d.postdiv = t.redop.postdiv;
  for (int k = 0; k < ns; k++) {
    (in->clean ? fill_clean : fill)(type, b->src[k] + (size_t)off * es, n);
    t.srcs[k] = d.srcs[k] = b->src[k] + (size_t)off * es;
  }
  if (in->nan_src >= 0 && in->nan_src < ns && in->nan_at < n) {
    uint64_t q = nan_of(type);
    memcpy(b->src[in->nan_src] + (off + in->nan_at) * es, &q, es);
  }
  for (int j = 0; j < nd; j++) {
    memset(b->cpu[j], 0xA5, sizeof(b->cpu[j]));
    memset(b->gpu[j], 0xA5, sizeof(b->gpu[j]));
    t.dsts[j] = b->cpu[j] + (size_t)((off + j) % (MAX_OFF + 1)) * es;
    d.dsts[j] = b->gpu[j] + (size_t)((off + j) % (MAX_OFF + 1)) * es;
  }
  kern_task_run(&t);
  emulate(&d, 3, 5);
  size_t bad = 0;
  for (int j = 0; j < nd; j++)
    for (size_t i = 0; i < (MAX_N + MAX_OFF) * es; i += es)
      if (memcmp(b->cpu[j] + i, b->gpu[j] + i, es) != 0) {
        if (bad < 3) {
          uint64_t c = 0, g = 0;
          memcpy(&c, b->cpu[j] + i, es), memcpy(&g, b->gpu[j] + i, es);
          fprintf(stderr,
                  "type %d op %d pre %x post %d ns %d nd %d n %zu off %d: dst %d [%zu] cpu "
                  "%llx emulated %llx\n",
                  (int)type, op, pre, post, ns, nd, n, off, j, i / es, (unsigned long long)c,
                  (unsigned long long)g);
        }
        bad++;
      }
  return bad;
}

static size_t one(struct bufs* b, ncclDataType_t type, int op, unsigned pre, int post, int ns,
                  int nd, size_t n, int off) {
  return one_in(b, type, op, pre, post, ns, nd, n, off, &k_random);
}

static void test_bitwise_equal(void** state) {
  (void)state;
  static struct bufs b;
  size_t bad = 0, tasks = 0;
  for (int type = 0; type < ncclNumTypes; type++)
    for (int op = KERN_SUM; op <= KERN_MIN; op++)
      for (size_t si = 0; si < sizeof(k_nsrcs) / sizeof(k_nsrcs[0]); si++)
        for (int flags = 0; flags < 4; flags++)
          for (size_t li = 0; li < sizeof(k_lens) / sizeof(k_lens[0]); li++) {
            int ns = k_nsrcs[si], nd = 1 + (int)((li + si) % 3), off = (int)((li + flags) % 4);
            unsigned pre = (flags & 1) ? (unsigned)(rnd() | 1) : 0u;
            if (ns == 1 && op != KERN_SUM) continue; /* one source: a copy, op unused */
            bad += one(&b, (ncclDataType_t)type, op, pre, flags >> 1, ns, nd, k_lens[li], off);
            tasks++;
          }
  fprintf(stderr, "%zu tasks compared, %zu elements differ\n", tasks, bad);
  assert_int_equal(bad, 0);
}

static int is_float_type(int type) {
  return nan_of((ncclDataType_t)type) != 0;
}

/* Numbers only (signed zeros, subnormals, fp8's saturation among them):
 * the whole matrix equal to the CPU without a single fix-up, so the fast
 * path's own results are the CPU's. */
static void test_fast_path_numbers(void** state) {
  (void)state;
  static struct bufs b;
  static const struct inputs clean = {1, -1, 0};
  size_t bad = 0;
  unsigned long fix0 = fixup_count();
  for (int type = 0; type < ncclNumTypes; type++)
    for (int op = KERN_SUM; op <= KERN_MIN; op++)
      for (size_t si = 0; si < sizeof(k_nsrcs) / sizeof(k_nsrcs[0]); si++)
        for (int flags = 0; flags < 4; flags++)
          for (size_t li = 0; li < sizeof(k_lens) / sizeof(k_lens[0]); li++) {
            int ns = k_nsrcs[si], nd = 1 + (int)((li + si) % 3), off = (int)((li + flags) % 4);
            unsigned pre = (flags & 1) ? (unsigned)(rnd() | 1) : 0u;
            if (ns == 1 && op != KERN_SUM) continue;
            bad += one_in(&b, (ncclDataType_t)type, op, pre, flags >> 1, ns, nd, k_lens[li], off,
                          &clean);
          }
  unsigned long fixups = fixup_count() - fix0;
  fprintf(stderr, "numbers only: %zu elements differ, %lu fix-ups\n", bad, fixups);
  assert_int_equal(bad, 0);
  assert_int_equal(fixups, 0);
}

/* One NaN, in each lane of the first two vectors of one source (so in
 * either lane of a pair of 16-bit lanes and in each byte of fp8's word),
 * every float type x operator x flags, 2 and 3 sources: equal to the CPU,
 * and each one, where it lies in the vector part, reaches the fix-up. */
static void test_fast_path_nan_lanes(void** state) {
  (void)state;
  static struct bufs b;
  size_t bad = 0, runs = 0, missed = 0;
  for (int type = 0; type < ncclNumTypes; type++) {
    if (!is_float_type(type)) continue;
    size_t es = kern_type_size((ncclDataType_t)type);
    for (int op = KERN_SUM; op <= KERN_MIN; op++)
      for (int flags = 0; flags < 4; flags++)
        for (int ns = 2; ns <= 3; ns++)
          for (size_t at = 0; at < 32 / es; at++)
            for (int src = 0; src < ns; src += ns - 1) {
              struct inputs in = {1, src, at};
              unsigned pre = (flags & 1) ? 1u << src : 0u;
              unsigned long f0 = fixup_count();
              bad += one_in(&b, (ncclDataType_t)type, op, pre, flags >> 1, ns, 1, 64, 0, &in);
              missed += fixup_count() == f0;
              runs++;
            }
  }
  fprintf(stderr, "%zu runs with one NaN: %zu elements differ, %zu missed the fix-up\n", runs, bad,
          missed);
  assert_int_equal(bad, 0);
  assert_int_equal(missed, 0);
}

/* Every pair of a list of corners of each float type (every pair of fp8
 * values), as two sources under each operator and flags, at two offsets
 * (vector and element paths): NaN payloads in either operand, infinities,
 * min and max of -0 and +0 both ways, subnormals, the largest values. */
static void test_fast_path_pairs(void** state) {
  (void)state;
  static const uint64_t c16[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x3c00, 0xbc00, 0x7bff,
                                 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xfd55};
  static const uint64_t cbf[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x3f80, 0xbf80, 0x7f7f,
                                 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffa5};
  static const uint64_t c32[] = {0x0,        0x80000000, 0x1,        0x807fffff,
                                 0x3f800000, 0x7f7fffff, 0xff7fffff, 0x7f800000,
                                 0xff800000, 0x7fc00000, 0x7f800001, 0xffc12345};
  static const uint64_t c64[] = {0x0,
                                 0x8000000000000000ull,
                                 0x1,
                                 0x3ff0000000000000ull,
                                 0x7fefffffffffffffull,
                                 0xffefffffffffffffull,
                                 0x7ff0000000000000ull,
                                 0xfff0000000000000ull,
                                 0x7ff8000000000000ull,
                                 0x7ff0000000000001ull};
  static unsigned char a[65536 * 8 + 16], bb[65536 * 8 + 16], cpu[65536 * 8 + 16],
      emu[65536 * 8 + 16];
  size_t bad = 0;
  for (int type = 0; type < ncclNumTypes; type++) {
    if (!is_float_type(type)) continue;
    size_t es = kern_type_size((ncclDataType_t)type), nc = 256;
    const uint64_t* c = NULL;
    if (type == ncclFloat16) c = c16, nc = NSP(c16);
    if (type == ncclBfloat16) c = cbf, nc = NSP(cbf);
    if (type == ncclFloat32) c = c32, nc = NSP(c32);
    if (type == ncclFloat64) c = c64, nc = NSP(c64);
    for (int off = 0; off < 2; off++) {
      size_t n = nc * nc;
      for (size_t i = 0; i < n; i++) {
        uint64_t x = c ? c[i / nc] : i / nc, y = c ? c[i % nc] : i % nc;
        memcpy(a + (off + i) * es, &x, es), memcpy(bb + (off + i) * es, &y, es);
      }
      for (int op = KERN_SUM; op <= KERN_MIN; op++)
        for (int flags = 0; flags < 4; flags++) {
          struct kern_task t;
          struct kern_dev_task d;
          memset(&t, 0, sizeof(t));
          memset(&d, 0, sizeof(d));
          t.redop.type = (ncclDataType_t)type, t.redop.op = (enum kern_op)op;
          t.redop.scalar = scalar_for((ncclDataType_t)type);
          t.redop.postdiv = (flags & 2) ? 3 : 0;
          t.pre = (flags & 1) ? 2u : 0u, t.flags = (flags & 2) ? KERN_POST : 0;
          t.nsrcs = 2, t.ndsts = 1, t.n = n;
          t.srcs[0] = a + off * es, t.srcs[1] = bb + off * es, t.dsts[0] = cpu + off * es;
          d.type = type, d.op = op, d.pre = t.pre, d.post = (flags & 2) ? 1 : 0;
          d.nsrcs = 2, d.ndsts = 1, d.n = n, d.scalar = t.redop.scalar, d.postdiv = 3;
          d.srcs[0] = t.srcs[0], d.srcs[1] = t.srcs[1], d.dsts[0] = emu + off * es;
          kern_task_run(&t);
          emulate(&d, 2, 3);
          for (size_t i = 0; i < n; i++)
            if (memcmp(cpu + (off + i) * es, emu + (off + i) * es, es) != 0 && bad++ < 5) {
              uint64_t x = 0, y = 0, p = 0, q = 0;
              memcpy(&x, a + (off + i) * es, es), memcpy(&y, bb + (off + i) * es, es);
              memcpy(&p, cpu + (off + i) * es, es), memcpy(&q, emu + (off + i) * es, es);
              fprintf(stderr, "type %d op %d flags %d: %llx, %llx -> cpu %llx emulated %llx\n",
                      type, op, flags, (unsigned long long)x, (unsigned long long)y,
                      (unsigned long long)p, (unsigned long long)q);
            }
        }
    }
  }
  assert_int_equal(bad, 0);
}

/* The NaN rules on their own, where a GPU's arithmetic would differ: every
 * pair of a few float specials through sum, prod, max and min. */
static void test_nan_rules(void** state) {
  (void)state;
  static const uint32_t v[] = {0x7fc00001, 0x7fa00000, 0xffc12345, 0x7f800000,
                               0xff800000, 0x3f800000, 0x00000000, 0x80000000};
  size_t n = sizeof(v) / sizeof(v[0]);
  for (int op = KERN_SUM; op <= KERN_MIN; op++)
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < n; j++) {
        float x, y, cpu, emu;
        memcpy(&x, &v[i], 4), memcpy(&y, &v[j], 4);
        struct kern_redop r = {ncclFloat32, (enum kern_op)op, 0, 0};
        kern_reduce(&r, 0, &cpu, &x, &y, 1);
        struct kern_dev_task d;
        memset(&d, 0, sizeof(d));
        d.type = KB_FLOAT, d.op = op, d.nsrcs = 2, d.ndsts = 1, d.n = 1;
        d.srcs[0] = &x, d.srcs[1] = &y, d.dsts[0] = &emu;
        kern_emulate_reduce_copy(&d, 1, 1);
        uint32_t cb, eb;
        memcpy(&cb, &cpu, 4), memcpy(&eb, &emu, 4);
        if (cb != eb)
          fail_msg("op %d: %08x, %08x -> cpu %08x, emulated %08x", op, v[i], v[j], cb, eb);
      }
}

/* Rows (Hier's node stages, braid_reduce_copy_at): the task again on
 * evenly spaced rows, the sources and destinations with pitches of their
 * own, upwards or downwards, against the CPU kernels row by row; the bytes
 * between rows stay untouched. */
#define ROWS 3
#define ROW_N 1000
#define ROW_GAP 24 /* bytes between rows beyond the row itself: misaligns the next */

struct rows_bufs {
  _Alignas(64) unsigned char src[3][ROWS * (ROW_N * 8 + 2 * ROW_GAP)];
  unsigned char cpu[2][ROWS * (ROW_N * 8 + 2 * ROW_GAP)];
  unsigned char emu[2][ROWS * (ROW_N * 8 + 2 * ROW_GAP)];
};

static size_t rows_one(struct rows_bufs* b, ncclDataType_t type, int ns, int nd, size_t n,
                       int down) {
  size_t es = kern_type_size(type), sp = n * es + ROW_GAP, dp = n * es + 2 * ROW_GAP;
  size_t first_s = down ? (ROWS - 1) * sp : 0, first_d = down ? (ROWS - 1) * dp : 0;
  struct kern_dev_task d;
  memset(&d, 0, sizeof(d));
  d.type = (int32_t)type, d.op = ns == 1 ? KB_COPY : KB_SUM;
  d.nsrcs = ns, d.ndsts = nd, d.n = n;
  d.rows = ROWS;
  d.src_row = down ? -(int64_t)sp : (int64_t)sp;
  d.dst_row = down ? -(int64_t)dp : (int64_t)dp;
  for (int k = 0; k < ns; k++) {
    fill(type, b->src[k], sizeof(b->src[k]) / es);
    d.srcs[k] = b->src[k] + first_s;
  }
  for (int j = 0; j < nd; j++) {
    memset(b->cpu[j], 0xA5, sizeof(b->cpu[j]));
    memset(b->emu[j], 0xA5, sizeof(b->emu[j]));
    d.dsts[j] = b->emu[j] + first_d;
  }
  for (int r = 0; r < ROWS; r++) {
    struct kern_task t;
    memset(&t, 0, sizeof(t));
    t.redop.type = type, t.redop.op = KERN_SUM;
    t.nsrcs = ns, t.ndsts = nd, t.n = n;
    for (int k = 0; k < ns; k++) t.srcs[k] = (const char*)d.srcs[k] + r * d.src_row;
    for (int j = 0; j < nd; j++) t.dsts[j] = b->cpu[j] + first_d + r * d.dst_row;
    kern_task_run(&t);
  }
  kern_emulate_reduce_copy_at(&d, 3, 5);
  size_t bad = 0;
  for (int j = 0; j < nd; j++)
    for (size_t i = 0; i < sizeof(b->cpu[j]); i++) bad += b->cpu[j][i] != b->emu[j][i];
  if (bad)
    fprintf(stderr, "rows: type %d ns %d nd %d n %zu down %d: %zu bytes differ\n", (int)type, ns,
            nd, n, down, bad);
  return bad;
}

static void test_rows(void** state) {
  (void)state;
  static struct rows_bufs b;
  static const ncclDataType_t types[] = {ncclInt8, ncclFloat16, ncclFloat32, ncclFloat64,
                                         ncclFloat8e4m3};
  static const size_t lens[] = {1, 7, 33, ROW_N};
  size_t bad = 0;
  for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++)
    for (int ns = 1; ns <= 3; ns++)
      for (int nd = 1; nd <= 2; nd++)
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
          for (int down = 0; down < 2; down++)
            bad += rows_one(&b, types[t], ns, nd, lens[li], down);
  assert_int_equal(bad, 0);
}

/* Rows named by a table (Hier's columns not evenly spaced: a row's
 * sources that many rows on, a negative entry no row at all) and spread
 * rows (row r reads source r alone, or writes destination r alone: a
 * node's ranks, each a buffer of its own), on floats, against the rows
 * made by hand; what no row writes stays untouched. */
static void test_rows_table_spread(void** state) {
  (void)state;
  enum { N = 37 };
  static float src[3][3 * N], dst[3][3 * N], want[3][3 * N];
  static const int32_t at[3] = {2, -1, 0};
  struct kern_dev_task d;
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < 3 * N; i++) src[k][i] = (float)(k * 1000 + i) + 0.25f;
  for (int mode = 0; mode < 3; mode++) {
    memset(&d, 0, sizeof(d));
    memset(dst, 0xA5, sizeof(dst));
    memset(want, 0xA5, sizeof(want));
    d.type = KB_FLOAT, d.n = N, d.rows = 3;
    if (mode == 0) { /* a table on the sources: row 0 from row 2, no row 1, row 2 from row 0 */
      d.op = KB_SUM, d.nsrcs = 2, d.ndsts = 1, d.src_at = at;
      d.src_row = N * sizeof(float), d.dst_row = N * sizeof(float);
      d.srcs[0] = src[0], d.srcs[1] = src[1], d.dsts[0] = dst[0];
      for (int r = 0; r < 3; r++)
        for (int i = 0; at[r] >= 0 && i < N; i++)
          want[0][r * N + i] = src[0][at[r] * N + i] + src[1][at[r] * N + i];
    } else if (mode == 1) { /* spread sources: row r copies source r into row r */
      d.op = KB_COPY, d.nsrcs = 3, d.ndsts = 1, d.spread = KB_SPREAD_SRCS;
      d.dst_row = N * sizeof(float);
      for (int k = 0; k < 3; k++) d.srcs[k] = src[k] + 5;
      d.dsts[0] = dst[0];
      for (int r = 0; r < 3; r++)
        for (int i = 0; i < N; i++) want[0][r * N + i] = src[r][5 + i];
    } else { /* spread destinations: row r of the source to destination r alone */
      d.op = KB_COPY, d.nsrcs = 1, d.ndsts = 3, d.spread = KB_SPREAD_DSTS;
      d.src_row = N * sizeof(float);
      d.srcs[0] = src[2];
      for (int k = 0; k < 3; k++) d.dsts[k] = dst[k] + 7;
      for (int r = 0; r < 3; r++)
        for (int i = 0; i < N; i++) want[r][7 + i] = src[2][r * N + i];
    }
    kern_emulate_reduce_copy_at(&d, 2, 3);
    if (memcmp(dst, want, sizeof(dst)) != 0) fail_msg("rows mode %d differ", mode);
  }
}

/* ---- The canonical tree (t->tree: the deterministic mode's order) ---- */

#define TREE_N 1000
struct tree_bufs {
  _Alignas(64) unsigned char src[KB_MAX_SRCS][(TREE_N + MAX_OFF) * 8];
  unsigned char val[KB_MAX_SRCS][TREE_N * 8]; /* the reference's blocks */
  unsigned char tmp[TREE_N * 8];
  unsigned char emu[2][(TREE_N + MAX_OFF) * 8];
};

static size_t tree_one(struct tree_bufs* b, ncclDataType_t type, int op, int ns, unsigned pre,
                       int post, size_t n, int off) {
  size_t es = kern_type_size(type), bad = 0;
  struct kern_task like;
  struct kern_dev_task d;
  kern_task_like(&like, type, op, post, n);
  memset(&d, 0, sizeof(d));
  d.type = (int32_t)type, d.op = op, d.tree = 1;
  d.pre = pre, d.post = (uint32_t)post;
  d.nsrcs = ns, d.ndsts = 2, d.n = n;
  d.scalar = like.redop.scalar, d.postdiv = like.redop.postdiv;
  for (int k = 0; k < ns; k++) {
    fill(type, b->src[k] + (size_t)off * es, n);
    d.srcs[k] = b->src[k] + (size_t)off * es;
  }
  for (int j = 0; j < 2; j++) {
    memset(b->emu[j], 0xA5, sizeof(b->emu[j]));
    d.dsts[j] = b->emu[j] + (size_t)off * es;
  }
  {
    const void* srcs[KB_MAX_SRCS];
    unsigned char* vals[KB_MAX_SRCS];
    for (int k = 0; k < ns; k++) srcs[k] = d.srcs[k], vals[k] = b->val[k];
    kern_tree_reference(&like, ns, pre, srcs, vals, b->tmp);
  }
  emulate(&d, 3, 5);
  for (int j = 0; j < 2; j++)
    for (size_t i = 0; i < n; i++)
      if (memcmp(b->emu[j] + (off + i) * es, b->val[0] + i * es, es) != 0) {
        if (bad < 3)
          fprintf(stderr, "tree: type %d op %d ns %d pre %x post %d n %zu off %d: [%zu] differs\n",
                  (int)type, op, ns, pre, post, n, off, i);
        bad++;
      }
  return bad;
}

/* A tree task gives the tree's bits, not the chain's: every type x
 * operator x 4..16 sources x premul on some x avg's division, on the
 * vector path and the element one (offsets), random bits with the special
 * values, against the tree made of CPU kernel calls (kern_tree_reference); and
 * with 8 float sources the chain's bits differ somewhere (the test sees
 * the order). */
static void test_tree(void** state) {
  (void)state;
  static struct tree_bufs b;
  static const int nss[] = {4, 5, 6, 7, 8, 11, 16};
  static const size_t lens[] = {1, 7, 64, TREE_N};
  size_t bad = 0, tasks = 0;
  for (int type = 0; type < ncclNumTypes; type++)
    for (int op = KERN_SUM; op <= KERN_MIN; op++)
      for (size_t si = 0; si < sizeof(nss) / sizeof(nss[0]); si++) {
        int ns = nss[si], flags = (int)((si + (size_t)op + (size_t)type) % 4);
        unsigned pre = (flags & 1) ? (unsigned)rnd() & ((1u << ns) - 1u) : 0u;
        for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++, tasks++)
          bad += tree_one(&b, (ncclDataType_t)type, op, ns, pre, flags >> 1, lens[li],
                          (int)((li + si) % (MAX_OFF + 1)));
      }
  fprintf(stderr, "%zu tree tasks compared, %zu elements differ\n", tasks, bad);
  assert_int_equal(bad, 0);
  /* teeth: the same floats as a chain */
  struct kern_dev_task d;
  memset(&d, 0, sizeof(d));
  assert_int_equal(tree_one(&b, ncclFloat32, KERN_SUM, 8, 0, 0, TREE_N, 0), 0);
  d.type = KB_FLOAT, d.op = KB_SUM, d.nsrcs = 8, d.ndsts = 1, d.n = TREE_N;
  for (int k = 0; k < 8; k++) d.srcs[k] = b.src[k];
  d.dsts[0] = b.emu[1];
  emulate(&d, 3, 5);
  assert_true(memcmp(b.emu[1], b.val[0], TREE_N * 4) != 0);
}

/* The matrices above again on the emulation of sm_80's kernel, whose fp8
 * goes through integer code rather than the conversion instructions. */
static void test_sm80(void** state) {
  g_sm80 = 1;
  test_bitwise_equal(state);
  test_fast_path_numbers(state);
  test_fast_path_nan_lanes(state);
  test_fast_path_pairs(state);
  test_tree(state);
  g_sm80 = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nan_rules),
      cmocka_unit_test(test_bitwise_equal),
      cmocka_unit_test(test_rows),
      cmocka_unit_test(test_rows_table_spread),
      cmocka_unit_test(test_tree),
      cmocka_unit_test(test_fast_path_numbers),
      cmocka_unit_test(test_fast_path_nan_lanes),
      cmocka_unit_test(test_fast_path_pairs),
      cmocka_unit_test(test_sm80),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
