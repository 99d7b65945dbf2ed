/*
 * A program written for NCCL: built against NVIDIA's own (newer) nccl.h,
 * linked with -lnccl, it must load Braid's libnccl.so.2 and all-reduce host
 * buffers across forked ranks - including a larger ncclConfig_t.
 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NRANKS 3
#define COUNT 100003

static int rank_main(int rank, ncclUniqueId id) {
  ncclComm_t comm;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER; /* the newer header's bigger struct */
  float* buf = malloc(sizeof(float) * COUNT);
  int version = 0;
  ncclGetVersion(&version);
  if (version != 22602) { /* Braid's BRAID_NCCL_LEVEL; NVIDIA's own reports its release */
    fprintf(stderr, "rank %d: loaded a library reporting version %d, not Braid\n", rank, version);
    return 1;
  }
  if (ncclCommInitRankConfig(&comm, NRANKS, id, rank, &cfg) != ncclSuccess) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, ncclGetLastError(NULL));
    return 1;
  }
  for (int i = 0; i < COUNT; i++) buf[i] = (float)(rank + i % 5);
  if (ncclAllReduce(buf, buf, COUNT, ncclFloat, ncclSum, comm, (cudaStream_t)0) != ncclSuccess) {
    fprintf(stderr, "rank %d: all-reduce failed: %s\n", rank, ncclGetLastError(comm));
    return 1;
  }
  for (int i = 0; i < COUNT; i++) {
    float expect = (float)(0 + 1 + 2 + 3 * (i % 5));
    if (buf[i] != expect) {
      fprintf(stderr, "rank %d: [%d] = %g, expected %g\n", rank, i, buf[i], expect);
      return 1;
    }
  }
  ncclCommDestroy(comm);
  free(buf);
  return 0;
}

int main(void) {
  ncclUniqueId id;
  pid_t pids[NRANKS];
  int failed = 0;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 1;
  for (int r = 0; r < NRANKS; r++)
    if ((pids[r] = fork()) == 0) _exit(rank_main(r, id));
  for (int r = 0; r < NRANKS; r++) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  printf("dropin: %s\n", failed ? "FAILED" : "ok");
  return failed;
}
