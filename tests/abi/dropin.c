/*
 * A program written for NCCL: built against NVIDIA's own nccl.h (the CUDA
 * toolkit's, 2.28.9 here), linked with -lnccl, it must load Braid's
 * libnccl.so.2 and, across forked ranks on host buffers, all-reduce with
 * that header's larger ncclConfig_t and call every host function 2.28 adds:
 * all-to-all, gather and scatter (every element checked), a simulated
 * group, a window, a shrink that drops the last rank, and a revoke.
 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define NRANKS 4
#define BLOCK 1031
#define COUNT 100003

static float value(int from, int to, int i) {
  return (float)(from * 100000 + to * 1000 + i % 997);
}

static int check(int rank, const char* what, const float* got, const float* want, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "rank %d: %s [%zu] = %g, expected %g\n", rank, what, i, got[i], want[i]);
      return 1;
    }
  return 0;
}

/* ncclAlltoAll, ncclGather and ncclScatter (root 2), every element. */
static int p2p_collectives(int rank, ncclComm_t comm) {
  size_t n = (size_t)BLOCK * NRANKS;
  float *send = malloc(n * sizeof(float)), *recv = malloc(n * sizeof(float));
  float* want = malloc(n * sizeof(float));
  int bad = 0, root = 2;
  for (int p = 0; p < NRANKS; p++)
    for (int i = 0; i < BLOCK; i++) send[p * BLOCK + i] = value(rank, p, i);
  for (int p = 0; p < NRANKS; p++)
    for (int i = 0; i < BLOCK; i++) want[p * BLOCK + i] = value(p, rank, i);
  bad += ncclAlltoAll(send, recv, BLOCK, ncclFloat, comm, (cudaStream_t)0) != ncclSuccess;
  bad += bad ? 0 : check(rank, "ncclAlltoAll", recv, want, n);
  for (int p = 0; p < NRANKS; p++)
    for (int i = 0; i < BLOCK; i++) want[p * BLOCK + i] = value(p, 0, i);
  for (int i = 0; i < BLOCK; i++) send[i] = value(rank, 0, i);
  bad += ncclGather(send, recv, BLOCK, ncclFloat, root, comm, (cudaStream_t)0) != ncclSuccess;
  if (!bad && rank == root) bad += check(rank, "ncclGather", recv, want, n);
  for (int p = 0; p < NRANKS; p++)
    for (int i = 0; i < BLOCK; i++) send[p * BLOCK + i] = value(root, p, i);
  for (int i = 0; i < BLOCK; i++) want[i] = value(root, rank, i);
  bad += ncclScatter(send, recv, BLOCK, ncclFloat, root, comm, (cudaStream_t)0) != ncclSuccess;
  bad += bad ? 0 : check(rank, "ncclScatter", recv, want, BLOCK);
  free(send), free(recv), free(want);
  return bad;
}

/* A group ended by ncclGroupSimulateEnd runs nothing and reports a time. */
static int simulated_group(ncclComm_t comm) {
  float x[64];
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  for (int i = 0; i < 64; i++) x[i] = -1;
  ncclGroupStart();
  ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comm, (cudaStream_t)0);
  if (ncclGroupSimulateEnd(&sim) != ncclSuccess || !(sim.estimatedTime > 0) || x[0] != -1) {
    fprintf(stderr, "ncclGroupSimulateEnd: time %g, buffer %g\n", sim.estimatedTime, x[0]);
    return 1;
  }
  return 0;
}

static int window(ncclComm_t comm) {
  static float buf[4096];
  ncclWindow_t win = NULL;
  int bad = ncclCommWindowRegister(comm, buf, sizeof(buf), &win, NCCL_WIN_DEFAULT) != ncclSuccess;
  if (!bad) bad += ncclAllReduce(buf, buf, 4096, ncclFloat, ncclSum, comm, (cudaStream_t)0) != 0;
  if (!bad) bad += ncclCommWindowDeregister(comm, win) != ncclSuccess;
  if (bad) fprintf(stderr, "window: %s\n", ncclGetLastError(comm));
  return bad;
}

/* The last rank leaves; the others shrink it away and all-reduce. */
static int shrink(int rank, ncclComm_t comm) {
  int gone = NRANKS - 1;
  ncclComm_t small = NULL;
  float x = (float)(rank + 1);
  if (rank == gone) return 0;
  if (ncclCommShrink(comm, &gone, 1, &small, NULL, NCCL_SHRINK_DEFAULT) != ncclSuccess ||
      ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, small, (cudaStream_t)0) != ncclSuccess ||
      x != (float)(NRANKS - 1) * NRANKS / 2) {
    fprintf(stderr, "rank %d: shrink: %g (%s)\n", rank, x, ncclGetLastError(comm));
    return 1;
  }
  return ncclCommDestroy(small) != ncclSuccess;
}

static int rank_main(int rank, ncclUniqueId id) {
  ncclComm_t comm;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER; /* the newer header's bigger struct */
  float* buf = malloc(sizeof(float) * COUNT);
  int version = 0;
  ncclGetVersion(&version);
  if (version != 23203) { /* Braid's BRAID_NCCL_LEVEL; the toolkit's NCCL reports 22809 */
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
    float expect = (float)(0 + 1 + 2 + 3 + NRANKS * (i % 5));
    if (buf[i] != expect) {
      fprintf(stderr, "rank %d: [%d] = %g, expected %g\n", rank, i, buf[i], expect);
      return 1;
    }
  }
  free(buf);
  int bad = p2p_collectives(rank, comm) + simulated_group(comm) + window(comm) + shrink(rank, comm);
  /* Revoke: new calls are refused, the comm still destroys. */
  float x = 1;
  if (ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) != ncclSuccess ||
      ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, (cudaStream_t)0) != ncclInvalidUsage) {
    fprintf(stderr, "rank %d: revoke: %s\n", rank, ncclGetLastError(comm));
    bad++;
  }
  ncclCommDestroy(comm);
  return bad;
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
