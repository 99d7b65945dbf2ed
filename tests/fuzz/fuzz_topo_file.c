/* NCCL_TOPO_FILE's JSON parser (src/topo/topo_file.c). Properties: all or nothing
 * (a failed parse leaves the struct zeroed); a parsed topology respects its
 * bounds; written back and read again it is the same, byte for byte. */
#include <string.h>
#include <unistd.h>

#include "fuzz.h"
#include "topo/topo.h"

/* memcmp, not a loop: this file is instrumented too, and a byte loop over
 * 40 KiB cost the fuzzer 90% of its time in comparison tracing. */
static int all_zero(const struct topo_system* s) {
  static const struct topo_system zero;
  return memcmp(s, &zero, sizeof(zero)) == 0;
}

static int terminated(const char* s, size_t cap) {
  return memchr(s, '\0', cap) != NULL;
}

static void check_bounds(const struct topo_system* s) {
  FUZZ_ASSERT(s->nnuma >= 0 && s->nnuma <= TOPO_MAX_NUMA);
  FUZZ_ASSERT(s->nnics >= 0 && s->nnics <= TOPO_MAX_NICS);
  FUZZ_ASSERT(s->ngpus >= 0 && s->ngpus <= TOPO_MAX_GPUS);
  FUZZ_ASSERT(terminated(s->hostname, sizeof(s->hostname)));
  for (int i = 0; i < s->nnuma; i++)
    FUZZ_ASSERT(terminated(s->numa[i].cpuset, sizeof(s->numa[i].cpuset)));
  for (int i = 0; i < s->nnics; i++)
    FUZZ_ASSERT(terminated(s->nics[i].name, sizeof(s->nics[i].name)) &&
                terminated(s->nics[i].pci, sizeof(s->nics[i].pci)));
  for (int i = 0; i < s->ngpus; i++)
    FUZZ_ASSERT(terminated(s->gpus[i].pci, sizeof(s->gpus[i].pci)));
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static struct topo_system sys, back; /* 40 KiB: not on the stack */
  static char path[64];
  if (path[0] == '\0') snprintf(path, sizeof(path), "/tmp/braid-fuzz-topo.%d.json", (int)getpid());
  memset(&sys, 0xa5, sizeof(sys)); /* the parser must clear it either way */
  if (topo_parse_text("fuzz", (const char*)data, size, &sys) != ncclSuccess) {
    FUZZ_ASSERT(all_zero(&sys));
    return 0;
  }
  check_bounds(&sys);
  topo_log_summary(&sys);
  if (sys.nnics > 0) FUZZ_ASSERT(topo_nic_find(&sys, sys.nics[0].name) != NULL);
  FUZZ_ASSERT(topo_write_file(&sys, path) == ncclSuccess);
  FUZZ_ASSERT(topo_read_file(path, &back) == ncclSuccess);
  FUZZ_ASSERT(memcmp(&sys, &back, sizeof(sys)) == 0);
  unlink(path);
  return 0;
}
