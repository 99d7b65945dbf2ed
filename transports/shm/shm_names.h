/*
 * Shared-memory segments by name: what a segment is called (its creator's
 * pid and shared-memory domain come first), whether a pid is alive, and
 * the sweep of segments whose creator died before anyone unlinked them.
 */
#ifndef BRAID_SHM_NAMES_H_
#define BRAID_SHM_NAMES_H_

#include <stdint.h>
#include <sys/types.h>

#include "bootstrap.h"

#define SHM_NAME_MAX 96

/* "/braid-<pid>-<domain>-<tag>-<receiver>-<channel>". */
void shm_name_make(char* out, const struct peer_info* sender, int receiver, int channel);

/* 0 when pid has exited (or is a zombie); unknown means alive. */
int shm_pid_alive(pid_t pid);

#endif /* BRAID_SHM_NAMES_H_ */
