/*
 * Direct: the one-pass intra-node algorithm (docs/architecture.md 5). Where every
 * rank of a node reaches every peer's buffers (CUDA IPC, threads of one
 * process), one fused task per rank does the whole collective: rank r
 * takes its slice, reduces it from every rank's input in rank order (so
 * every rank's bits agree), and writes the result to every rank's output.
 * Each input byte is read once and each output byte written once (2kS for
 * an all-reduce of S bytes on k ranks), with no scratch; the slices are
 * disjoint, so the ranks' tasks may run in any order or at once, and in
 * place is safe. The plan is data: for each source and destination, which
 * rank's buffer and which element.
 */
#ifndef BRAID_DIRECT_H_
#define BRAID_DIRECT_H_

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

struct sched_topo;

#define DIRECT_MAX_RANKS 16 /* a task's sources and destinations (the kernel's) */

/* DIRECT_SCRATCH: the rank's own staging buffer, which holds its slice
 * only (offsets from the slice's start). */
enum direct_buf { DIRECT_SEND = 0, DIRECT_RECV = 1, DIRECT_SCRATCH = 2, DIRECT_NBUFS = 3 };

/* An element of a rank's send or receive buffer. */
struct direct_ref {
  int rank;
  int buf; /* enum direct_buf */
  size_t off;
};

/* Sources combined in order (one: a copy), the result to every
 * destination; n elements from each ref on. n == 0: nothing to do. With
 * rows > 1, the same again on each row r < rows, every source src_row
 * elements further on per row and every destination dst_row (the kernel's
 * rows, kern_body.h). Rows named by a table (src_at, dst_at: row r's
 * sources src_at[r] rows on instead of r; a row whose entry is < 0 is
 * skipped) take the blocks of columns that are not evenly spaced; a
 * spread task's row r reads its source r alone (DIRECT_SPREAD_SRCS, a
 * copy) or writes its destination r alone (DIRECT_SPREAD_DSTS): a node's
 * ranks in one column, each a buffer of its own. direct_task_row gives a
 * row as a task of one. A `tree` task combines its sources in the
 * deterministic mode's canonical tree (pairs first: docs/determinism.md)
 * instead of the chain, so that sources in rank order give that mode's
 * bits. */
#define DIRECT_SPREAD_SRCS 1
#define DIRECT_SPREAD_DSTS 2
struct direct_task {
  size_t n;
  size_t rows;
  ptrdiff_t src_row, dst_row;
  const int32_t* src_at;
  const int32_t* dst_at;
  int spread;
  int tree;
  int nsrcs, ndsts;
  struct direct_ref srcs[DIRECT_MAX_RANKS];
  struct direct_ref dsts[DIRECT_MAX_RANKS];
};

/* Rank `rank`'s task for collective `coll` (enum sched_coll) on `nranks`
 * ranks. `count` as in exec_args: the per-rank block for all-gather and
 * reduce-scatter (placed every `stride` elements, 0: count), else the
 * whole buffer; slices start on multiples of `align` elements (whole
 * 16-byte vectors). ncclInvalidArgument for more than DIRECT_MAX_RANKS. */
ncclResult_t direct_plan(int coll, int rank, int nranks, int root, size_t count, size_t stride,
                         size_t align, struct direct_task* t);

/* Row r of task t as a task of one row (its refs moved on, its spread
 * source or destination alone, no table); 0 where the row is skipped.
 * The kernel's kern_dev_task_row (kernels/cuda/kern_body.h) is the same
 * rule on the device form. */
int direct_task_row(const struct direct_task* t, size_t r, struct direct_task* row);

/*
 * Hier with its node stages direct (devices on several nodes, of any
 * sizes, below): a task before the
 * stage between nodes and one after, around the rank's scratch, with the
 * stage between them run by the ranks holding this rank's index on every
 * node (its column) on the host:
 *  - all-reduce: reduce this rank's slice from the node's inputs into the
 *    scratch; all-reduce it along the column; write it to every output of
 *    the node;
 *  - reduce-scatter: for each node j, reduce the blocks of the column's
 *    ranks there from the node's inputs into node j's scratch rows (one
 *    task, R rows per node, below); reduce-scatter the rows along the
 *    column; copy this node's rows to the column's outputs here;
 *  - all-gather: copy the column's inputs here into this node's scratch
 *    rows; all-gather the rows along the column; write node j's rows, the
 *    blocks of the column's ranks on node j, to every output of the node.
 * Each input byte of the node is read once and each output byte written
 * once. A node has R rows in each column, R the most ranks a node has over
 * the columns, rounded up (1 on nodes of one size): row k of column
 * `local` on node j is the block of the rank with index local + k * nlocal
 * there, junk where node j has no such rank (moved and reduced between
 * nodes, never read from an input or written out). A node's rows go to
 * and from its ranks' own buffers in one spread task. Where the columns'
 * ranks are evenly spaced across nodes (node-major and round-robin
 * layouts, any layout of 2 nodes) the rows are too; elsewhere a table names
 * each row's rank (direct_hier_rows), which the kernel reads.
 *
 * `gathered`: the stage between nodes does no arithmetic, so that a
 * network that moves device memory can run it with the scratch on the
 * device while the kernels stay in the stream (a reduction there would
 * need a kernel the proxy launches). The column all-gathers the node
 * partials and the task after reduces them, in node order:
 *  - all-reduce on 2 nodes (more halve or fold, below): scratch row j
 *    holds node j's partial of this rank's slice, the column all-gathers
 *    the rows, the task after reduces them into
 *    every output of the node; each member sends its slice to every other
 *    (as much as a ring on 2 nodes, more beyond);
 *  - reduce-scatter (2 nodes only): each member offers the rows its
 *    partner needs, so the all-gather is one swap of a node's rows each
 *    way, and the task after reduces its node's rows and the partner's.
 * On 4, 8, ... DIRECT_MAX_NODES nodes (a power of two) both halve
 * instead, in steps (direct_step): the members half the nodes apart swap
 * the halves each keeps (an all-gather of two, in place), a task reduces
 * the kept half with what came, lower node's first, and the next step
 * halves that at half the distance; after log2(nnodes) steps member j
 * holds block j of the total. An all-reduce then all-gathers the blocks
 * by recursive doubling (members 1, 2, 4 ... apart swap all they hold,
 * in place) and the task after writes the whole to every output of the
 * node; a reduce-scatter's block is its row, which the task after
 * copies out. Each member sends what a ring would, in 2 log2(nnodes)
 * rounds. The all-reduce's slice is padded to nnodes whole vectors (the
 * padding's junk is reduced and moved, never written out).
 * An all-reduce or reduce on another count of nodes (3, 5, 6, 7, 9...)
 * folds first: with p the largest power of two below, node j + p sends
 * its partial to node j, which adds it (lower node's first), the first p
 * nodes halve and double as above, and node j sends node j + p the whole total
 * back (`unfold`). Node j then sends what a ring of p would and the
 * partial out and back; the rest only their partial and the total.
 * A reduce-scatter on such a count folds too, its rows in pairs: pair i
 * holds row i and row i + p (junk where node i + p does not exist, moved
 * and reduced, never written out), so that the halving leaves member i
 * both rows of its pair; node j + p sends node j its pairs, node j sends
 * it row j + p back (a node's R rows go as one: "row" here is a node's).
 * The pairs' second rows come from a step that moves nothing
 * (DIRECT_STEP_LOCAL), a launch of their own, so that on evenly spaced
 * columns each launch's rows are too. Each member sends 2 (p - 1) rows where a ring on
 * nnodes would send nnodes - 1 (as many on 3, 7, 15 ... nodes, up to
 * twice that just above a power of two), and no node copies its input
 * through host memory.
 * A reduce (gathered only) runs as the all-reduce does, its task after
 * writing the root's output alone (nothing on the root's other nodes): the
 * root's bits are the all-reduce's.
 * A broadcast (gathered or not: it moves data only) cuts the buffer as the
 * all-reduce does: on the root's node each column's task before copies
 * its slice of the root's input into the scratch, the column broadcasts
 * it from the root's node (a ring), and the task after writes it to every
 * output of the node; off the root's node the task before is empty.
 * Every collective also runs on nodes of unequal sizes: the columns are the
 * indexes every node has (nlocal, the smallest node's count), each
 * column's task before reading its slice from every rank of its node
 * (node_ranks of them) and its task after writing every rank's output (a
 * reduce-scatter's and all-gather's through the column's R rows, above);
 * a rank whose index is past the columns has nothing to do and no stage
 * between nodes (the node's others read its input and write its output).
 * A `canonical` reduction computes the deterministic mode's tree over the
 * ranks (docs/determinism.md), where the nodes cut it into subtrees: nodes
 * of one power-of-two size, node j holding ranks j k .. j k + k - 1 in
 * that order (the caller checks the layout), a power of two of them, the
 * stage between them gathered. Each task reduces in the tree (node's
 * ranks, then nodes), and the halving and doubling run with node j in
 * place j's bits reversed (on 8 nodes 0 4 2 6 1 5 3 7), so that the first
 * swap joins nodes 0 and 1, the next pairs of them, and so on: at every
 * step the lower node's value first, as the tree combines. Each node then
 * ends the halving with the block of its place; a reduce-scatter writes
 * node j's rows at that place (a table, direct_hier_rows).
 */
struct direct_hier {
  int coll;       /* COLL_ALLREDUCE, _REDUCESCATTER, _ALLGATHER, _BROADCAST; COLL_REDUCE gathered */
  int local;      /* this rank's index on its node */
  int nlocal;     /* ranks per node: the columns (the fewest a node has) */
  int node_ranks; /* ranks on this rank's node; 0: nlocal (more on unequal nodes) */
  int node;       /* this rank's node */
  int nnodes;
  const struct sched_topo* topo; /* reduce-scatter, all-gather: which rank holds each row */
  const int32_t* rows_at;        /* their table (direct_hier_rows): the tasks point into it */
  size_t count;                  /* as in exec_args */
  size_t stride;
  size_t align;
  int gathered;              /* the stage between nodes only moves data (above) */
  int canonical;             /* a reduction in the deterministic mode's order (above) */
  int root_node, root_local; /* a reduce's or broadcast's root: its node, its index there */
};

#define DIRECT_MAX_NODES 16384 /* nodes of a gathered stage */
#define DIRECT_MAX_STEPS 28    /* its steps: 14 halvings and 14 doublings on 16384 */

/* One step of a halving (above): an all-gather of `count` elements
 * between nodes `lower` and `upper` (this rank the column's member on
 * `member`: 0 lower, 1 upper) from scratch + send_off into scratch +
 * recv_off, in place; then `reduce`. A fold's steps move one way
 * instead: member `from` sends `count` from scratch + send_off, the other
 * receives them at scratch + recv_off (a broadcast of two); the reduce,
 * if any (n > 0), is the receiver's. A local step (from
 * DIRECT_STEP_LOCAL, lower == upper == this node) moves nothing and only
 * runs its reduce. */
#define DIRECT_STEP_LOCAL (-2)
struct direct_step {
  int lower, upper, member;
  int from; /* -1: both send (the all-gather); DIRECT_STEP_LOCAL; else the member that sends */
  size_t send_off, recv_off, count;
  struct direct_task reduce;
};

/* The plan: its tasks, the scratch they use (elements), and the stage
 * between nodes: the steps (a fold's, a halving's, a doubling's), then
 * collective `column_coll` (the call's; all-gather where gathered) along
 * the whole column from scratch + send_off into scratch + recv_off,
 * `count` and `stride` as in exec_args (count 0: none), then the fold's
 * `unfold` where `unfolds`. The tasks run in the
 * order before, each step's reduce, after; `post_task` is the one that
 * applies the call's post-divide (its index in that order), -1 where the
 * stage between nodes does, or (a fold's upper node) the total comes
 * divided. */
struct direct_staged {
  struct direct_task before, after;
  size_t scratch;
  int nsteps;
  struct direct_step steps[DIRECT_MAX_STEPS];
  int column_coll;
  int column_root; /* a broadcast's: the node it starts from */
  size_t send_off, recv_off, count, stride;
  int unfolds;
  struct direct_step unfold;
  int post_task;
};

ncclResult_t direct_plan_hier(const struct direct_hier* h, struct direct_staged* out);

/* Whether a gathered plan exists for `coll` on `nnodes` nodes (above): an
 * all-gather's or broadcast's anywhere; an all-reduce's, reduce's or reduce-scatter's on
 * 2 to DIRECT_MAX_NODES (2 swapping rows, a power of two halving, another
 * count folding first). */
int direct_hier_gathers(int coll, int nnodes);

/* The nodes of a gathered stage that halve: the largest power of two up
 * to nnodes (the others fold onto them). */
int direct_halving_nodes(int nnodes);

/* The nodes whose column members `node`'s meets in a gathered stage of
 * `coll` on `nnodes` (above): an all-gather's or broadcast's ring neighbours; a
 * reduction's fold partner and its halving's and doubling's (on 2 nodes,
 * the other). Into out (DIRECT_MAX_PARTNERS at most); how many. What a
 * unit connects, and which pairs must move device memory, come from here. */
#define DIRECT_MAX_PARTNERS (DIRECT_MAX_STEPS / 2 + 1)
int direct_stage_partners(int coll, int nnodes, int node, int* out);

/* The rows' table of index `local`'s column on layout t (above: a
 * reduce-scatter's and all-gather's plans name rows through it), into
 * `at`, of direct_hier_rows_size(t) entries; it depends on nothing else,
 * so a comm makes it once. Each node's R rows, then where a folding
 * reduce-scatter's rows go in its pairs (direct.c, fold_rows), then where
 * a canonical halving's go (halving_rows). */
size_t direct_hier_rows_size(const struct sched_topo* t);
void direct_hier_rows(const struct sched_topo* t, int local, int32_t* at);

#endif /* BRAID_DIRECT_H_ */
