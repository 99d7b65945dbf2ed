/* BRAID_TUNE_FILE's parser (src/tune/tuner_file.c), read through a memory stream,
 * and the model it feeds. Properties: whatever a file that parses says, the
 * model holds finite costs >= 0 and valid forced ranges, and every modelled
 * time is a number >= 0. */
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "tune/tuner.h"

/* 8 ranks as 2 nodes x 4 over shared memory and the network. */
static void model_init(struct tuner_model* m) {
  memset(m, 0, sizeof(*m));
  m->nranks = 8, m->nnodes = 2, m->min_ppn = 4, m->max_ppn = 4, m->tree_depth = 4;
  m->intra_transport = &shm_transport, m->net_transport = &tcp_transport;
  m->oversub = 1.0, m->nic_mbps = 10000, m->mem_mbps = 20000;
  m->slot_bytes = 64 << 10, m->hier_pipelined = 1;
  for (int a = 0; a < ALGO_COUNT; a++) {
    m->intra.alpha_us[a] = 2, m->intra.beta_us_per_kb[a] = 0.05;
    m->net.alpha_us[a] = 20, m->net.beta_us_per_kb[a] = 0.8;
  }
}

static void check_model(const struct tuner_model* m) {
  FUZZ_ASSERT(m->nforced >= 0 && m->nforced <= TUNER_MAX_FORCED);
  for (int a = 0; a < ALGO_COUNT; a++) {
    const struct tuner_link* links[2] = {&m->intra, &m->net};
    for (int l = 0; l < 2; l++) {
      FUZZ_ASSERT(isfinite(links[l]->alpha_us[a]) && links[l]->alpha_us[a] >= 0);
      FUZZ_ASSERT(isfinite(links[l]->beta_us_per_kb[a]) && links[l]->beta_us_per_kb[a] >= 0);
    }
  }
  for (int i = 0; i < m->nforced; i++) {
    const struct tuner_forced* f = &m->forced[i];
    FUZZ_ASSERT(f->coll >= 0 && f->coll < COLL_COUNT && f->algo >= 0 && f->algo < ALGO_COUNT);
    FUZZ_ASSERT(f->lo <= f->hi);
    int algo;
    size_t chunk;
    FUZZ_ASSERT(tuner_file_choice(m, f->coll, f->lo, ~0u, &algo, &chunk));
    FUZZ_ASSERT(chunk > 0);
  }
}

static void check_costs(const struct tuner_model* m) {
  static const double sizes[] = {0, 8, 65536, 1 << 20, 256.0 * (1 << 20)};
  for (int c = 0; c < COLL_COUNT; c++)
    for (int a = 0; a < ALGO_COUNT; a++)
      for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        double t = tuner_cost(m, c, a, sizes[i]);
        FUZZ_ASSERT(!isnan(t) && t >= 0);
      }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  struct tuner_model m;
  char* text = fuzz_str(data, size);
  FILE* f = fmemopen(text, size, "r");
  model_init(&m);
  if (f != NULL && size > 0 && tuner_file_parse(f, "fuzz", &m) == ncclSuccess) {
    check_model(&m);
    check_costs(&m);
    m.nnodes = 1, m.min_ppn = m.max_ppn = 8; /* and on one node */
    check_costs(&m);
  }
  if (f != NULL) fclose(f);
  free(text);
  return 0;
}
