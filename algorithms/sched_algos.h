/*
 * The algorithms' table (sched_algos.c): a row per algorithm, its
 * descriptor. Adding an algorithm is its file in algorithms/, its row
 * here and its cost in the tuner (src/tune/tuner.c's tuner_algo_cost and
 * the fitted lines of src/tune/tuner_model.c; docs/architecture.md).
 */
#ifndef BRAID_SCHED_ALGOS_H_
#define BRAID_SCHED_ALGOS_H_

#include "nccl.h"
#include "schedule.h"

typedef ncclResult_t (*sched_builder)(struct schedule*, const struct sched_key*);

struct sched_algorithm {
  const char* name;                   /* NCCL_ALGO's and the logs' name */
  sched_builder builders[COLL_COUNT]; /* NULL where it does not implement the collective */
  /* 1: built over ring positions (ranks node by node, so that its first
   * links stay inside a node), the schedule's peers then renamed to ranks;
   * 0: built over ranks */
  int built_in_positions;
  /* The ranks a schedule for `key` exchanges data with (both directions),
   * at most max; how many. Over ring positions when peers_in_positions
   * (the key's rank and root are positions, and so are the peers). */
  int (*peers)(const struct sched_key* key, int* peers, int max);
  int peers_in_positions;
  /* Optional (NULL: every layout): whether it builds `coll` on layout t
   * (NULL: no layout known). */
  int (*fits)(const struct sched_topo* t, int coll);
};

/* The row of `algo` (enum sched_algo), NULL if none. */
const struct sched_algorithm* sched_algorithm(int algo);
/* Its name ("?" for none). */
const char* sched_algo_name(int algo);

#endif /* BRAID_SCHED_ALGOS_H_ */
