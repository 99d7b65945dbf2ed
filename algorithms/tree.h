/*
 * Tree schedules (tree.c), and the tree shapes the tuner and the peer
 * lists read.
 */
#ifndef BRAID_TREE_H_
#define BRAID_TREE_H_

#include "schedule.h"

/* Trees (tree.c): double binary tree all-reduce (two trees, each carrying
 * half the data, every rank interior in at most one), and a binary tree
 * rooted at the root for broadcast and reduce. */
ncclResult_t tree_schedule_allreduce(struct schedule* s, const struct sched_key* key);
ncclResult_t tree_schedule_broadcast(struct schedule* s, const struct sched_key* key);
ncclResult_t tree_schedule_reduce(struct schedule* s, const struct sched_key* key);

/* Tree shape: rank's parent (-1 at the root) and up to two children (-1
 * where absent) in tree `which` (0 or 1) of the double binary tree. */
void tree_links(int rank, int nranks, int which, int* parent, int child[2]);
/* Levels of the binary tree over nranks (1 for a single rank). */
int tree_depth(int nranks);

/* Tree 0 relabelled so that `root` is the tree's root. */
void tree_rooted_links(int rank, int nranks, int root, int* parent, int child[2]);

#endif /* BRAID_TREE_H_ */
