/*
 * Trees. The binary tree over nodes 1..n links node v (lowest set bit b) to
 * children v - b/2 and v + p (p the largest power of two below b that stays
 * <= n); leaves are the odd nodes. Rank r is node r+1 in tree 0. Tree 1
 * gives every rank another role - mirrored (r -> n-1-r) for even n, shifted
 * (r -> r+1) for odd n - so ranks interior in one tree are leaves in the
 * other, and the double tree splits each rank's work evenly.
 */
#include "tree.h"

#include "core.h"
#include "schedule.h"

static int lowbit(int v) {
  return v & -v;
}

static int tree_root_node(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

static void node_children(int v, int n, int child[2]) {
  int b = lowbit(v);
  child[0] = child[1] = 0;
  if (b == 1) return;
  child[0] = v - b / 2;
  for (int p = b / 2; p >= 1; p /= 2)
    if (v + p <= n) {
      child[1] = v + p;
      return;
    }
}

/* In-order tree: walk down from the root to find v's parent (0 at root). */
static int node_parent(int v, int n) {
  int u = tree_root_node(n), parent = 0;
  while (u != v && u != 0) {
    int c[2];
    node_children(u, n, c);
    parent = u;
    u = v < u ? c[0] : c[1];
  }
  return u == v ? parent : -1;
}

int tree_depth(int nranks) {
  int d = 1;
  for (int v = 1; v <= nranks; v++) {
    int k = 1, u = v;
    while ((u = node_parent(u, nranks)) > 0) k++;
    d = MAX(d, k);
  }
  return d;
}

/* Role of `rank` in tree `which`, and back. */
static int tree_role(int rank, int n, int which) {
  if (which == 0) return rank;
  return n % 2 == 0 ? n - 1 - rank : (rank + 1) % n;
}
static int tree_rank(int role, int n, int which) {
  if (which == 0) return role;
  return n % 2 == 0 ? n - 1 - role : (role + n - 1) % n;
}

void tree_links(int rank, int nranks, int which, int* parent, int child[2]) {
  int v = tree_role(rank, nranks, which) + 1, c[2];
  int p = node_parent(v, nranks);
  node_children(v, nranks, c);
  *parent = p > 0 ? tree_rank(p - 1, nranks, which) : -1;
  for (int i = 0; i < 2; i++) child[i] = c[i] > 0 ? tree_rank(c[i] - 1, nranks, which) : -1;
}

/* Links in tree 0 relabelled so that `root` sits at the tree's root. */
void tree_rooted_links(int rank, int n, int root, int* parent, int child[2]) {
  int shift = (tree_root_node(n) - 1) - root;
  tree_links(((rank + shift) % n + n) % n, n, 0, parent, child);
  if (*parent >= 0) *parent = ((*parent - shift) % n + n) % n;
  for (int i = 0; i < 2; i++)
    if (child[i] >= 0) child[i] = ((child[i] - shift) % n + n) % n;
}

struct tree_slice {
  size_t off, len;
};

/* Slice i of the range [base, base+len) cut into `nslices`. */
static struct tree_slice tree_slice_of(size_t base, size_t len, size_t i, size_t nslices) {
  size_t a = len * i / nslices, e = len * (i + 1) / nslices;
  return (struct tree_slice){base + a, e - a};
}

/* Reduce one slice up the tree: children's data folded into the input and
 * sent to the parent, or (at the root) written to the output, final. */
static ncclResult_t tree_up(struct schedule* s, int parent, const int child[2],
                            struct tree_slice sl) {
  ncclResult_t res = ncclSuccess;
  int k = (child[0] >= 0) + (child[1] >= 0);
  unsigned last = k == 2 ? SCHED_LOCAL_CARRY : SCHED_PRE; /* the carry is pre-multiplied */
  int lastc = child[1] >= 0 ? child[1] : child[0];
  if (sl.len == 0) return ncclSuccess;
  if (k == 0 && parent < 0)
    return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, sl.off, sl.off, sl.len);
  if (k == 0) return sched_append(s, PRIM_SEND, SCHED_PRE, -1, parent, sl.off, sl.off, sl.len);
  if (k == 2)
    CHECK(sched_append(s, PRIM_RECV_REDUCE_CARRY, SCHED_PRE, child[0], -1, sl.off, sl.off, sl.len));
  if (parent >= 0)
    CHECK(sched_append(s, PRIM_RECV_REDUCE_SEND, last, lastc, parent, sl.off, sl.off, sl.len));
  else
    CHECK(sched_append(s, PRIM_RECV_REDUCE_COPY, last | SCHED_POST, lastc, -1, sl.off, sl.off,
                       sl.len));
fail:
  return res;
}

/* Broadcast one slice down: the root sends its data (from_input: its
 * input, else its output), others receive it and pass it on. */
static ncclResult_t tree_down(struct schedule* s, int parent, const int child[2],
                              struct tree_slice sl, int from_input) {
  ncclResult_t res = ncclSuccess;
  if (sl.len == 0) return ncclSuccess;
  int first = 0;
  if (parent >= 0 && child[0] >= 0) {
    CHECK(sched_append(s, PRIM_RECV_COPY_SEND, 0, parent, child[0], sl.off, sl.off, sl.len));
    first = 1;
  } else if (parent >= 0) {
    CHECK(sched_append(s, PRIM_RECV, 0, parent, -1, sl.off, sl.off, sl.len));
  }
  for (int i = first; i < 2; i++)
    if (child[i] >= 0)
      CHECK(sched_append(s, parent < 0 && from_input ? PRIM_SEND : PRIM_SEND_OUT, 0, -1, child[i],
                         sl.off, sl.off, sl.len));
fail:
  return res;
}

static size_t tree_chunk(const struct sched_key* k) {
  return MAX((size_t)1, k->chunk_bytes / k->elem_size);
}

/* Double binary tree: tree t reduces and broadcasts half t of the buffer.
 * All slices go up before any comes down, slice by slice in the same tree
 * order on both ends of every link. A rank is a leaf in (at least) one
 * tree: its leaf sends go first on the way up and its forwarding first on
 * the way down, so the executor's in-order steps never hold one tree's
 * critical path behind the other's. */
ncclResult_t tree_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int parent[2], child[2][2];
  size_t chunk = tree_chunk(k);
  /* Up to one slice the data rides tree 0 alone: halving it would not
   * shorten any transfer, and two trees sharing one in-order executor add
   * up their latencies. */
  size_t h0 = k->count <= chunk ? k->count : k->count / 2;
  size_t half[2] = {h0, k->count - h0}, base[2] = {0, h0};
  size_t nslices = MAX(DIV_UP(half[0], chunk), DIV_UP(half[1], chunk));
  if (k->count == 0) return ncclSuccess;
  for (int t = 0; t < 2; t++) tree_links(k->rank, k->nranks, t, &parent[t], child[t]);
  int leaf = child[0][0] < 0 ? 0 : 1; /* the tree this rank is a leaf in */
  for (size_t i = 0; i < nslices; i++)
    for (int j = 0; j < 2; j++) {
      int t = j == 0 ? leaf : 1 - leaf;
      CHECK(tree_up(s, parent[t], child[t], tree_slice_of(base[t], half[t], i, nslices)));
    }
  for (size_t i = 0; i < nslices; i++)
    for (int j = 0; j < 2; j++) {
      int t = j == 0 ? 1 - leaf : leaf;
      CHECK(tree_down(s, parent[t], child[t], tree_slice_of(base[t], half[t], i, nslices), 0));
    }
fail:
  return res;
}

ncclResult_t tree_schedule_broadcast(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int parent, child[2];
  size_t nslices = DIV_UP(k->count, tree_chunk(k));
  tree_rooted_links(k->rank, k->nranks, k->root, &parent, child);
  for (size_t i = 0; i < nslices; i++) {
    struct tree_slice sl = tree_slice_of(0, k->count, i, nslices);
    if (parent < 0) CHECK(sched_append(s, PRIM_COPY, 0, -1, -1, sl.off, sl.off, sl.len));
    CHECK(tree_down(s, parent, child, sl, 1));
  }
fail:
  return res;
}

ncclResult_t tree_schedule_reduce(struct schedule* s, const struct sched_key* k) {
  ncclResult_t res = ncclSuccess;
  int parent, child[2];
  size_t nslices = DIV_UP(k->count, tree_chunk(k));
  tree_rooted_links(k->rank, k->nranks, k->root, &parent, child);
  for (size_t i = 0; i < nslices; i++)
    CHECK(tree_up(s, parent, child, tree_slice_of(0, k->count, i, nslices)));
fail:
  return res;
}
