/*
 * Hierarchical schedules (hier.c): stages inside nodes and between them.
 */
#ifndef BRAID_HIER_H_
#define BRAID_HIER_H_

#include <stddef.h>

#include "schedule.h"

/* Does hierarchical all-reduce of `bytes` take its leader variant with
 * chunks of `chunk_bytes`? (The tuner models and sizes it by this.) */
int hier_allreduce_uses_leaders(size_t bytes, size_t chunk_bytes);

/* Hierarchical (hier.c). All-reduce: intra-node reduce-scatter, then an
 * inter-node all-reduce per piece among the ranks owning it on each node
 * (each rank carries 1/ppn of the data), then intra-node all-gather; for
 * small buffers the leader variant: reduce to each node's first rank,
 * leaders all-reduce, broadcast back. Reduce-scatter / all-gather: the
 * inter-node part on ppn parallel rings, when every node has as many
 * ranks. */
ncclResult_t hier_schedule_allreduce(struct schedule* s, const struct sched_key* key);
/* 1 when hier_schedule_allreduce overlaps its rounds' node and network
 * stages for this key (the executor window is wide enough). */
int hier_allreduce_pipelines(const struct sched_key* key);
ncclResult_t hier_schedule_allgather(struct schedule* s, const struct sched_key* key);
ncclResult_t hier_schedule_reducescatter(struct schedule* s, const struct sched_key* key);
/* Peers of a hierarchical schedule (rank space). */
int hier_peers(const struct sched_key* key, int* peers, int max);

#endif /* BRAID_HIER_H_ */
