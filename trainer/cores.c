/* Core placement for braid-train: see cores.h for why. */
#include "cores.h"

#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CORES_SPIN_US "1000" /* BRAID_SPIN_US with a core per rank */

/* The n-th cpu of a set, or -1. */
static int nth_cpu(const cpu_set_t* set, int n) {
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, set) && n-- == 0) return cpu;
  return -1;
}

/* Every thread of the process, including MPI's and those started later (they inherit). */
static int pin_all_threads(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  DIR* d = opendir("/proc/self/task");
  if (d == NULL) return sched_setaffinity(0, sizeof(one), &one);
  int rc = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    if (sched_setaffinity((pid_t)atoi(e->d_name), sizeof(one), &one) != 0) rc = -1;
  }
  closedir(d);
  return rc;
}

/* Pins the rank to cpu local_rank mod (cpus it may use), unless a launcher bound it already. */
static void pin(cores_t* c, const launch_t* l) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
    snprintf(c->note, sizeof(c->note), "cannot read the cpu affinity; not pinned");
    return;
  }
  const int usable = CPU_COUNT(&allowed);
  if (usable < l->cores) {
    snprintf(c->note, sizeof(c->note), "bound by the launcher to %d cpu%s; not re-pinned", usable,
             usable > 1 ? "s" : "");
    return;
  }
  const int cpu = nth_cpu(&allowed, l->local_rank % usable);
  if (cpu < 0 || pin_all_threads(cpu) != 0) {
    snprintf(c->note, sizeof(c->note), "pinning to a cpu failed; not pinned");
    return;
  }
  snprintf(c->note, sizeof(c->note), "pinned to cpu %d", cpu);
}

void cores_plan(cores_t* c, const launch_t* l, share_mode_t mode) {
  memset(c, 0, sizeof(*c));
  const int crowded = l->local_ranks > l->cores;
  c->sharing = mode == SHARE_ON || (mode == SHARE_AUTO && crowded);
  /* A poller on a shared core would take turns from other ranks; the user's setting wins. */
  if (!crowded) setenv("BRAID_SPIN_US", CORES_SPIN_US, 0);
  if (c->sharing) pin(c, l);
}

void cores_turn(void) {
  sched_yield();
}
