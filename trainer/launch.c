/* Launch glue. MPI is initialized only when mpirun started this process, so a binary built
 * with MPI still runs alone or under another launcher without MPI's singleton start-up. */
#include "launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if TRAIN_HAVE_MPI
#include <mpi.h>
#endif

static int env_int(const char* name, int* out) {
  const char* s = getenv(name);
  if (s == NULL || *s == '\0') return 0;
  char* end;
  long v = strtol(s, &end, 10);
  if (*end != '\0' || v < 0 || v > 1 << 24) return -1;
  *out = (int)v;
  return 1;
}

/* First pair of variables present: RANK/WORLD_SIZE, Open MPI's, then PMI's. */
static int env_rank(launch_t* l, char* err, size_t errlen) {
  static const char* const kPairs[][2] = {{"RANK", "WORLD_SIZE"},
                                          {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                          {"PMI_RANK", "PMI_SIZE"}};
  for (size_t i = 0; i < sizeof(kPairs) / sizeof(kPairs[0]); i++) {
    int rank = -1, world = -1;
    int has_rank = env_int(kPairs[i][0], &rank), has_world = env_int(kPairs[i][1], &world);
    if (has_rank == 0 && has_world == 0) continue;
    if (has_rank != 1 || has_world != 1 || world < 1 || rank >= world) {
      snprintf(err, errlen, "%s=%s and %s=%s do not name a rank of a job", kPairs[i][0],
               getenv(kPairs[i][0]) ? getenv(kPairs[i][0]) : "(unset)", kPairs[i][1],
               getenv(kPairs[i][1]) ? getenv(kPairs[i][1]) : "(unset)");
      return -1;
    }
    l->rank = rank;
    l->world = world;
    l->how = "environment";
    return 0;
  }
  l->rank = 0;
  l->world = 1;
  l->how = "single process";
  return 0;
}

/* How crowded this host is: ranks on it (as the launcher says) and usable cores. */
static void host_share(launch_t* l) {
  int local = 0;
  if (env_int("OMPI_COMM_WORLD_LOCAL_SIZE", &local) != 1 &&
      env_int("LOCAL_WORLD_SIZE", &local) != 1)
    local = l->world;
  l->local_ranks = local > 0 ? local : 1;
  int index = 0;
  if (env_int("OMPI_COMM_WORLD_LOCAL_RANK", &index) != 1 && env_int("LOCAL_RANK", &index) != 1)
    index = l->rank;
  l->local_rank = index % l->local_ranks;
  long online = sysconf(_SC_NPROCESSORS_ONLN); /* the host's, whatever a rank is bound to */
  l->cores = online > 0 ? (int)online : 1;
}

static int find_rank(int* argc, char*** argv, launch_t* l, char* err, size_t errlen) {
#if TRAIN_HAVE_MPI
  if (getenv("OMPI_COMM_WORLD_SIZE") != NULL) {
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &l->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &l->world);
    l->mpi = 1;
    l->how = "mpirun";
    return 0;
  }
#else
  (void)argc;
  (void)argv;
#endif
  return env_rank(l, err, errlen);
}

int launch_init(int* argc, char*** argv, launch_t* l, char* err, size_t errlen) {
  memset(l, 0, sizeof(*l));
  if (find_rank(argc, argv, l, err, errlen) != 0) return -1;
  host_share(l);
  return 0;
}

ncclResult_t launch_unique_id(const launch_t* l, ncclUniqueId* id, char* err, size_t errlen) {
  memset(id, 0, sizeof(*id));
  if (!l->mpi && l->world > 1 && getenv("NCCL_COMM_ID") == NULL) {
    snprintf(err, errlen,
             "%d ranks launched without mpirun need NCCL_COMM_ID=host:port (rank 0's address) "
             "on every rank",
             l->world);
    return ncclInvalidUsage;
  }
  /* With NCCL_COMM_ID every rank can make the id itself; under MPI rank 0's is broadcast. */
  ncclResult_t res = ncclSuccess;
  if (l->rank == 0 || !l->mpi) res = ncclGetUniqueId(id);
#if TRAIN_HAVE_MPI
  if (l->mpi && l->world > 1) {
    int ok = res == ncclSuccess;
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (!ok && res == ncclSuccess) res = ncclSystemError;
    if (ok) MPI_Bcast(id, (int)sizeof(*id), MPI_BYTE, 0, MPI_COMM_WORLD);
  }
#endif
  if (res != ncclSuccess)
    snprintf(err, errlen, "ncclGetUniqueId failed%s: %s (%s)", l->rank == 0 ? "" : " on rank 0",
             ncclGetErrorString(res), ncclGetLastError(NULL));
  return res;
}

void launch_finish(launch_t* l) {
#if TRAIN_HAVE_MPI
  if (l->mpi) MPI_Finalize();
#endif
  l->mpi = 0;
}
