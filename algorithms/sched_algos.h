/*
 * The algorithms' table (sched_algos.c): a row per algorithm, its
 * descriptor. Adding an algorithm is its file in algorithms/ and its row
 * there; the tuner prices it by the row's shape, or by a model of its own
 * where it has one (src/tune/tuner.c's k_costs, the fitted lines of
 * src/tune/tuner_model.c; docs/architecture.md, "Add an algorithm").
 */
#ifndef BRAID_SCHED_ALGOS_H_
#define BRAID_SCHED_ALGOS_H_

#include "nccl.h"
#include "schedule.h"

/* An algorithm's cost in a flat link's terms (sched_algorithm.shape). */
struct sched_shape {
  double hops;          /* messages in sequence on its longest path */
  double moved_bytes;   /* bytes the busiest rank sends and receives */
  double reduced_bytes; /* bytes the busiest rank reduces */
};

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
  /* Optional: its price in the terms of a flat link, for the tuner where
   * it has no model of its own (the library's algorithms have one): for
   * `coll` over n ranks on a buffer of `bytes` (the gathered buffer for
   * all-gather and reduce-scatter), the hops on its longest path, the
   * bytes the busiest rank moves and those it reduces. NULL: the tuner
   * never picks it unless NCCL_ALGO or a tune file names it. */
  void (*shape)(int coll, int n, double bytes, struct sched_shape* out);
};

/* Rows in this build's table: ALGO_COUNT, more in a test's. */
int sched_algo_count(void);
/* The row of `algo` (enum sched_algo), NULL if none. */
const struct sched_algorithm* sched_algorithm(int algo);
/* Its name ("?" for none). */
const char* sched_algo_name(int algo);

#endif /* BRAID_SCHED_ALGOS_H_ */
