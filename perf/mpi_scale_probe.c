/* mpi_scale_probe: what one rank costs as the job grows, Braid beside Open MPI in one launch
 * (perf/scale_real.sh runs it at 8..128 ranks on emulated hosts).
 *
 * Each rank measures, from /proc/self: resident memory, file descriptors, sockets, threads and
 * /dev/shm mapped, at three points - before MPI_Init, after Open MPI's init and its collectives,
 * and after Braid's (ncclCommInitRank and the same collectives) - and times both inits to the end
 * of the first 8-byte all-reduce. Braid's connections are counted after init (none: they are
 * made when a schedule first needs a peer) and after the collectives, as sockets and as the
 * distinct peers its transports logged a connection with. Every collective's result is checked
 * exactly; rank 0 prints one line per metric: min, median, max over the ranks.
 *
 *   mpirun ... mpi_scale_probe [--mb N] [--roots K] [--allreduce-only 1]
 * N: the large size, MiB (default 4). K > 1: Braid's comm is made by ncclCommInitRankScalable
 * with K ids, id i made by rank i * nranks / K (as jobs give one per node).
 * Exit status: 0 when every result was exact on every rank, 1 otherwise. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "braid.h"
#include "nccl.h"

#if PERF_HAVE_MPI
#include <mpi.h>

/* ---- what /proc says of this process ---- */

enum { M_RSS_KB, M_FDS, M_SOCKETS, M_THREADS, M_SHM_KB, M_COUNT };
static const char* const kMetric[M_COUNT] = {"rss_kb", "fds", "sockets", "threads", "shm_kb"};

static long status_field(const char* key) {
  char line[256];
  long v = -1;
  FILE* f = fopen("/proc/self/status", "r");
  size_t n = strlen(key);
  while (f && fgets(line, sizeof(line), f))
    if (strncmp(line, key, n) == 0) v = strtol(line + n, NULL, 10);
  if (f) fclose(f);
  return v;
}

static void count_fds(long* fds, long* sockets) {
  char path[300], link[64];
  DIR* d = opendir("/proc/self/fd");
  struct dirent* e;
  *fds = *sockets = 0;
  while (d && (e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    (*fds)++;
    if (n > 0 && strncmp(link, "socket:", 7) == 0) (*sockets)++;
  }
  if (d) closedir(d), (*fds)--; /* the directory's own fd */
}

static long shm_mapped_kb(void) {
  char line[512];
  unsigned long lo, hi;
  long kb = 0;
  FILE* f = fopen("/proc/self/maps", "r");
  while (f && fgets(line, sizeof(line), f))
    if (strstr(line, "/dev/shm/") && sscanf(line, "%lx-%lx", &lo, &hi) == 2)
      kb += (long)((hi - lo) / 1024);
  if (f) fclose(f);
  return kb;
}

static void sample(long m[M_COUNT]) {
  m[M_RSS_KB] = status_field("VmRSS:");
  count_fds(&m[M_FDS], &m[M_SOCKETS]);
  m[M_THREADS] = status_field("Threads:");
  m[M_SHM_KB] = shm_mapped_kb();
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- the collectives, each checked exactly (small integers in floats) ---- */

/* Rank r's element i. */
static float val(int r, size_t i) {
  return (float)(r + 1 + (int)(i % 7));
}

static void fill(float* b, size_t n, int r) {
  for (size_t i = 0; i < n; i++) b[i] = val(r, i);
}

/* The sum over ranks of val(., i). */
static float sum_of(int nranks, size_t i) {
  return (float)(nranks * (nranks + 1) / 2 + nranks * (int)(i % 7));
}

struct bufs {
  float *send, *recv;
  size_t count; /* elements per rank of the largest call */
  int rank, nranks;
};

typedef int (*coll_fn)(const struct bufs* b, size_t n, ncclComm_t comm);

/* Host buffers on stream NULL: done when the call returns. */
static int wait_ok(ncclResult_t rc, ncclComm_t comm) {
  (void)comm;
  return rc != ncclSuccess;
}

static int check_allreduce(const struct bufs* b, size_t n, ncclComm_t comm) {
  fill(b->send, n, b->rank);
  if (wait_ok(ncclAllReduce(b->send, b->recv, n, ncclFloat, ncclSum, comm, NULL), comm)) return 1;
  for (size_t i = 0; i < n; i++)
    if (b->recv[i] != sum_of(b->nranks, i)) return 1;
  return 0;
}

static int check_broadcast(const struct bufs* b, size_t n, ncclComm_t comm) {
  int root = b->nranks - 1;
  fill(b->send, n, b->rank);
  if (wait_ok(ncclBroadcast(b->send, b->recv, n, ncclFloat, root, comm, NULL), comm)) return 1;
  for (size_t i = 0; i < n; i++)
    if (b->recv[i] != val(root, i)) return 1;
  return 0;
}

static int check_reduce(const struct bufs* b, size_t n, ncclComm_t comm) {
  int root = b->nranks / 2;
  fill(b->send, n, b->rank);
  if (wait_ok(ncclReduce(b->send, b->recv, n, ncclFloat, ncclSum, root, comm, NULL), comm))
    return 1;
  for (size_t i = 0; b->rank == root && i < n; i++)
    if (b->recv[i] != sum_of(b->nranks, i)) return 1;
  return 0;
}

static int check_allgather(const struct bufs* b, size_t n, ncclComm_t comm) {
  size_t per = n / (size_t)b->nranks;
  fill(b->send, per, b->rank);
  if (wait_ok(ncclAllGather(b->send, b->recv, per, ncclFloat, comm, NULL), comm)) return 1;
  for (int r = 0; r < b->nranks; r++)
    for (size_t i = 0; i < per; i++)
      if (b->recv[(size_t)r * per + i] != val(r, i)) return 1;
  return 0;
}

static int check_reduce_scatter(const struct bufs* b, size_t n, ncclComm_t comm) {
  size_t per = n / (size_t)b->nranks;
  fill(b->send, per * (size_t)b->nranks, b->rank);
  if (wait_ok(ncclReduceScatter(b->send, b->recv, per, ncclFloat, ncclSum, comm, NULL), comm))
    return 1;
  for (size_t i = 0; i < per; i++)
    if (b->recv[i] != sum_of(b->nranks, (size_t)b->rank * per + i)) return 1;
  return 0;
}

/* Each rank to the next, as a ring of send/recv. */
static int check_sendrecv(const struct bufs* b, size_t n, ncclComm_t comm) {
  int to = (b->rank + 1) % b->nranks, from = (b->rank + b->nranks - 1) % b->nranks;
  fill(b->send, n, b->rank);
  ncclGroupStart();
  ncclSend(b->send, n, ncclFloat, to, comm, NULL);
  ncclRecv(b->recv, n, ncclFloat, from, comm, NULL);
  if (wait_ok(ncclGroupEnd(), comm)) return 1;
  for (size_t i = 0; i < n; i++)
    if (b->recv[i] != val(from, i)) return 1;
  return 0;
}

static const struct {
  const char* name;
  coll_fn fn;
} kColls[] = {{"allreduce", check_allreduce},
              {"broadcast", check_broadcast},
              {"reduce", check_reduce},
              {"allgather", check_allgather},
              {"reducescatter", check_reduce_scatter},
              {"sendrecv", check_sendrecv}};
#define NCOLLS (sizeof(kColls) / sizeof(kColls[0]))

/* Open MPI's side: its init's collectives on the same sizes (not checked: the peer, not the
 * subject; its resources after them are what is compared). */
static void mpi_collectives(const struct bufs* b, const size_t* sizes, int nsizes) {
  for (int s = 0; s < nsizes; s++) {
    size_t n = sizes[s], per = n / (size_t)b->nranks;
    MPI_Allreduce(b->send, b->recv, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Bcast(b->recv, (int)n, MPI_FLOAT, b->nranks - 1, MPI_COMM_WORLD);
    MPI_Reduce(b->send, b->recv, (int)n, MPI_FLOAT, MPI_SUM, b->nranks / 2, MPI_COMM_WORLD);
    MPI_Allgather(b->send, (int)per, MPI_FLOAT, b->recv, (int)per, MPI_FLOAT, MPI_COMM_WORLD);
    MPI_Reduce_scatter_block(b->send, b->recv, (int)per, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Sendrecv(b->send, (int)n, MPI_FLOAT, (b->rank + 1) % b->nranks, 7, b->recv, (int)n,
                 MPI_FLOAT, (b->rank + b->nranks - 1) % b->nranks, 7, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
  }
}

/* Braid's connections, from its own log: each transport logs one INFO line
 * per connection it makes ("... rank N via NET/Socket", "rank A -> rank B
 * via SHM"). The probe sends that log (NET and SHM only) to a file in a
 * directory of its own (mkdtemp, mode 700: no other user can plant or read
 * the name) before the library reads its settings. */
static char g_dir[] = "/tmp/braid-probe.XXXXXX";
static char g_log[sizeof(g_dir) + 16];

static void log_connections(void) {
  if (mkdtemp(g_dir) == NULL) return; /* no log: the peers are reported as -1 */
  snprintf(g_log, sizeof(g_log), "%s/nccl.log", g_dir);
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "NET,SHM", 1);
  setenv("NCCL_DEBUG_FILE", g_log, 1);
}

/* The peer a connection line names, or -1. */
static int line_peer(const char* line) {
  const char* p;
  int a, b;
  if ((p = strstr(line, " via NET/Socket")) != NULL) {
    while (p > line && p[-1] != ' ') p--; /* the number before " via" */
    return atoi(p);
  }
  if ((p = strstr(line, ": rank ")) != NULL && strstr(line, " via SHM") &&
      (sscanf(p, ": rank %d -> rank %d", &a, &b) == 2 ||
       sscanf(p, ": rank %d <- rank %d", &a, &b) == 2))
    return b;
  return -1;
}

/* Distinct peers this rank has a connection with, or -1. */
static long connected_peers(int nranks) {
  char line[512];
  long n = 0;
  FILE* f = g_log[0] ? fopen(g_log, "r") : NULL;
  char* seen = calloc((size_t)nranks, 1);
  if (f == NULL || seen == NULL) n = -1;
  while (n >= 0 && fgets(line, sizeof(line), f)) {
    int peer = line_peer(line);
    if (peer >= 0 && peer < nranks && !seen[peer]) seen[peer] = 1, n++;
  }
  if (f) fclose(f);
  free(seen);
  unlink(g_log);
  rmdir(g_dir);
  return n;
}

/* ---- rank 0's report: min, median, max of each figure over the ranks ---- */

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static void report(const char* name, double v, int rank, int nranks) {
  double* all = rank == 0 ? malloc(sizeof(double) * (size_t)nranks) : NULL;
  MPI_Gather(&v, 1, MPI_DOUBLE, all, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  qsort(all, (size_t)nranks, sizeof(double), cmp_double);
  printf("%-22s %12.1f %12.1f %12.1f\n", name, all[0], all[nranks / 2], all[nranks - 1]);
  free(all);
}

int main(int argc, char** argv) {
  long before[M_COUNT], after_mpi[M_COUNT], braid_init[M_COUNT], after_braid[M_COUNT];
  double t_start = now_ms();
  log_connections();
  size_t mb = 4;
  int nroots = 1;
  size_t ncolls = NCOLLS;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--mb") == 0) mb = (size_t)atol(argv[i + 1]);
    if (strcmp(argv[i], "--roots") == 0) nroots = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--allreduce-only") == 0 && atoi(argv[i + 1])) ncolls = 1;
  }
  sample(before);
  MPI_Init(&argc, &argv);
  struct bufs b = {0};
  MPI_Comm_rank(MPI_COMM_WORLD, &b.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &b.nranks);
  size_t sizes[3] = {2, 1024 * (size_t)b.nranks, (mb << 20) / sizeof(float)};
  b.count = sizes[2] > sizes[1] ? sizes[2] : sizes[1];
  b.send = malloc(b.count * sizeof(float));
  b.recv = malloc(b.count * sizeof(float));
  float one = 1, got = 0;
  MPI_Allreduce(&one, &got, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double mpi_ms = now_ms() - t_start;
  mpi_collectives(&b, sizes, 3);

  ncclComm_t comm = NULL;
  nroots = nroots < 1 ? 1 : nroots > b.nranks ? b.nranks : nroots;
  ncclUniqueId* ids = calloc((size_t)nroots, sizeof(*ids));
  for (int i = 0; i < nroots; i++) {
    int maker = (int)((long)i * b.nranks / nroots);
    if (b.rank == maker) ncclGetUniqueId(&ids[i]);
    MPI_Bcast(&ids[i], sizeof(ids[i]), MPI_BYTE, maker, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  sample(after_mpi); /* after the last MPI call before Braid's: its lazy connections too */
  double t0 = now_ms();
  int bad = (nroots > 1 ? ncclCommInitRankScalable(&comm, b.nranks, b.rank, nroots, ids, NULL)
                        : ncclCommInitRank(&comm, b.nranks, ids[0], b.rank)) != ncclSuccess;
  double init_ms = now_ms() - t0;
  sample(braid_init);
  bad += !bad && check_allreduce(&b, 2, comm);
  double braid_ms = now_ms() - t0;
  for (int s = 0; s < 3 && !bad; s++)
    for (size_t c = 0; c < ncolls; c++)
      if (kColls[c].fn(&b, sizes[s], comm)) {
        fprintf(stderr, "rank %d: %s of %zu floats wrong or failed\n", b.rank, kColls[c].name,
                sizes[s]);
        bad++;
      }
  sample(after_braid);
  long peers = connected_peers(b.nranks);

  int bad_total = 0;
  MPI_Allreduce(&bad, &bad_total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (b.rank == 0)
    printf(
        "# %d ranks, %d bootstrap root%s; collectives at 8 B, %zu KiB, %zu MiB: %s\n"
        "%-22s %12s %12s %12s\n",
        b.nranks, nroots, nroots > 1 ? "s (ncclCommInitRankScalable)" : "",
        sizes[1] * sizeof(float) / 1024, mb, bad_total ? "SOME WRONG" : "all exact", "figure",
        "min", "median", "max");
  report("mpi_init_ms", mpi_ms, b.rank, b.nranks);
  report("braid_init_ms", braid_ms, b.rank, b.nranks);
  report("braid_commInit_ms", init_ms, b.rank, b.nranks); /* of it, ncclCommInitRank alone */
  for (int m = 0; m < M_COUNT; m++) {
    char name[40];
    snprintf(name, sizeof(name), "mpi_%s", kMetric[m]);
    report(name, (double)(after_mpi[m] - before[m]), b.rank, b.nranks);
    snprintf(name, sizeof(name), "braid_%s", kMetric[m]);
    report(name, (double)(after_braid[m] - after_mpi[m]), b.rank, b.nranks);
  }
  report("braid_sockets_at_init", (double)(braid_init[M_SOCKETS] - after_mpi[M_SOCKETS]), b.rank,
         b.nranks);
  report("braid_peers", (double)peers, b.rank, b.nranks);
  if (comm) bad ? ncclCommAbort(comm) : ncclCommDestroy(comm);
  free(ids);
  free(b.send);
  free(b.recv);
  MPI_Finalize();
  return bad_total != 0;
}

#else
int main(void) {
  fprintf(stderr, "mpi_scale_probe: built without MPI\n");
  return 1;
}
#endif
