/*
 * braid-train's data and state handling: the IDX loader on good, truncated, corrupt and
 * malformed files; the per-epoch shuffle and the shards; checkpoints (round trip, corruption);
 * the learning-rate schedule; the command line.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint.h"
#include "idx.h"
#include "optim.h"
#include "options.h"
#include "shard.h"

#define N_IMAGES 50
#define SIDE 28

static char g_dir[256];

static void path_of(char* out, size_t n, const char* name) {
  snprintf(out, n, "%s/%s", g_dir, name);
}

static void put_be32(uint8_t* p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* An IDX file: header words then payload, gzip-compressed or plain. */
static void write_idx(const char* name, const uint32_t* words, int nwords, const uint8_t* payload,
                      size_t bytes, int gz) {
  char path[512];
  path_of(path, sizeof(path), name);
  uint8_t head[16];
  for (int i = 0; i < nwords; i++) put_be32(head + 4 * i, words[i]);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, head, 4 * nwords), 4 * nwords);
    if (bytes) assert_int_equal(gzwrite(f, payload, (unsigned)bytes), (int)bytes);
    assert_int_equal(gzclose(f), Z_OK);
  } else {
    FILE* f = fopen(path, "wb");
    assert_non_null(f);
    fwrite(head, 1, 4 * (size_t)nwords, f);
    fwrite(payload, 1, bytes, f);
    fclose(f);
  }
}

/* Pixels that do not compress, so the gzip stream is mostly stored bytes. */
static uint8_t* pixels(void) {
  uint8_t* p = malloc(N_IMAGES * SIDE * SIDE);
  uint32_t x = 2463534242u;
  for (int i = 0; i < N_IMAGES * SIDE * SIDE; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = (uint8_t)x;
  }
  return p;
}

static void write_good_set(const char* prefix, int gz) {
  uint8_t* px = pixels();
  uint8_t labels[N_IMAGES];
  for (int i = 0; i < N_IMAGES; i++) labels[i] = (uint8_t)(i % 10);
  char name[128];
  uint32_t img_head[4] = {0x803, N_IMAGES, SIDE, SIDE}, lab_head[2] = {0x801, N_IMAGES};
  snprintf(name, sizeof(name), "%s-images-idx3-ubyte%s", prefix, gz ? ".gz" : "");
  write_idx(name, img_head, 4, px, N_IMAGES * SIDE * SIDE, gz);
  snprintf(name, sizeof(name), "%s-labels-idx1-ubyte%s", prefix, gz ? ".gz" : "");
  write_idx(name, lab_head, 2, labels, N_IMAGES, gz);
  free(px);
}

static int setup_dir(void** state) {
  (void)state;
  snprintf(g_dir, sizeof(g_dir), "/tmp/braid-train-test-%d", (int)getpid());
  mkdir(g_dir, 0700);
  return 0;
}

static int remove_dir(void** state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_good_gz_and_plain(void** state) {
  (void)state;
  char err[1024];
  idx_set_t set;
  write_good_set("train", 1);
  assert_int_equal(idx_load_set(g_dir, "train", &set, err, sizeof(err)), 0);
  assert_int_equal(set.count, N_IMAGES);
  assert_int_equal(set.rows, SIDE);
  assert_int_equal(set.cols, SIDE);
  uint8_t* px = pixels();
  assert_memory_equal(set.images, px, N_IMAGES * SIDE * SIDE);
  assert_int_equal(set.labels[13], 3);
  idx_free(&set);
  write_good_set("plain", 0);
  assert_int_equal(idx_load_set(g_dir, "plain", &set, err, sizeof(err)), 0);
  assert_memory_equal(set.images, px, N_IMAGES * SIDE * SIDE);
  idx_free(&set);
  free(px);
}

static void expect_failure(const char* name, int images, const char* needle) {
  char path[512], err[1024] = "";
  idx_set_t set;
  memset(&set, 0, sizeof(set));
  path_of(path, sizeof(path), name);
  int rc = images ? idx_load_images(path, &set, err, sizeof(err))
                  : idx_load_labels(path, &set, err, sizeof(err));
  if (rc == 0 || strstr(err, needle) == NULL || strstr(err, path) == NULL) {
    print_error("%s: rc %d, message '%s' (wanted one naming the file and saying '%s')\n", name, rc,
                err, needle);
    fail();
  }
  assert_null(set.images);
  assert_null(set.labels);
}

static void copy_prefix(const char* from, const char* to, long bytes) {
  char a[512], b[512];
  path_of(a, sizeof(a), from);
  path_of(b, sizeof(b), to);
  FILE* in = fopen(a, "rb");
  FILE* out = fopen(b, "wb");
  assert_non_null(in);
  assert_non_null(out);
  for (long i = 0; i < bytes; i++) {
    int c = fgetc(in);
    if (c == EOF) break;
    fputc(c, out);
  }
  fclose(in);
  fclose(out);
}

static long size_of(const char* name) {
  char p[512];
  struct stat st;
  path_of(p, sizeof(p), name);
  assert_int_equal(stat(p, &st), 0);
  return (long)st.st_size;
}

static void test_truncated(void** state) {
  (void)state;
  write_good_set("train", 1);
  const char* good = "train-images-idx3-ubyte.gz";
  copy_prefix(good, "cut-images.gz", size_of(good) / 2);
  expect_failure("cut-images.gz", 1, "truncated");
  copy_prefix(good, "header-only.gz", 12); /* inside the gzip header */
  expect_failure("header-only.gz", 1, "truncated");
  write_good_set("plain", 0);
  copy_prefix("plain-labels-idx1-ubyte", "cut-labels", 8 + N_IMAGES / 2);
  expect_failure("cut-labels", 0, "truncated");
}

static void test_corrupt(void** state) {
  (void)state;
  write_good_set("train", 1);
  const char* good = "train-images-idx3-ubyte.gz";
  const long n = size_of(good);
  copy_prefix(good, "flipped.gz", n);
  char p[512];
  path_of(p, sizeof(p), "flipped.gz");
  FILE* f = fopen(p, "r+b");
  fseek(f, n / 2, SEEK_SET);
  int c = fgetc(f);
  fseek(f, n / 2, SEEK_SET);
  fputc(c ^ 0x5a, f);
  fclose(f);
  expect_failure("flipped.gz", 1, "corrupt");
  /* the CRC and length trailer */
  copy_prefix(good, "badtrailer.gz", n);
  path_of(p, sizeof(p), "badtrailer.gz");
  f = fopen(p, "r+b");
  fseek(f, n - 6, SEEK_SET);
  fputc(0xff, f);
  fclose(f);
  expect_failure("badtrailer.gz", 1, "corrupt");
}

static void test_malformed(void** state) {
  (void)state;
  uint8_t labels[4] = {1, 2, 3, 4}, bad_labels[4] = {1, 2, 12, 4};
  uint32_t wrong_magic[2] = {0x803, 4}, lab_head[2] = {0x801, 4};
  write_idx("magic.gz", wrong_magic, 2, labels, 4, 1);
  expect_failure("magic.gz", 0, "magic");
  write_idx("class.gz", lab_head, 2, bad_labels, 4, 1);
  expect_failure("class.gz", 0, "class");
  uint32_t long_head[2] = {0x801, 3}; /* four labels where three are announced */
  write_idx("long.gz", long_head, 2, labels, 4, 1);
  expect_failure("long.gz", 0, "past the end");
  expect_failure("does-not-exist.gz", 0, "No such file");
  /* images and labels that disagree on the count */
  char err[1024];
  idx_set_t set;
  write_good_set("mixed", 1);
  write_idx("mixed-labels-idx1-ubyte.gz", lab_head, 2, labels, 4, 1);
  assert_int_not_equal(idx_load_set(g_dir, "mixed", &set, err, sizeof(err)), 0);
  assert_non_null(strstr(err, "4 labels"));
}

/* The Debian copy, when installed: the real sizes. */
static void test_real_dataset(void** state) {
  (void)state;
  const char* dir = "/usr/share/datasets/fashion-mnist";
  if (access(dir, R_OK) != 0) skip();
  char err[1024];
  idx_set_t set;
  assert_int_equal(idx_load_set(dir, "t10k", &set, err, sizeof(err)), 0);
  assert_int_equal(set.count, 10000);
  assert_int_equal(set.rows, 28);
  idx_free(&set);
}

/* ---------------------------------------------------------------- shuffle and shards */

static void test_shuffle_is_a_seeded_permutation(void** state) {
  (void)state;
  enum { N = 1000, B = 100 };
  shard_plan_t a, b;
  assert_int_equal(shard_init(&a, N, B, 0, 1, 42), 0);
  assert_int_equal(shard_init(&b, N, B, 0, 1, 42), 0);
  assert_int_equal(a.steps_per_epoch, N / B);
  shard_begin_epoch(&a, 3);
  shard_begin_epoch(&b, 3);
  assert_memory_equal(a.order, b.order, N * sizeof(int));
  char seen[N] = {0};
  for (int i = 0; i < N; i++) seen[a.order[i]]++;
  for (int i = 0; i < N; i++) assert_int_equal(seen[i], 1);
  shard_begin_epoch(&b, 4);
  assert_memory_not_equal(a.order, b.order, N * sizeof(int));
  shard_free(&b);
  assert_int_equal(shard_init(&b, N, B, 0, 1, 43), 0);
  shard_begin_epoch(&b, 3);
  assert_memory_not_equal(a.order, b.order, N * sizeof(int));
  shard_free(&a);
  shard_free(&b);
}

static void test_shards_partition_the_batch(void** state) {
  (void)state;
  enum { N = 500, B = 103, W = 4 };
  shard_plan_t p[W];
  for (int r = 0; r < W; r++) {
    assert_int_equal(shard_init(&p[r], N, B, r, W, 7), 0);
    shard_begin_epoch(&p[r], 1);
  }
  for (int step = 0; step < N / B; step++) {
    int pos = 0;
    for (int r = 0; r < W; r++) {
      int n;
      const int* idx = shard_batch(&p[r], step, &n);
      assert_true(n == B / W || n == B / W + 1);
      assert_true(n <= shard_max_local(B, W));
      for (int i = 0; i < n; i++) assert_int_equal(idx[i], p[0].order[step * B + pos + i]);
      pos += n;
    }
    assert_int_equal(pos, B);
  }
  for (int r = 0; r < W; r++) shard_free(&p[r]);
}

static void test_fill_normalizes(void** state) {
  (void)state;
  uint8_t img[4] = {0, 255, 73, 0}, lab[2] = {3, 9};
  idx_set_t set = {.count = 2, .rows = 1, .cols = 2, .images = img, .labels = lab};
  float x[4];
  uint8_t y[2];
  int idx[2] = {1, 0};
  shard_fill(&set, idx, 2, x, y);
  assert_int_equal(y[0], 9);
  assert_true(x[1] < -0.8f && x[1] > -0.82f); /* 0 -> -mean/std */
  assert_true(x[3] > 2.0f);                   /* 255 -> (1-mean)/std */
}

/* ---------------------------------------------------------------- checkpoints */

static void test_checkpoint_round_trip(void** state) {
  (void)state;
  enum { N = 1000 };
  float params[N], velocity[N], p2[N], v2[N];
  for (int i = 0; i < N; i++) {
    params[i] = (float)i * 0.5f;
    velocity[i] = -(float)i;
  }
  ckpt_meta_t meta = {.seed = 9,
                      .world = 4,
                      .global_batch = 256,
                      .epoch = 2,
                      .step = 17,
                      .global_step = 77,
                      .rng = {1, 2, 3, 4},
                      .nhistory = 2};
  snprintf(meta.config, sizeof(meta.config), "model=mlp");
  epoch_row_t rows[2] = {{.epoch = 1, .train_loss = 0.5}, {.epoch = 2, .train_loss = 0.4}};
  ckpt_blob_t blob, back;
  float states[2][3] = {{1, 2, 3}, {4, 5, 6}};
  assert_int_equal(ckpt_build(&blob, &meta, rows, params, velocity, N, &states[0][0], 2, 3), 0);
  char path[512], err[1024];
  path_of(path, sizeof(path), "ckpt");
  assert_int_equal(ckpt_write(path, &blob, err, sizeof(err)), 0);
  assert_int_equal(ckpt_read(path, &back, err, sizeof(err)), 0);
  ckpt_meta_t m2;
  epoch_row_t r2[4];
  assert_int_equal(ckpt_parse(&back, &m2, r2, 4, p2, v2, N, err, sizeof(err)), 0);
  assert_memory_equal(&m2, &meta, sizeof(meta));
  assert_memory_equal(p2, params, sizeof(params));
  assert_memory_equal(v2, velocity, sizeof(velocity));
  assert_true(r2[1].train_loss == 0.4);
  assert_int_equal(ckpt_nparams(&back), N);
  int sranks;
  size_t sfloats;
  const float* sback = ckpt_states(&back, &sranks, &sfloats);
  assert_true(sback != NULL && sranks == 2 && sfloats == 3);
  assert_memory_equal(sback, states, sizeof(states));
  /* a model of another size */
  assert_int_not_equal(ckpt_parse(&back, &m2, r2, 4, p2, v2, N - 1, err, sizeof(err)), 0);
  assert_non_null(strstr(err, "parameters"));
  /* one flipped byte */
  ((char*)back.data)[back.bytes / 2] ^= 1;
  assert_int_not_equal(ckpt_parse(&back, &m2, r2, 4, p2, v2, N, err, sizeof(err)), 0);
  assert_non_null(strstr(err, "checksum"));
  /* cut short */
  back.bytes -= 100;
  assert_int_not_equal(ckpt_parse(&back, &m2, r2, 4, p2, v2, N, err, sizeof(err)), 0);
  assert_non_null(strstr(err, "truncated"));
  /* no temp file left behind */
  char tmp[600];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  assert_int_not_equal(access(tmp, F_OK), 0);
  ckpt_blob_free(&blob);
  ckpt_blob_free(&back);
}

/* ---------------------------------------------------------------- schedule */

static void test_lr_schedule(void** state) {
  (void)state;
  optim_config_t c = {.lr = 0.1,
                      .warmup_epochs = 1,
                      .schedule = SCHEDULE_COSINE,
                      .epochs = 10,
                      .steps_per_epoch = 100,
                      .global_batch = 512};
  const double peak = 0.2; /* linear scaling: twice the reference batch */
  assert_true(fabs(optim_lr(&c, 0, 0) - peak / 100) < 1e-12);
  assert_true(fabs(optim_lr(&c, 0, 99) - peak) < 1e-12);
  assert_true(fabs(optim_lr(&c, 1, 0) - peak) < 1e-12);
  assert_true(optim_lr(&c, 5, 50) < peak * 0.6 && optim_lr(&c, 5, 50) > peak * 0.4);
  assert_true(optim_lr(&c, 9, 99) < peak * 1e-3);
  c.schedule = SCHEDULE_STEP;
  c.step_epochs = 3;
  c.gamma = 0.1;
  assert_true(fabs(optim_lr(&c, 2, 5) - peak) < 1e-12);
  assert_true(fabs(optim_lr(&c, 3, 0) - peak * 0.1) < 1e-12);
  assert_true(fabs(optim_lr(&c, 7, 0) - peak * 0.01) < 1e-12);
}

/* ---------------------------------------------------------------- flags */

static int parse(options_t* o, const char* line) {
  char buf[512], *argv[32];
  int argc = 0;
  snprintf(buf, sizeof(buf), "braid-train %s", line);
  for (char* tok = strtok(buf, " "); tok && argc < 31; tok = strtok(NULL, " ")) argv[argc++] = tok;
  argv[argc] = NULL;
  return options_parse(argc, argv, o, 0);
}

static void test_options(void** state) {
  (void)state;
  options_t o;
  assert_int_equal(parse(&o, ""), 0);
  assert_int_equal(o.model.kind, MODEL_MLP);
  assert_int_equal(o.model.nhidden, 2);
  assert_int_equal(o.blas_threads, 1);
  assert_int_equal(parse(&o, "--model cnn --epochs 3 --batch 64 --lr 0.05"), 0);
  assert_int_equal(o.model.kind, MODEL_CNN);
  assert_int_equal(o.model.hidden[0], 128); /* the CNN's own default */
  assert_int_equal(o.global_batch, 64);
  assert_int_equal(parse(&o, "--hidden 32,16,8 --inject-divergence 1:5 --csv none"), 0);
  assert_int_equal(o.model.nhidden, 3);
  assert_int_equal(o.diverge_rank, 1);
  assert_int_equal(o.csv[0], '\0');
  assert_int_equal(parse(&o, "--help"), 1);
  assert_int_equal(parse(&o, "--model rnn"), -1);
  assert_int_equal(parse(&o, "--epochs 0"), -1);
  assert_int_equal(parse(&o, "--lr fast"), -1);
  assert_int_equal(parse(&o, "--hidden 3,,4"), -1);
  assert_int_equal(parse(&o, "--resume"), -1); /* needs --checkpoint */
  assert_int_equal(parse(&o, "--bogus"), -1);
  assert_int_equal(parse(&o, "stray"), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_good_gz_and_plain),
      cmocka_unit_test(test_truncated),
      cmocka_unit_test(test_corrupt),
      cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_real_dataset),
      cmocka_unit_test(test_shuffle_is_a_seeded_permutation),
      cmocka_unit_test(test_shards_partition_the_batch),
      cmocka_unit_test(test_fill_normalizes),
      cmocka_unit_test(test_checkpoint_round_trip),
      cmocka_unit_test(test_lr_schedule),
      cmocka_unit_test(test_options),
  };
  return cmocka_run_group_tests(tests, setup_dir, remove_dir);
}
