/* How braid-train finds its rank, the number of ranks and the Braid unique id: through MPI
 * under mpirun when built with it (MPI only broadcasts the id), otherwise from the
 * environment a launcher sets (torchrun's RANK/WORLD_SIZE, Open MPI's, PMI's or Slurm's
 * variables; NCCL_COMM_ID for the id). */
#ifndef TRAIN_LAUNCH_H_
#define TRAIN_LAUNCH_H_

#include <stddef.h>

#include "nccl.h"

typedef struct {
  int rank, world;
  int local_ranks; /* ranks on this host: Open MPI's or LOCAL_WORLD_SIZE, else all of them */
  int local_rank;  /* this rank's index among them */
  int cores;       /* online cores of this host */
  int mpi;         /* MPI was initialized */
  const char* how; /* "mpirun", the launcher whose variables named the rank, or "single process" */
  const struct launcher* launcher; /* those variables; NULL under mpirun or alone */
} launch_t;

/* Returns 0, or -1 with a message (inconsistent environment). */
int launch_init(int* argc, char*** argv, launch_t* l, char* err, size_t errlen);

/* The id every rank passes to ncclCommInitRank. Returns ncclSuccess or the error (message in
 * err). */
ncclResult_t launch_unique_id(const launch_t* l, ncclUniqueId* id, char* err, size_t errlen);

/* Ends MPI, when it was started. */
void launch_finish(launch_t* l);

#endif /* TRAIN_LAUNCH_H_ */
