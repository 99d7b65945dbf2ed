/*
 * The tuner on device buffers inside one node: direct (src/cuda/cuda_direct.h)
 * against staging through pinned host memory and running the host
 * algorithm the tuner picks there. Every input (the comm's model, the
 * call, how many ranks share a device) is the same on every rank, so the
 * ranks choose alike.
 *
 * Figures measured on an H200 (docs/gpu-validation.md sections 1-3):
 * a device-to-device copy moves 4100 GB/s (bytes read + written), a
 * stream memory operation is seen across the host boundary in 3 us (11 us
 * for a round trip between two processes), a kernel launch costs 8 us.
 * The Unix-socket message between two ranks' proxies (5 us) is this CPU
 * machine's. The staging copies' rate (25 GB/s, a PCIe 4 x16 link's
 * practical rate) is an estimate: docs/gpu-validation.md section 4 lists
 * the run that measures it and the direct latency on a GPU.
 */
#include "comm/comm.h"
#include "core.h"
#include "tune/tuner.h"
#include "tune/tuner_device.h"
#include "sched_algos.h"

#define DEV_COPY_GBPS 4100.0 /* = bytes per ns, x1000 per us */
#define DEV_HOP_US 3.0       /* a flag written on one side, seen on the other */
#define DEV_LAUNCH_US 8.0
#define DEV_MSG_US 5.0
#define STAGE_COPY_GBPS 25.0

/* Bytes one rank's direct task reads and writes, for a call on `bytes`
 * (the larger buffer, as tuner_choose has it) over k ranks. */
static double direct_bytes(int coll, double bytes, int k) {
  switch (coll) {
    case COLL_ALLREDUCE: /* its slice from every input, to every output */
      return 2.0 * bytes;
    case COLL_ALLGATHER: /* its block once, to every output */
    case COLL_REDUCESCATTER:
      return bytes / k * (k + 1);
    default: /* broadcast, reduce: its slice from k inputs or to k outputs, plus one */
      return bytes / k * (k + 1);
  }
}

/* Ready seen by the proxy, buffers described and done told (a message each
 * way, the peers' in parallel), go seen by the stream, the launch, ran
 * seen by the proxy, done seen by the stream. */
static double direct_time(int coll, double bytes, int k, int ranks_per_device) {
  double alpha = 4 * DEV_HOP_US + 3 * DEV_MSG_US + DEV_LAUNCH_US;
  return alpha + direct_bytes(coll, bytes, k) * ranks_per_device / (DEV_COPY_GBPS * 1000.0);
}

/* Copy in, gate, the host algorithm, copy out. */
static double staged_time(const struct ncclComm* comm, int coll, double bytes, int* algo) {
  double host = tuner_host_best(comm, coll, (size_t)bytes, algo);
  return 2 * DEV_HOP_US + 2 * DEV_LAUNCH_US + 2.0 * bytes / (STAGE_COPY_GBPS * 1000.0) + host;
}

int tuner_prefers_direct(const struct ncclComm* comm, int coll, size_t bytes,
                         int ranks_per_device) {
  int algo;
  double direct = direct_time(coll, (double)bytes, comm->nranks, ranks_per_device);
  double staged = staged_time(comm, coll, (double)bytes, &algo);
  INFO(SUB_TUNING, "%s %zu bytes nranks %d on devices: Direct %.1f us, staged %s %.1f us",
       sched_coll_name(coll), bytes, comm->nranks, direct, sched_algo_name(algo), staged);
  return direct <= staged;
}
