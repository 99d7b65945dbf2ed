/*
 * The CUDA reduce-copy kernel's body (kernels/cuda/kern_body.h), run by the
 * CPU grid emulation, against the CPU kernels (kern_task_run): every type x
 * operator x flags (premul on some sources, avg's division) x source count
 * (1, 2, 3, 8) x destination count x length x element offset, on random
 * bits salted with the special values (NaNs with payloads, infinities,
 * signed zeros, subnormals), compared bit for bit; and tasks of several
 * rows, row by row. tests/gpu runs the same
 * comparison on a real GPU.
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

/* One task both ways; returns the number of differing elements. */
static size_t one(struct bufs* b, ncclDataType_t type, int op, unsigned pre, int post, int ns,
                  int nd, size_t n, int off) {
  size_t es = kern_type_size(type);
  struct kern_task t;
  struct kern_dev_task d;
  memset(&t, 0, sizeof(t));
  memset(&d, 0, sizeof(d));
  t.redop.type = type;
  t.redop.op = (enum kern_op)op;
  t.redop.scalar = scalar_for(type);
  t.redop.postdiv = post ? 1 + (uint32_t)(rnd() % 7) : 0;
  t.pre = pre;
  t.flags = post ? KERN_POST : 0;
  t.nsrcs = ns;
  t.ndsts = nd;
  t.n = n;
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
    fill(type, b->src[k] + (size_t)off * es, n);
    t.srcs[k] = d.srcs[k] = b->src[k] + (size_t)off * es;
  }
  for (int j = 0; j < nd; j++) {
    memset(b->cpu[j], 0xA5, sizeof(b->cpu[j]));
    memset(b->gpu[j], 0xA5, sizeof(b->gpu[j]));
    t.dsts[j] = b->cpu[j] + (size_t)((off + j) % (MAX_OFF + 1)) * es;
    d.dsts[j] = b->gpu[j] + (size_t)((off + j) % (MAX_OFF + 1)) * es;
  }
  kern_task_run(&t);
  kern_emulate_reduce_copy(&d, 3, 5);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_nan_rules),
      cmocka_unit_test(test_bitwise_equal),
      cmocka_unit_test(test_rows),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
