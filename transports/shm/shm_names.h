/*
 * Shared-memory segments by name: what a segment is called (its creator's
 * pid and shared-memory domain come first), whether a pid is alive, and
 * the sweep of segments whose creator died before anyone unlinked them.
 */
#ifndef BRAID_SHM_NAMES_H_
#define BRAID_SHM_NAMES_H_

#include <stdint.h>
#include <sys/types.h>

#include "nccl.h"

#define SHM_NAME_MAX 96

/* What shared memory publishes about a rank (its transport blob). Ranks
 * with the same host_hash and domain share /dev/shm and a pid namespace;
 * domain 0: this rank does not use shared memory (NCCL_SHM_DISABLE). */
struct shm_blob {
  uint64_t domain;
  uint64_t tag; /* random per rank and comm: names its segments */
};

/* "/braid-<pid>-<domain>-<link>": the segment a sender (pid, blob, rank)
 * creates for `receiver` on `channel`. <link> is a keyed hash of the link
 * under the comm's data secret: /dev/shm is public (another user lists it,
 * or watches it with inotify), and a name derived from what a stranger
 * sees could be taken first, stopping the job (docs/errors-and-security.md). */
void shm_name_make(char* out, uint64_t secret, pid_t sender_pid, const struct shm_blob* sender,
                   int sender_rank, int receiver, int channel);

/* 0 when pid has exited (or is a zombie); unknown means alive. */
int shm_pid_alive(pid_t pid);

/* Remove the shared-memory segments of this host and shared-memory domain
 * (host_shm_domain(); 0: shared memory is off) whose creator died
 * before they were unlinked. Once per process; see shm_names.c. */
void transport_shm_sweep(uint64_t domain);

#endif /* BRAID_SHM_NAMES_H_ */
