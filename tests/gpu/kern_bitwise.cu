/*
 * The embedded reduce-copy fatbin (build/obj/kernels/cuda/reduce.fatbin) on
 * a real GPU against the CPU kernels (kern_task_run, libbraid.a): every
 * type x operator x flags x source count x destination count x length x
 * element offset, on random bits salted with special values, compared bit
 * for bit (the same matrix test_kern_cuda runs on the CPU grid emulation),
 * tasks of several rows, and tasks in the canonical tree's order; then the
 * fused 2-source float sum on 256 MiB timed next to a
 * device-to-device copy of the same bytes.
 *
 *   tests/gpu/kern_bitwise <dir>/reduce.fatbin [bw|check|small]   (reduce_at.fatbin beside it)
 *     bw: the timings only; check: the whole matrix and the rows, no timings;
 *     small: the matrix up to 4099 elements and the rows, no timings (what
 *     compute-sanitizer runs)
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>

extern "C" {
#include "cuda/kern_body.h"
#include "kernels.h"
}
#include "common/kern_inputs.h"

#define CU(call)                                                         \
  do {                                                                   \
    CUresult r_ = (call);                                                \
    if (r_ != CUDA_SUCCESS) {                                            \
      const char* s_ = "?";                                              \
      cuGetErrorName(r_, &s_);                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_); \
      exit(2);                                                           \
    }                                                                    \
  } while (0)

#define MAX_N 4099
#define MAX_OFF 3
#define SLOT ((MAX_N + MAX_OFF) * 8)
static const size_t k_lens[] = {0, 1, 2, 7, 33, 64, 1000, MAX_N, 1 << 20};
static const int k_nsrcs[] = {1, 2, 3, 8};

static CUfunction g_fn, g_fn_at;
static int g_sms;
static unsigned g_block = 256, g_blocks_per_sm = 8;

static void launch(struct kern_dev_task* d, CUstream s) {
  void* args[] = {d};
  unsigned block = g_block, grid = (unsigned)(d->n / block + 1);
  if (grid > (unsigned)g_sms * g_blocks_per_sm) grid = (unsigned)g_sms * g_blocks_per_sm;
  CU(cuLaunchKernel(g_fn, grid, 1, 1, block, 1, 1, 0, s, args, NULL));
}

/* One task on the CPU and on the GPU; returns differing elements. */
static size_t one(int type, int op, unsigned pre, int post, int ns, int nd, size_t n, int off,
                  unsigned char** hsrc, unsigned char** hcpu, unsigned char* hgpu,
                  CUdeviceptr* dsrc, CUdeviceptr* ddst, size_t slot) {
  size_t es = kern_type_size((ncclDataType_t)type), bad = 0;
  struct kern_task t;
  struct kern_dev_task d;
  kern_task_like(&t, (ncclDataType_t)type, op, post, n);
  memset(&d, 0, sizeof(d));
  t.pre = pre, t.nsrcs = ns, t.ndsts = nd;
  d.type = type, d.op = ns == 1 ? KB_COPY : op, d.pre = pre & ((1u << ns) - 1u);
  d.post = (uint32_t)post, d.nsrcs = ns, d.ndsts = nd, d.n = n;
  d.scalar = t.redop.scalar, d.postdiv = t.redop.postdiv;
  for (int k = 0; k < ns; k++) {
    fill((ncclDataType_t)type, hsrc[k] + (size_t)off * es, n);
    t.srcs[k] = hsrc[k] + (size_t)off * es;
    CU(cuMemcpyHtoD(dsrc[k], hsrc[k], slot));
    d.srcs[k] = (const void*)(dsrc[k] + (size_t)off * es);
  }
  for (int j = 0; j < nd; j++) {
    size_t o = (size_t)((off + j) % (MAX_OFF + 1)) * es;
    memset(hcpu[j], 0xA5, slot);
    CU(cuMemsetD8(ddst[j], 0xA5, slot));
    t.dsts[j] = hcpu[j] + o;
    d.dsts[j] = (void*)(ddst[j] + o);
  }
  kern_task_run(&t);
  launch(&d, 0);
  CU(cuCtxSynchronize());
  for (int j = 0; j < nd; j++) {
    CU(cuMemcpyDtoH(hgpu, ddst[j], slot));
    for (size_t i = 0; i < slot; i += es) {
      if (memcmp(hcpu[j] + i, hgpu + i, es) == 0) continue;
      if (bad < 3) {
        uint64_t c = 0, g = 0;
        memcpy(&c, hcpu[j] + i, es), memcpy(&g, hgpu + i, es);
        printf("  type %d op %d pre %x post %d ns %d nd %d n %zu off %d: [%zu] cpu %llx gpu %llx\n",
               type, op, pre, post, ns, nd, n, off, i / es, (unsigned long long)c,
               (unsigned long long)g);
      }
      bad++;
    }
  }
  return bad;
}

/* braid_reduce_copy_at on a task copied to the device first. */
static void launch_at(const struct kern_dev_task* d, CUstream s) {
  CUdeviceptr at;
  CU(cuMemAlloc(&at, sizeof(*d)));
  CU(cuMemcpyHtoD(at, d, sizeof(*d)));
  void* args[] = {&at};
  unsigned block = g_block, grid = (unsigned)(d->n / block + 1);
  if (grid > (unsigned)g_sms * g_blocks_per_sm) grid = (unsigned)g_sms * g_blocks_per_sm;
  CU(cuLaunchKernel(g_fn_at, grid, 1, 1, block, 1, 1, 0, s, args, NULL));
  CU(cuCtxSynchronize());
  CU(cuMemFree(at));
}

/* A task of 3 rows (Hier's node stages: braid_reduce_copy_at steps
 * through them), float sum of 3 sources into 2 destinations, rows upwards
 * and downwards with pitches that misalign every other row, against the
 * CPU kernels row by row; the bytes between rows must stay untouched.
 * Returns differing bytes. */
static size_t rows_check(unsigned char** hsrc, unsigned char** hcpu, unsigned char* hgpu,
                         CUdeviceptr* dsrc, CUdeviceptr* ddst) {
  const size_t n = 100003, sp = n * 4 + 20, dp = n * 4 + 44, rows = 3, slot = rows * dp;
  size_t bad = 0;
  for (int down = 0; down < 2; down++) {
    struct kern_dev_task d;
    memset(&d, 0, sizeof(d));
    d.type = KB_FLOAT, d.op = KB_SUM, d.nsrcs = 3, d.ndsts = 2, d.n = n, d.rows = (uint32_t)rows;
    d.src_row = down ? -(int64_t)sp : (int64_t)sp;
    d.dst_row = down ? -(int64_t)dp : (int64_t)dp;
    size_t s0 = down ? (rows - 1) * sp : 0, d0 = down ? (rows - 1) * dp : 0;
    for (int k = 0; k < 3; k++) {
      fill(ncclFloat32, hsrc[k], slot / 4);
      CU(cuMemcpyHtoD(dsrc[k], hsrc[k], slot));
      d.srcs[k] = (const void*)(dsrc[k] + s0);
    }
    for (int j = 0; j < 2; j++) {
      memset(hcpu[j], 0xA5, slot);
      CU(cuMemsetD8(ddst[j], 0xA5, slot));
      d.dsts[j] = (void*)(ddst[j] + d0);
    }
    for (size_t r = 0; r < rows; r++) {
      struct kern_task t;
      memset(&t, 0, sizeof(t));
      t.redop.type = ncclFloat32, t.redop.op = KERN_SUM, t.nsrcs = 3, t.ndsts = 2, t.n = n;
      for (int k = 0; k < 3; k++) t.srcs[k] = hsrc[k] + s0 + (int64_t)r * d.src_row;
      for (int j = 0; j < 2; j++) t.dsts[j] = hcpu[j] + d0 + (int64_t)r * d.dst_row;
      kern_task_run(&t);
    }
    launch_at(&d, 0);
    for (int j = 0; j < 2; j++) {
      CU(cuMemcpyDtoH(hgpu, ddst[j], slot));
      for (size_t i = 0; i < slot; i++) bad += hcpu[j][i] != hgpu[i];
    }
  }
  printf("rows: 2 tasks of 3 rows, %zu bytes differ from the CPU kernels\n", bad);
  return bad;
}

/* Rows named by a table in device memory (Hier's columns not evenly
 * spaced: row 0 from source row 2, no row 1, row 2 from source row 0),
 * then a spread task (row r of one source to destination r alone: a
 * node's ranks), float, against the same rows made on the CPU; what no
 * row writes stays untouched. Returns differing bytes. */
static size_t rows_table_check(unsigned char** hsrc, unsigned char** hcpu, unsigned char* hgpu,
                               CUdeviceptr* dsrc, CUdeviceptr* ddst) {
  const size_t n = 100003, pitch = n * 4, slot = 3 * pitch;
  const int32_t at[3] = {2, -1, 0};
  CUdeviceptr dat;
  size_t bad = 0;
  CU(cuMemAlloc(&dat, sizeof(at)));
  CU(cuMemcpyHtoD(dat, at, sizeof(at)));
  for (int spread = 0; spread < 2; spread++) {
    struct kern_dev_task d;
    memset(&d, 0, sizeof(d));
    d.type = KB_FLOAT, d.n = n, d.rows = 3;
    for (int k = 0; k < 2; k++) {
      fill(ncclFloat32, hsrc[k], slot / 4);
      CU(cuMemcpyHtoD(dsrc[k], hsrc[k], slot));
    }
    for (int j = 0; j < 2; j++) {
      memset(hcpu[j], 0xA5, slot);
      CU(cuMemsetD8(ddst[j], 0xA5, slot));
    }
    if (!spread) { /* two sources summed, rows by table; one destination */
      d.op = KB_SUM, d.nsrcs = 2, d.ndsts = 1, d.src_at = (const int32_t*)dat;
      d.src_row = (int64_t)pitch, d.dst_row = (int64_t)pitch;
      d.srcs[0] = (const void*)dsrc[0], d.srcs[1] = (const void*)dsrc[1];
      d.dsts[0] = (void*)ddst[0];
    } else { /* source 0's rows 0 and 1 to destinations 0 and 1, each alone */
      d.op = KB_COPY, d.nsrcs = 1, d.ndsts = 2, d.rows = 2, d.spread = KB_SPREAD_DSTS;
      d.src_row = (int64_t)pitch;
      d.srcs[0] = (const void*)dsrc[0];
      d.dsts[0] = (void*)ddst[0], d.dsts[1] = (void*)ddst[1];
    }
    for (int r = 0; r < (int)d.rows; r++) {
      struct kern_task t;
      memset(&t, 0, sizeof(t));
      t.redop.type = ncclFloat32, t.redop.op = KERN_SUM, t.n = n, t.ndsts = 1;
      if (!spread && at[r] < 0) continue;
      t.nsrcs = spread ? 1 : 2;
      for (int k = 0; k < t.nsrcs; k++) t.srcs[k] = hsrc[k] + (spread ? r : at[r]) * pitch;
      t.dsts[0] = spread ? hcpu[r] : hcpu[0] + r * pitch;
      kern_task_run(&t);
    }
    launch_at(&d, 0);
    for (int j = 0; j < 2; j++) {
      CU(cuMemcpyDtoH(hgpu, ddst[j], slot));
      for (size_t i = 0; i < slot; i++) bad += hcpu[j][i] != hgpu[i];
    }
  }
  CU(cuMemFree(dat));
  printf("rows by table and spread: 2 tasks, %zu bytes differ from the CPU kernels\n", bad);
  return bad;
}

/* The best of 10 timed launches of d (after 2 untimed), in ms. */
/* Tasks in the canonical tree's order (d.tree: the deterministic mode's,
 * 4 to 8 sources) against that tree made of CPU kernel calls
 * (kern_tree_reference): every type x operator, premul on some sources,
 * avg's division on some, on the vector path and the element one, up to
 * 2^20 elements. Returns differing elements. */
static size_t tree_check(unsigned char** hsrc, unsigned char* hgpu, CUdeviceptr* dsrc,
                         CUdeviceptr* ddst, int small) {
  static const int nss[] = {4, 5, 7, 8};
  static const size_t lens[] = {7, 1000, 1 << 20};
  size_t bad = 0, tasks = 0, big = (size_t)(1 << 20) * 8;
  unsigned char* vals[8];
  unsigned char* tmp = (unsigned char*)malloc(big);
  for (int k = 0; k < 8; k++) vals[k] = (unsigned char*)malloc(big);
  for (int type = 0; type < ncclNumTypes; type++)
    for (int op = KERN_SUM; op <= KERN_MIN; op++)
      for (size_t si = 0; si < 4; si++)
        for (size_t li = 0; li < 3 && !(small && lens[li] > MAX_N); li++, tasks++) {
          int ns = nss[si], post = (int)((si + li) & 1), off = (int)((li + si) % 4);
          unsigned pre = ((si + (size_t)op) & 1) ? (unsigned)rnd() & 0xffu : 0u;
          size_t n = lens[li], es = kern_type_size((ncclDataType_t)type);
          struct kern_task like;
          struct kern_dev_task d;
          const void* srcs[8];
          kern_task_like(&like, (ncclDataType_t)type, op, post, n);
          memset(&d, 0, sizeof(d));
          d.type = type, d.op = op, d.tree = 1, d.pre = pre, d.post = (uint32_t)post;
          d.nsrcs = ns, d.ndsts = 1, d.n = n;
          d.scalar = like.redop.scalar, d.postdiv = like.redop.postdiv;
          for (int k = 0; k < ns; k++) {
            fill((ncclDataType_t)type, hsrc[k] + (size_t)off * es, n);
            srcs[k] = hsrc[k] + (size_t)off * es;
            CU(cuMemcpyHtoD(dsrc[k], hsrc[k], (n + MAX_OFF) * es));
            d.srcs[k] = (const void*)(dsrc[k] + (size_t)off * es);
          }
          d.dsts[0] = (void*)(ddst[0] + (size_t)off * es);
          kern_tree_reference(&like, ns, pre, srcs, vals, tmp);
          launch(&d, 0);
          CU(cuCtxSynchronize());
          CU(cuMemcpyDtoH(hgpu, ddst[0] + (size_t)off * es, n * es));
          for (size_t i = 0; i < n; i++)
            if (memcmp(hgpu + i * es, vals[0] + i * es, es) != 0 && bad++ < 3)
              printf("  tree: type %d op %d ns %d pre %x post %d n %zu off %d: [%zu] differs\n",
                     type, op, ns, pre, post, n, off, i);
        }
  for (int k = 0; k < 8; k++) free(vals[k]);
  free(tmp);
  printf("canonical tree: %zu tasks, %zu elements differ from the CPU kernels' tree\n", tasks, bad);
  return bad;
}

static float best_launch_ms(struct kern_dev_task* d, CUevent e0, CUevent e1) {
  float best = 1e30f, ms;
  for (int rep = 0; rep < 12; rep++) {
    CU(cuEventRecord(e0, 0));
    launch(d, 0);
    CU(cuEventRecord(e1, 0));
    CU(cuEventSynchronize(e1));
    CU(cuEventElapsedTime(&ms, e0, e1));
    if (rep > 1 && ms < best) best = ms;
  }
  return best;
}

static void bandwidth(void) {
  size_t bytes = (size_t)256 << 20, n = bytes / 4;
  CUdeviceptr a, b, c;
  CU(cuMemAlloc(&a, bytes));
  CU(cuMemAlloc(&b, bytes));
  CU(cuMemAlloc(&c, bytes));
  CU(cuMemsetD32(a, 0x3f800000u, n));
  CU(cuMemsetD32(b, 0x40000000u, n));
  struct kern_dev_task d;
  memset(&d, 0, sizeof(d));
  d.type = KB_FLOAT, d.op = KB_SUM, d.nsrcs = 2, d.ndsts = 1, d.n = n;
  d.srcs[0] = (const void*)a, d.srcs[1] = (const void*)b, d.dsts[0] = (void*)c;
  CUevent e0, e1;
  CU(cuEventCreate(&e0, 0));
  CU(cuEventCreate(&e1, 0));
  float best_c = 1e30f, ms;
  for (int rep = 0; rep < 12; rep++) {
    CU(cuEventRecord(e0, 0));
    CU(cuMemcpyDtoDAsync(c, a, bytes, 0));
    CU(cuEventRecord(e1, 0));
    CU(cuEventSynchronize(e1));
    CU(cuEventElapsedTime(&ms, e0, e1));
    if (rep > 1 && ms < best_c) best_c = ms;
  }
  printf("device-to-device copy, 256 MiB: %.3f ms = %.0f GB/s (2 x 256 MiB moved)\n", best_c,
         2.0 * bytes / (best_c / 1e3) / 1e9);
  static const unsigned blocks[] = {128, 256, 512}, per_sm[] = {2, 4, 8, 16, 32};
  for (size_t bi = 0; bi < 3; bi++)
    for (size_t pi = 0; pi < 5; pi++) {
      g_block = blocks[bi], g_blocks_per_sm = per_sm[pi];
      float best_k = best_launch_ms(&d, e0, e1);
      printf(
          "fused 2-source float sum, 256 MiB, %u threads x %u blocks/SM: %.3f ms = %.0f GB/s, "
          "%.2f of the copy\n",
          g_block, g_blocks_per_sm, best_k, 3.0 * bytes / (best_k / 1e3) / 1e9,
          (3.0 * bytes / best_k) / (2.0 * bytes / best_c));
    }
  /* every type, in the library's launch shape (gpu/cuda/cuda_kernels.c) */
  static const char* names[] = {"int8", "uint8", "int32",  "uint32", "int64", "uint64",
                                "half", "float", "double", "bf16",   "e4m3",  "e5m2"};
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  g_block = 256, g_blocks_per_sm = 32;
  for (int t = 0; t < 12; t++) {
    d.type = t, d.n = bytes / sizes[t];
    float best_k = best_launch_ms(&d, e0, e1);
    printf("fused 2-source %s sum, 256 MiB: %.3f ms = %.0f GB/s, %.2f of the copy\n", names[t],
           best_k, 3.0 * bytes / (best_k / 1e3) / 1e9,
           (3.0 * bytes / best_k) / (2.0 * bytes / best_c));
  }
  g_block = 256, g_blocks_per_sm = 8;
  CU(cuMemFree(a));
  CU(cuMemFree(b));
  CU(cuMemFree(c));
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s build/obj/kernels/cuda/reduce.fatbin\n", argv[0]);
    return 2;
  }
  CUdevice dev;
  CUcontext ctx;
  CUmodule mod, mod_at;
  CU(cuInit(0));
  CU(cuDeviceGet(&dev, 0));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CU(cuDeviceGetAttribute(&g_sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  CU(cuModuleLoad(&mod, argv[1]));
  CU(cuModuleGetFunction(&g_fn, mod, "braid_reduce_copy"));
  std::string at_path(argv[1]); /* reduce_at.fatbin beside reduce.fatbin */
  size_t slash = at_path.find_last_of('/');
  at_path = at_path.substr(0, slash == std::string::npos ? 0 : slash + 1) + "reduce_at.fatbin";
  CU(cuModuleLoad(&mod_at, at_path.c_str()));
  CU(cuModuleGetFunction(&g_fn_at, mod_at, "braid_reduce_copy_at"));
  size_t big = (size_t)(1 << 20) + MAX_OFF, slot = big * 8;
  unsigned char *hsrc[8], *hcpu[3], *hgpu = (unsigned char*)malloc(slot);
  CUdeviceptr dsrc[8], ddst[3];
  for (int k = 0; k < 8; k++) {
    hsrc[k] = (unsigned char*)malloc(slot);
    CU(cuMemAlloc(&dsrc[k], slot));
  }
  for (int j = 0; j < 3; j++) {
    hcpu[j] = (unsigned char*)malloc(slot);
    CU(cuMemAlloc(&ddst[j], slot));
  }
  size_t bad = 0, tasks = 0;
  int bw_only = argc > 2 && strcmp(argv[2], "bw") == 0;
  int small = argc > 2 && strcmp(argv[2], "small") == 0;
  int check_only = argc > 2 && strcmp(argv[2], "check") == 0;
  for (int type = 0; type < ncclNumTypes && !bw_only; type++) {
    size_t type_bad = 0;
    for (int op = KERN_SUM; op <= KERN_MIN; op++)
      for (size_t si = 0; si < sizeof(k_nsrcs) / sizeof(k_nsrcs[0]); si++)
        for (int flags = 0; flags < 4; flags++)
          for (size_t li = 0; li < sizeof(k_lens) / sizeof(k_lens[0]); li++) {
            int ns = k_nsrcs[si], nd = 1 + (int)((li + si) % 3), off = (int)((li + flags) % 4);
            unsigned pre = (flags & 1) ? (unsigned)(rnd() | 1) : 0u;
            if ((ns == 1 && op != KERN_SUM) || (small && k_lens[li] > MAX_N)) continue;
            size_t n = k_lens[li], s = (n + MAX_OFF) * 8;
            type_bad +=
                one(type, op, pre, flags >> 1, ns, nd, n, off, hsrc, hcpu, hgpu, dsrc, ddst, s);
            tasks++;
          }
    printf("type %2d: %zu elements differ\n", type, type_bad);
    bad += type_bad;
  }
  printf("bitwise: %zu tasks, %zu elements differ from the CPU kernels\n", tasks, bad);
  if (!bw_only) bad += rows_check(hsrc, hcpu, hgpu, dsrc, ddst);
  if (!bw_only) bad += rows_table_check(hsrc, hcpu, hgpu, dsrc, ddst);
  if (!bw_only) bad += tree_check(hsrc, hgpu, dsrc, ddst, small);
  if (!small && !check_only) bandwidth();
  return bad != 0;
}
