/* Launch glue. MPI is initialized only when Open MPI's mpirun started this process, so a
 * binary built with MPI still runs alone or under another launcher (torchrun, srun, MPICH's
 * mpiexec) without MPI's singleton start-up. */
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

/* The launchers that start one process per rank and say which in the environment, in the
 * order they are believed (a launcher run inside another's job sees both: the inner one
 * wins): torchrun, Open MPI's mpirun (its variables, when not built with MPI), MPICH's Hydra
 * and Intel MPI (PMI), Slurm's srun. Each names its rank, its size and the rank's index on
 * its host. */
static const struct launcher {
  const char *name, *rank, *size, *local;
} kLaunchers[] = {{"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
                  {"Open MPI's variables", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK"},
                  {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
                  {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}};

/* First launcher whose variables are present; one half of a pair is an error. */
static int env_rank(launch_t* l, char* err, size_t errlen) {
  for (size_t i = 0; i < sizeof(kLaunchers) / sizeof(kLaunchers[0]); i++) {
    const struct launcher* k = &kLaunchers[i];
    int rank = -1, world = -1;
    int has_rank = env_int(k->rank, &rank), has_world = env_int(k->size, &world);
    if (has_rank == 0 && has_world == 0) continue;
    if (has_rank != 1 || has_world != 1 || world < 1 || rank >= world) {
      snprintf(err, errlen, "%s=%s and %s=%s do not name a rank of a job", k->rank,
               getenv(k->rank) ? getenv(k->rank) : "(unset)", k->size,
               getenv(k->size) ? getenv(k->size) : "(unset)");
      return -1;
    }
    l->rank = rank;
    l->world = world;
    l->launcher = k;
    l->how = k->name;
    return 0;
  }
  l->rank = 0;
  l->world = 1;
  l->how = "single process";
  return 0;
}

/* Slurm's SLURM_TASKS_PER_NODE ("2(x3),1": two tasks on each of three nodes, then one) for
 * node `node`; 0 when it does not say. */
static int slurm_tasks_on_node(const char* spec, int node) {
  while (spec != NULL && *spec != '\0') {
    char* end;
    long tasks = strtol(spec, &end, 10), times = 1;
    if (end == spec || tasks < 1) return 0;
    if (strncmp(end, "(x", 2) == 0) {
      times = strtol(end + 2, &end, 10);
      if (times < 1 || *end != ')') return 0;
      end++;
    }
    if (node < times) return tasks > 1 << 24 ? 0 : (int)tasks;
    node -= (int)times;
    spec = *end == ',' ? end + 1 : NULL;
  }
  return 0;
}

/* Ranks on this host as the launcher says: Open MPI's, torchrun's, Hydra's or Slurm's count,
 * else 0. */
static int env_local_size(void) {
  static const char* const kNames[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE",
                                       "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"};
  int n = 0, node = 0;
  for (size_t i = 0; i < sizeof(kNames) / sizeof(kNames[0]); i++)
    if (env_int(kNames[i], &n) == 1 && n > 0) return n;
  if (env_int("SLURM_NODEID", &node) == 1 && getenv("SLURM_TASKS_PER_NODE") != NULL)
    return slurm_tasks_on_node(getenv("SLURM_TASKS_PER_NODE"), node);
  return 0;
}

/* How crowded this host is: ranks on it (as the launcher says) and usable cores. */
static void host_share(launch_t* l) {
  int local = env_local_size();
  if (local < 1) local = l->world;
  l->local_ranks = local;
  int index = 0;
  const char* name = l->launcher ? l->launcher->local : "OMPI_COMM_WORLD_LOCAL_RANK";
  if (env_int(name, &index) != 1) index = l->rank;
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
             "%d ranks launched by %s (not mpirun) need NCCL_COMM_ID=host:port (rank 0's "
             "address) on every rank",
             l->world, l->how);
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
