/*
 * GPUDirect RDMA detection (ib_gdr.h).
 */
#include "ib_gdr.h"

#include <stdio.h>
#include <unistd.h>

const char* ib_gdr_module(const char* root) {
  static const struct {
    const char* path;
    const char* name;
  } k_marks[] = {{"sys/module/nvidia_peermem", "nvidia_peermem"},
                 {"sys/kernel/mm/memory_peers/nv_mem/version", "nv_peer_mem"},
                 {"sys/module/nv_peer_mem", "nv_peer_mem"}};
  char path[512];
  for (size_t i = 0; i < sizeof(k_marks) / sizeof(k_marks[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", root, k_marks[i].path);
    if (access(path, F_OK) == 0) return k_marks[i].name;
  }
  return NULL;
}
