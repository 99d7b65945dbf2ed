/*
 * Pairwise: every reduction in the canonical order (pairwise.h). Think of
 * p = 2^L positions, L = ceil(log2 n): positions below n are the ranks,
 * the others hold nothing. At level l, aligned blocks of 2^l positions
 * pair up; the block pair's value is (lower) op (upper), or the lower
 * alone when the upper holds no rank.
 *
 * The buffer is cut into p blocks, one per position. Block u is reduced
 * along that tree: at level l, inside each aligned block C of 2^(l+1)
 * positions, the position of C congruent to u modulo 2^(l+1) computes C's
 * value on block u from its own half's partial and the other half's, which
 * the other half's holder sends it. A position whose half held no rank is
 * held by the holder of the other half, which took its share without a
 * message (pw_holder). Each rank so sends each block's data once and
 * receives a share that halves level by level: 2(n-1)/n of the buffer in
 * all for an all-reduce, as a ring moves, in 2L rounds, and the first
 * levels stay inside a node when nodes hold aligned blocks of ranks.
 *
 * A rank's partial passes from level to level in a slot (the carry), never
 * through the output, so the same tree serves reduce-scatter (block u goes
 * to rank u) and reduce (every block goes to the root), whose non-root
 * output is not ours to write. An all-reduce, whose output can hold the
 * partials, computes the same tree level by level (recursive halving at
 * distances 1, 2, 4..., one partner per level: its steps wait one hop,
 * not a chain's L), then gathers the blocks back level by level. Small
 * all-reduces over a power-of-two rank count use whole-buffer exchanges at
 * distances 1, 2, 4..., which compute the same tree in L rounds.
 */
#include "pairwise.h"

#include "core.h"

/* Whole-buffer exchanges below this size (the size from which recursive
 * doubling halves too: the same trade of rounds for bytes). */
#define PAIRWISE_HALVING_MIN_BYTES ((size_t)32 << 10)

int pairwise_levels(int nranks) {
  int l = 0;
  while ((1 << l) < nranks) l++;
  return l;
}

int pairwise_uses_doubling(size_t count, size_t elem_size, int nranks) {
  int pow2 = nranks >= 2 && (nranks & (nranks - 1)) == 0;
  return pow2 && (count < (size_t)nranks || count * elem_size < PAIRWISE_HALVING_MIN_BYTES);
}

/* First position of the aligned block of 2^l positions holding v. */
static int block_base(int v, int l) {
  return (v >> l) << l;
}

/* Before level l: who holds the partial of position v's block of 2^l
 * positions (on v's share of the buffer). Where at some level j < l v's
 * half held no rank and the other half did, the other half's holder took
 * v's share over; -1 when v's block holds no rank. */
static int pw_holder(int v, int l, int n) {
  if ((n & (n - 1)) == 0) return v; /* every half holds ranks (a fast path: 16k ranks) */
  if (block_base(v, l) >= n) return -1;
  int h = v;
  for (int j = 0; j < l; j++) {
    int bit = 1 << j, lower = h & ~bit;
    if ((h & bit) && block_base(h, j) >= n && block_base(lower, j) < n) {
      h = lower; /* and again from level 0: lower may itself be held */
      j = -1;
    }
  }
  return h;
}

/* ---- Ranks bound inside caches: the partners re-paired ---- */

/* The builders work on virtual ranks, whose partner at level l is the
 * canonical v ^ 2^l; rank pw_real(v) is the XOR over v's bits l of the
 * layout's pair_xor[l] (2^l where that is 0: without a placement, virtual
 * is real). Each pair_xor[l] has l as its top bit, so pw_real maps every
 * aligned block of 2^l virtual ranks onto an aligned block of 2^l ranks:
 * the tree's blocks are the same sets of ranks, combined in the ranks'
 * order (pw_role_at asks which half is lower of the real ranks), and only
 * which rank of a block computes its partial moves. The same bits. */
static int pw_dist(const struct sched_key* k, int l) {
  const struct sched_topo* t = k->topo;
  return t && l < SCHED_PAIR_LEVELS && t->pair_xor[l] ? t->pair_xor[l] : 1 << l;
}

static int pw_real(const struct sched_key* k, int v) {
  int r = 0;
  for (int l = 0; v >> l; l++)
    if ((v >> l) & 1) r ^= pw_dist(k, l);
  return r;
}

static int pw_virtual(const struct sched_key* k, int r) {
  int v = 0;
  for (int l = pairwise_levels(k->nranks) - 1; l >= 0; l--)
    if ((r >> l) & 1) v |= 1 << l, r ^= pw_dist(k, l);
  return v;
}

/* Whether the layout re-pairs this key's ranks. */
static int pw_placed(const struct sched_key* k) {
  for (int l = 0; k->topo && l < SCHED_PAIR_LEVELS; l++)
    if (k->topo->pair_xor[l]) return 1;
  return 0;
}

/* ---- Where each position's block lies ---- */

/* First element of slice i when count elements are cut into p slices. */
static size_t slice_start(size_t count, int p, int i) {
  size_t q = count / (size_t)p, extra = count % (size_t)p;
  return q * (size_t)i + MIN((size_t)i, extra);
}

struct pw_span {
  size_t x, y, n; /* first element in the input and in the output; elements */
};

/* Position u's block. Reduce-scatter: (virtual) rank u's block of the
 * input, which only rank u writes (at the start of its output). Otherwise slice
 * braid_bit_reverse(u) of the buffer: then the blocks of positions congruent
 * modulo 2^(l+1), which travel together in the all-gather, are adjacent. */
static struct pw_span pw_block(const struct sched_key* k, int u) {
  struct pw_span b = {0, 0, 0};
  int L = pairwise_levels(k->nranks), p = 1 << L;
  if (k->coll == COLL_REDUCESCATTER) {
    if (u < k->nranks) b.x = sched_block_offset(k, pw_real(k, u)), b.n = k->count;
    return b;
  }
  int slice = braid_bit_reverse(u, L);
  b.x = b.y = slice_start(k->count, p, slice);
  b.n = slice_start(k->count, p, slice + 1) - b.x;
  return b;
}

/* All-reduce: the blocks of the positions congruent to v modulo 2^(l+1),
 * one run of the buffer. */
static struct pw_span pw_share(const struct sched_key* k, int v, int l) {
  int L = pairwise_levels(k->nranks), p = 1 << L, width = 1 << (L - l - 1);
  int first = braid_bit_reverse(v, L) & ~(width - 1);
  size_t lo = slice_start(k->count, p, first), hi = slice_start(k->count, p, first + width);
  struct pw_span s = {lo, lo, hi - lo};
  return s;
}

/* ---- Reducing one block ---- */

enum pw_role_kind { PW_NONE, PW_COMPUTE, PW_SEND };

struct pw_role {
  int kind;
  int peer;       /* who sends the other half's partial, or who gets ours */
  unsigned order; /* SCHED_LOCAL_FIRST when our half is the lower one */
};

/* Rank r's part at level l in reducing position u's block. */
static struct pw_role pw_role_at(const struct sched_key* k, int r, int u, int l) {
  struct pw_role role = {PW_NONE, -1, 0};
  int n = k->nranks;
  int half = 1 << l, base = block_base(r, l + 1);
  if ((base | half) >= n) return role; /* the upper half holds no rank */
  int vc = base | (u & ((2 << l) - 1)), vo = vc ^ half;
  int hc = pw_holder(vc, l, n), ho = pw_holder(vo, l, n);
  if (r == hc) {
    role.kind = PW_COMPUTE, role.peer = ho;
    role.order = pw_real(k, vc) < pw_real(k, vo) ? SCHED_LOCAL_FIRST : 0;
  } else if (r == ho) {
    role.kind = PW_SEND, role.peer = hc;
  }
  return role;
}

/* A step of position u's chain. Its carry is register u mod
 * SCHED_CARRIES: the chains of a group of at most SCHED_CARRIES blocks
 * (pw_group) are open together, one per block. */
static ncclResult_t pw_append(struct schedule* s, int u, enum sched_prim prim, unsigned flags,
                              int recv_peer, int send_peer, size_t x, size_t y, size_t len) {
  size_t before = s->nsteps;
  ncclResult_t res = sched_append(s, prim, flags, recv_peer, send_peer, x, y, len);
  if (res == ncclSuccess && s->nsteps > before)
    s->steps[before].carry = (uint8_t)(u % SCHED_CARRIES);
  return res;
}

/* How a tree's block values leave their holder: a reduce's go to the
 * root (`root` >= 0); with `fuse`, an all-reduce's go to the partner at
 * the gather's first level, `first`, as well as into the output
 * (pw_tree_gather); otherwise they stay in the output, or are the
 * reduce-scatter's result. */
struct pw_tree {
  int root;
  int fuse;
  int first;
};

/* Where position u's value goes from its holder (-1: nowhere). */
static int pw_final_to(const struct sched_key* k, const struct pw_tree* t, int u) {
  int L = pairwise_levels(k->nranks), owner = pw_holder(u, L, k->nranks);
  if (t->root >= 0) return owner != t->root ? t->root : -1;
  return t->fuse ? owner ^ (1 << t->first) : -1;
}

/* This rank's steps at `level` for elements [off, off + len) of
 * position u's block: it combines (the first time with its own input,
 * pre-multiplied, then with the carry) until it sends its partial on, or
 * holds the block's value: into the output, or to `final_to` when that
 * is not -1 (`keep`: into the output as well). The levels below only set
 * the state (whether a carry exists). */
static ncclResult_t pw_chain(struct schedule* s, const struct sched_key* k, int u,
                             const struct pw_span* b, size_t off, size_t len, int final_to,
                             int keep, int level) {
  ncclResult_t res = ncclSuccess;
  int r = k->rank, n = k->nranks, L = pairwise_levels(n), carry = 0;
  size_t x = b->x + off, y = b->y + off;
  for (int l = 0; l <= level && l < L; l++) {
    int here = l == level;
    struct pw_role role = pw_role_at(k, r, u, l), next = {PW_NONE, -1, 0};
    if (role.kind == PW_SEND)
      return here ? pw_append(s, u, PRIM_SEND, SCHED_PRE, -1, role.peer, x, y, len) : ncclSuccess;
    if (role.kind != PW_COMPUTE) continue;
    for (int j = l + 1; j < L && next.kind == PW_NONE; j++) next = pw_role_at(k, r, u, j);
    if (!carry && !role.order) { /* ours second: pre-multiplied alone, as a sent input is */
      if (here) CHECK(pw_append(s, u, PRIM_LOAD_CARRY, SCHED_PRE, -1, -1, x, y, len));
      carry = 1;
    }
    unsigned f = role.order | (carry ? SCHED_LOCAL_CARRY : SCHED_PRE);
    if (next.kind == PW_SEND)
      return here ? pw_append(s, u, PRIM_RECV_REDUCE_SEND, f, role.peer, next.peer, x, y, len)
                  : ncclSuccess;
    if (next.kind == PW_COMPUTE) {
      if (here) CHECK(pw_append(s, u, PRIM_RECV_REDUCE_CARRY, f, role.peer, -1, x, y, len));
      carry = 1;
      continue;
    }
    if (!here) return ncclSuccess;
    enum sched_prim last = final_to < 0 ? PRIM_RECV_REDUCE_COPY
                           : keep       ? PRIM_RECV_REDUCE_COPY_SEND
                                        : PRIM_RECV_REDUCE_SEND;
    return pw_append(s, u, last, f | SCHED_POST, role.peer, final_to, x, y, len);
  }
fail:
  return res;
}

/* Elements [off, off + len) of position u's block; 0 when off is past it. */
static size_t pw_piece(const struct sched_key* k, int u, size_t off, size_t chunk,
                       struct pw_span* b) {
  *b = pw_block(k, u);
  return off < b->n ? MIN(chunk, b->n - off) : 0;
}

/* Rank r's steps at `level` < L for elements [off, off + len) of position
 * u's block. A value that leaves its holder (pw_final_to) is computed at
 * level L instead (pw_final_steps). */
static ncclResult_t pw_block_steps(struct schedule* s, const struct sched_key* k,
                                   const struct pw_tree* t, int u, size_t off, size_t chunk,
                                   int level) {
  int L = pairwise_levels(k->nranks), to = pw_final_to(k, t, u);
  struct pw_span b;
  size_t len = pw_piece(k, u, off, chunk, &b);
  if (len == 0 || (to >= 0 && level == L - 1 && k->rank == pw_holder(u, L, k->nranks)))
    return ncclSuccess;
  return pw_chain(s, k, u, &b, off, len, to, 0, level);
}

/* Level L: the values that leave their holders, after every level's
 * steps. Each holder first computes and sends its values, then each
 * rank receives those sent to it (receiving first, two holders that send
 * each other theirs would wait for each other). At level L - 1 a value's
 * message could pass the holder's other messages of that level to the
 * same rank, which that rank takes at L - 1, in the other order. */
static ncclResult_t pw_final_steps(struct schedule* s, const struct sched_key* k,
                                   const struct pw_tree* t, int base, int g, size_t off,
                                   size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int r = k->rank, n = k->nranks, L = pairwise_levels(n);
  struct pw_span b;
  for (int u = base; u < base + g; u++) {
    int to = pw_final_to(k, t, u);
    size_t len = pw_piece(k, u, off, chunk, &b);
    if (to >= 0 && len && r == pw_holder(u, L, n))
      CHECK(pw_chain(s, k, u, &b, off, len, to, t->root < 0, L - 1));
  }
  for (int u = base; u < base + g; u++) {
    size_t len = pw_piece(k, u, off, chunk, &b);
    if (len && pw_final_to(k, t, u) == r)
      CHECK(sched_append(s, PRIM_RECV, 0, pw_holder(u, L, n), -1, b.y + off, b.y + off, len));
  }
fail:
  return res;
}

/* Blocks per group (pw_tree_offset): a power of two, 2 to SCHED_CARRIES
 * (each of its chains keeps a carry register), at most slices_per_step,
 * so that the partials the group holds open, a slot each, leave a small
 * window room for the steps that move them on. */
static int pw_group(const struct sched_key* k, int p) {
  int g = 2;
  while (g * 2 <= MIN(MIN(p, SCHED_CARRIES), k->slices_per_step)) g *= 2;
  return MIN(g, p);
}

/* Level l's steps for the slice at `off` of the blocks base .. base + g - 1.
 * Of the blocks u and u + 1 (even u), a rank combines one at level 0 and
 * sends its input for the other: the send goes first, so that it does not
 * wait behind a combine while the level-0 partner waits for it. That keeps
 * each connection's order: the send and the combine talk to the partner
 * in opposite directions. */
static ncclResult_t pw_level_steps(struct schedule* s, const struct sched_key* k,
                                   const struct pw_tree* t, int base, int g, size_t off,
                                   size_t chunk, int l) {
  ncclResult_t res = ncclSuccess;
  for (int u = base; u < base + g; u += 2) {
    struct pw_role odd = pw_role_at(k, k->rank, u + 1, 0);
    int swap = t->root < 0 && odd.kind == PW_SEND;
    CHECK(pw_block_steps(s, k, t, u + swap, off, chunk, l));
    CHECK(pw_block_steps(s, k, t, u + !swap, off, chunk, l));
  }
fail:
  return res;
}

/* The slice at `off` of every block, in the same order on every rank.
 * Block by block instead, the block's owner would do most of the work
 * while the others waited (measured: a third of the bandwidth). The
 * blocks go in groups, level by level within a group: every rank first
 * does the level-0 work of the group's blocks, which waits for nobody's
 * combine, then level 1, whose partials the level before made, and so on.
 * Chain by chain instead, a rank met the combine at the top of a block's
 * tree, L hops of other ranks' combines away, at the start of each slice,
 * and (computing in order) waited there with the next blocks' data
 * already in (on 8 ranks a reduce-scatter took 1.7-1.8x the ring's time
 * that way, 1.6-1.7x level by level). A reduce's values travel on the
 * connections to the root: there nothing moves. */
static ncclResult_t pw_tree_offset(struct schedule* s, const struct sched_key* k,
                                   const struct pw_tree* t, size_t off, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int L = pairwise_levels(k->nranks), p = 1 << L, g = pw_group(k, p);
  for (int base = 0; base < p; base += g) {
    for (int l = 0; l < L; l++) CHECK(pw_level_steps(s, k, t, base, g, off, chunk, l));
    CHECK(pw_final_steps(s, k, t, base, g, off, chunk));
  }
fail:
  return res;
}

/* Elements per block of the largest block: where the slices end. */
static size_t pw_longest(const struct sched_key* k) {
  size_t longest = 0;
  for (int u = 0; u < 1 << pairwise_levels(k->nranks); u++)
    longest = MAX(longest, pw_block(k, u).n);
  return longest;
}

/* Every block reduced along the tree, slice by slice; with `root` >= 0
 * every block's value goes to the root. */
static ncclResult_t pw_reduce_blocks(struct schedule* s, const struct sched_key* k, int root,
                                     size_t chunk) {
  ncclResult_t res = ncclSuccess;
  struct pw_tree t = {root, 0, 0};
  size_t longest = pw_longest(k);
  for (size_t off = 0; off < longest; off += chunk) CHECK(pw_tree_offset(s, k, &t, off, chunk));
fail:
  return res;
}

/* ---- Gathering the blocks back (all-reduce) ---- */

/* Send `mine`, receive `theirs`, slice by slice, each send followed by its
 * receive (a rendezvous transport needs the peer's receive posted). */
static ncclResult_t pw_swap_spans(struct schedule* s, int peer, const struct pw_span* mine,
                                  const struct pw_span* theirs, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  size_t slices = MAX(DIV_UP(mine->n, chunk), DIV_UP(theirs->n, chunk));
  for (size_t i = 0, a = 0; i < slices; i++, a += chunk) {
    if (a < mine->n)
      CHECK(sched_append(s, PRIM_SEND_OUT, SCHED_LOCAL_OUT, -1, peer, mine->y + a, mine->y + a,
                         MIN(chunk, mine->n - a)));
    if (a < theirs->n)
      CHECK(sched_append(s, PRIM_RECV, 0, peer, -1, theirs->y + a, theirs->y + a,
                         MIN(chunk, theirs->n - a)));
  }
fail:
  return res;
}

/* One level of the gather (level by level down): the holders of a pair's
 * halves swap their shares. */
static ncclResult_t pw_gather_level(struct schedule* s, const struct sched_key* k, int l,
                                    size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int r = k->rank, n = k->nranks, half = 1 << l, mine = block_base(r, l);
  if ((block_base(r, l + 1) | half) >= n) return ncclSuccess;
  for (int v = mine; v < mine + half; v++) {
    if (pw_holder(v, l, n) != r) continue;
    struct pw_span a = pw_share(k, v, l), b = pw_share(k, v ^ half, l);
    CHECK(pw_swap_spans(s, pw_holder(v ^ half, l, n), &a, &b, chunk));
  }
fail:
  return res;
}

/* One gather level l for the slice at `off` of every block (as
 * pw_gather_level, whose shares are these blocks), the levels in any
 * order: for each position v this rank holds at level l, the blocks that
 * agree with v on the levels still to gather (`left`, l among them) are
 * swapped with the holder of v's partner, block by block, a piece of ours
 * sent, then a piece of theirs received. Top down, `left` is the levels
 * up to l: the blocks of positions congruent to v modulo 2^(l+1). */
static ncclResult_t pw_gather_level_at(struct schedule* s, const struct sched_key* k, int l,
                                       int left, size_t off, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int r = k->rank, n = k->nranks, half = 1 << l, mine = block_base(r, l),
      p = 1 << pairwise_levels(n);
  if ((block_base(r, l + 1) | half) >= n) return ncclSuccess;
  for (int v = mine; v < mine + half; v++) {
    if (pw_holder(v, l, n) != r) continue;
    int peer = pw_holder(v ^ half, l, n);
    for (int w = 0; w < p; w++) { /* w and its partner w ^ half */
      if ((w ^ v) & left) continue;
      struct pw_span a, b;
      size_t na = pw_piece(k, w, off, chunk, &a), nb = pw_piece(k, w ^ half, off, chunk, &b);
      if (na)
        CHECK(sched_append(s, PRIM_SEND_OUT, SCHED_LOCAL_OUT, -1, peer, a.y + off, a.y + off, na));
      if (nb) CHECK(sched_append(s, PRIM_RECV, 0, peer, -1, b.y + off, b.y + off, nb));
    }
  }
fail:
  return res;
}

static int pw_shared(const struct sched_key* k, int l) {
  return k->topo && l < SCHED_PAIR_LEVELS ? k->topo->pair_shared[l] : 0;
}

/* The order the gather takes the levels in: top down, but on 2^L ranks
 * the levels whose partners share a cache more (sched_topo.pair_shared)
 * later, since each level moves twice what the one before it did. The
 * gather only copies: any order gives the same bits. */
static void pw_gather_order(const struct sched_key* k, int* levels) {
  int L = pairwise_levels(k->nranks), pow2 = (k->nranks & (k->nranks - 1)) == 0;
  for (int j = 0; j < L; j++) levels[j] = L - 1 - j;
  for (int j = 1; pow2 && j < L; j++)
    for (int i = j; i > 0 && pw_shared(k, levels[i - 1]) > pw_shared(k, levels[i]); i--) {
      int l = levels[i];
      levels[i] = levels[i - 1], levels[i - 1] = l;
    }
}

/* The gather of the slice at `off`: its levels from the j-th in `levels`. */
static ncclResult_t pw_gather_at(struct schedule* s, const struct sched_key* k, const int* levels,
                                 int j, size_t off, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int L = pairwise_levels(k->nranks);
  for (; j < L; j++) {
    int left = 0;
    for (int i = j; i < L; i++) left |= 1 << levels[i];
    CHECK(pw_gather_level_at(s, k, levels[j], left, off, chunk));
  }
fail:
  return res;
}

/* Offsets the gather of a slice trails its tree by (pw_tree_gather). */
#define PW_GATHER_LAG 1

/* All-reduce on one node: the tree of every block as a reduce-scatter's
 * (each value into the output), then the gather levels, slice by slice:
 * slice i's tree, then the gather of slice i - PW_GATHER_LAG, whose values
 * are in by then while this slice's level-0 work fills the wait. The
 * output is written once per slice and read back while it is still in
 * the cache; the halving level by level (pw_halving_gather) streams the
 * whole buffer through each of its 2L levels. Every position a rank's
 * (2^L ranks, one group): each value goes to the first gather level's
 * partner as it is computed (in place where the transport takes it),
 * that level's copy out saved. Each element meets the same tree. */
static ncclResult_t pw_tree_gather(struct schedule* s, const struct sched_key* k, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, L = pairwise_levels(n), p = 1 << L, levels[32];
  pw_gather_order(k, levels);
  struct pw_tree t = {-1, (n & (n - 1)) == 0 && pw_group(k, p) == p, levels[0]};
  size_t slices = DIV_UP(pw_longest(k), chunk);
  for (size_t i = 0; i < slices + PW_GATHER_LAG; i++) {
    if (i < slices) CHECK(pw_tree_offset(s, k, &t, i * chunk, chunk));
    if (i < PW_GATHER_LAG) continue;
    CHECK(pw_gather_at(s, k, levels, t.fuse, (i - PW_GATHER_LAG) * chunk, chunk));
  }
fail:
  return res;
}

/* ---- All-reduce: halving level by level (the partials in the output) ---- */

/* Whether, before level l, position v's share was combined into the output
 * at some level: its pair there held ranks on both sides (following the
 * share to the position that took it over, as pw_holder does). */
static int pw_in_output(int v, int l, int n) {
  int h = v;
  for (int j = 0; j < l; j++) {
    int bit = 1 << j, lower = h & ~bit;
    if (block_base(h | bit, j) < n) return 1;
    if ((h & bit) && block_base(h, j) >= n && block_base(lower, j) < n) {
      h = lower;
      j = -1;
    }
  }
  return 0;
}

/* One level for the position v this rank holds: send the partner's share,
 * combine what comes back into ours, slice by slice. The first combine of
 * a share reads the input (pre-multiplied); where the partner's data comes
 * first, the pre-multiplied input is rounded alone into the output before
 * (SCHED_PRE_ROUNDED: only for an op that pre-multiplies). */
static ncclResult_t pw_halve(struct schedule* s, const struct sched_key* k, int v, int l,
                             size_t chunk, int fused) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, w = v ^ (1 << l), peer = pw_holder(w, l, n);
  int from_x = !pw_in_output(v, l, n), last = l == pairwise_levels(n) - 1;
  struct pw_span keep = pw_share(k, v, l), give = pw_share(k, w, l);
  unsigned order = v < w ? SCHED_LOCAL_FIRST : 0, in = SCHED_LOCAL_OUT;
  if (from_x) in = order ? SCHED_PRE : SCHED_PRE | SCHED_PRE_ROUNDED;
  for (size_t a = 0; from_x && !order && a < keep.n; a += chunk)
    CHECK(sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_PRE_ROUNDED, -1, -1, keep.x + a, keep.y + a,
                       MIN(chunk, keep.n - a)));
  size_t slices = MAX(DIV_UP(keep.n, chunk), DIV_UP(give.n, chunk));
  for (size_t i = 0, a = 0; i < slices; i++, a += chunk) {
    if (a < give.n)
      CHECK(sched_append(s, from_x ? PRIM_SEND : PRIM_SEND_OUT,
                         from_x ? SCHED_PRE : SCHED_LOCAL_OUT, -1, peer, give.x + a, give.y + a,
                         MIN(chunk, give.n - a)));
    if (a < keep.n)
      CHECK(sched_append(s, fused ? PRIM_RECV_REDUCE_COPY_SEND : PRIM_RECV_REDUCE_COPY,
                         in | order | (last ? SCHED_POST : 0), peer, fused ? peer : -1, keep.x + a,
                         keep.y + a, MIN(chunk, keep.n - a)));
    if (fused && a < give.n) /* the partner's final share, where it gave ours */
      CHECK(
          sched_append(s, PRIM_RECV, 0, peer, -1, give.y + a, give.y + a, MIN(chunk, give.n - a)));
  }
fail:
  return res;
}

/* One level of the halving (level by level up): the holders of a pair's
 * halves swap halves of their shares and combine (recursive halving at
 * distances 1, 2, 4...), each rank's partner the same for a whole level.
 * `fused` (the last level, every position a rank's): the gather's first
 * level, the same partner's, runs in it, each slice's result sent as it is
 * combined (written where the partner reads it, on transports that take
 * sends in place) and the partner's received after: a copy of the share
 * and a round less, the same bits. */
static ncclResult_t pw_halving_level(struct schedule* s, const struct sched_key* k, int l,
                                     size_t chunk, int fused) {
  ncclResult_t res = ncclSuccess;
  int r = k->rank, n = k->nranks, half = 1 << l, mine = block_base(r, l);
  if ((block_base(r, l + 1) | half) >= n) return ncclSuccess;
  for (int v = mine; v < mine + half; v++)
    if (pw_holder(v, l, n) == r) CHECK(pw_halve(s, k, v, l, chunk, fused));
fail:
  return res;
}

/* ---- All-reduce: segments in a pipeline ---- */

/* Phase p of an all-reduce, 0 <= p < 2L: halving level p, then the gather
 * from level L - 1 down; `fused`: the last halving level runs the first
 * gather level too (pw_halving_level), whose phase is then empty. */
static ncclResult_t pw_phase(struct schedule* s, const struct sched_key* k, int p, size_t chunk,
                             int fused) {
  int L = pairwise_levels(k->nranks);
  if (p < L) return pw_halving_level(s, k, p, chunk, fused && p == L - 1);
  if (fused && p == L) return ncclSuccess;
  return pw_gather_level(s, k, 2 * L - 1 - p, chunk);
}

/* Segment `seg` of `nseg` equal cuts of the buffer: its key (an all-reduce
 * of its own elements) and where it starts. */
static struct sched_key pw_segment(const struct sched_key* k, size_t nseg, size_t seg,
                                   size_t* base) {
  struct sched_key sk = *k;
  size_t q = k->count / nseg, extra = k->count % nseg;
  *base = q * seg + MIN(seg, extra);
  sk.count = q + (seg < extra);
  return sk;
}

/* Phase p of segment seg, its steps moved to the segment's place. */
static ncclResult_t pw_segment_phase(struct schedule* s, const struct sched_key* k, size_t nseg,
                                     size_t seg, int p, size_t chunk, int fused) {
  ncclResult_t res = ncclSuccess;
  size_t base, first = s->nsteps;
  struct sched_key sk = pw_segment(k, nseg, seg, &base);
  CHECK(pw_phase(s, &sk, p, chunk, fused));
  for (size_t i = first; i < s->nsteps; i++) s->steps[i].xoff += base, s->steps[i].yoff += base;
fail:
  return res;
}

/* Segments per all-reduce. On one node, one: every level moves over the
 * same links, there is nothing to overlap, and smaller messages cost
 * (8 ranks over TCP lost a third with 128 KiB segments). Across nodes, a
 * segment's first phase moves a quarter of slices_per_step slices, so
 * that the executor's window holds the steps of the phases of several
 * segments, the one on the network among them (measured on the emulated
 * 2 x 4 cluster: 512 KiB segments gained nothing, 128 KiB ones 1.35x). */
size_t pairwise_segment_bytes(size_t chunk_bytes, int slices_per_step) {
  return MAX(chunk_bytes * (size_t)MAX(1, slices_per_step) / 4, (size_t)1);
}

static size_t pw_segments(const struct sched_key* k, size_t chunk) {
  if (k->topo == NULL || k->topo->nnodes < 2) return 1;
  size_t seg = MAX(pairwise_segment_bytes(chunk * k->elem_size, k->slices_per_step) / k->elem_size,
                   (size_t)1);
  return MAX((size_t)1, k->count / seg);
}

/* The levels of one segment follow each other, so a rank whose next level
 * waits for the network (the level that crosses nodes) would sit idle, and
 * the network would, while it works on a node level. Cut into segments,
 * segment g runs phase t - g at time t: the next segment's node levels
 * run while this one's crosses the network. Every element still meets the
 * same tree; only the order of the steps changes. */
static ncclResult_t pw_halving_gather(struct schedule* s, const struct sched_key* k, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int n = k->nranks, phases = 2 * pairwise_levels(n);
  size_t nseg = pw_segments(k, chunk);
  /* one segment, every position a rank's: the last levels fuse (a pipeline
   * of segments keeps its phases apart, and elsewhere the two levels'
   * partners differ) */
  int fused = nseg == 1 && (n & (n - 1)) == 0;
  for (size_t t = 0; t + 1 < nseg + (size_t)phases; t++)
    for (size_t g = t + 1 > (size_t)phases ? t + 1 - (size_t)phases : 0; g <= t && g < nseg; g++)
      CHECK(pw_segment_phase(s, k, nseg, g, (int)(t - g), chunk, fused));
fail:
  return res;
}

/* Ranks per node when every node holds an aligned block of the same
 * power of two of ranks and there are several nodes (ranks 0-3 on one, 4-7
 * on the next...): then a node's ranks are one subtree of the canonical
 * tree. 0 otherwise. */
static int pw_node_block(const struct sched_key* k) {
  const struct sched_topo* t = k->topo;
  if (t == NULL || t->nnodes < 2 || t->min_ppn != t->max_ppn) return 0;
  int ppn = t->min_ppn;
  if (ppn < 2 || (ppn & (ppn - 1)) != 0) return 0;
  for (int r = 0; r < k->nranks; r++)
    if (t->node_of[r] != t->node_of[r & ~(ppn - 1)]) return 0; /* ranks, not local_of: by rank */
  return ppn;
}

/* Exchanges of the whole buffer with r ^ mask for mask in [from, to). */
static ncclResult_t pw_exchanges(struct schedule* s, const struct sched_key* k, int from, int to,
                                 size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int r = k->rank, n = k->nranks;
  for (int mask = from; mask < to; mask <<= 1) {
    int partner = r ^ mask;
    unsigned flags = (mask * 2 == n ? SCHED_POST : 0) | (r > partner ? SCHED_SWAP : 0);
    for (size_t off = 0; off < k->count; off += chunk)
      CHECK(sched_append(s, PRIM_EXCHANGE, flags, partner, partner, off, off,
                         MIN(chunk, k->count - off)));
  }
fail:
  return res;
}

/* Small buffers, 2^L ranks: whole-buffer exchanges at distances 1, 2, 4...
 * (the lower rank's data first on both sides). Where nodes hold aligned
 * blocks of ppn ranks, the exchanges that cross nodes are made by each
 * node's first rank alone, which then hands the value to the others: one
 * message each way per node pair on the network instead of ppn, the same
 * tree (a node's value is its subtree's). */
static ncclResult_t pw_doubling(struct schedule* s, const struct sched_key* k, size_t chunk) {
  ncclResult_t res = ncclSuccess;
  int r = k->rank, n = k->nranks, ppn = pw_node_block(k), leader = r & ~(ppn - 1);
  for (size_t off = 0; off < k->count; off += chunk)
    CHECK(sched_append(s, PRIM_COPY, SCHED_PRE, -1, -1, off, off, MIN(chunk, k->count - off)));
  if (ppn == 0) return pw_exchanges(s, k, 1, n, chunk);
  CHECK(pw_exchanges(s, k, 1, ppn, chunk));
  if (r == leader) CHECK(pw_exchanges(s, k, ppn, n, chunk));
  for (size_t off = 0; off < k->count; off += chunk) {
    size_t len = MIN(chunk, k->count - off);
    if (r != leader) {
      CHECK(sched_append(s, PRIM_RECV, 0, leader, -1, off, off, len));
      continue;
    }
    for (int q = leader + 1; q < leader + ppn; q++)
      CHECK(sched_append(s, PRIM_SEND_OUT, SCHED_LOCAL_OUT, -1, q, off, off, len));
  }
fail:
  return res;
}

/* ---- The collectives ---- */

static size_t pw_chunk(const struct sched_key* k) {
  return MAX((size_t)1, k->chunk_bytes / k->elem_size);
}

/* One rank: its input, pre-multiplied and post-divided, is the result. */
static ncclResult_t pw_single(struct schedule* s, const struct sched_key* k) {
  size_t x = k->coll == COLL_REDUCESCATTER ? sched_block_offset(k, 0) : 0;
  return sched_append(s, PRIM_COPY, SCHED_PRE | SCHED_POST, -1, -1, x, 0, k->count);
}

/* The key over virtual ranks (pw_real). */
static struct sched_key pw_virtual_key(const struct sched_key* k) {
  struct sched_key v = *k;
  v.rank = pw_virtual(k, k->rank);
  if (k->coll == COLL_REDUCE) v.root = pw_virtual(k, k->root);
  return v;
}

typedef ncclResult_t (*pw_builder)(struct schedule* s, const struct sched_key* k);

/* `build`'s steps over virtual ranks where the layout re-pairs the ranks,
 * then named by rank. */
static ncclResult_t pw_build_placed(struct schedule* s, const struct sched_key* k,
                                    pw_builder build) {
  ncclResult_t res = ncclSuccess;
  if (!pw_placed(k)) return build(s, k);
  struct sched_key v = pw_virtual_key(k);
  size_t first = s->nsteps;
  CHECK(build(s, &v));
  for (size_t i = first; i < s->nsteps; i++) {
    struct sched_step* st = &s->steps[i];
    if (st->recv_peer >= 0) st->recv_peer = pw_real(k, st->recv_peer);
    if (st->send_peer >= 0) st->send_peer = pw_real(k, st->send_peer);
  }
fail:
  return res;
}

static ncclResult_t pw_tree_allreduce(struct schedule* s, const struct sched_key* k) {
  return pw_tree_gather(s, k, pw_chunk(k));
}

static ncclResult_t pw_tree_scatter(struct schedule* s, const struct sched_key* k) {
  return pw_reduce_blocks(s, k, -1, pw_chunk(k));
}

static ncclResult_t pw_tree_reduce(struct schedule* s, const struct sched_key* k) {
  return pw_reduce_blocks(s, k, k->root, pw_chunk(k));
}

ncclResult_t pairwise_schedule_allreduce(struct schedule* s, const struct sched_key* k) {
  if (k->count == 0) return ncclSuccess;
  if (k->nranks == 1) return pw_single(s, k);
  if (pairwise_uses_doubling(k->count, k->elem_size, k->nranks))
    return pw_doubling(s, k, pw_chunk(k));
  if (k->topo == NULL || k->topo->nnodes < 2) return pw_build_placed(s, k, pw_tree_allreduce);
  return pw_halving_gather(s, k, pw_chunk(k));
}

ncclResult_t pairwise_schedule_reducescatter(struct schedule* s, const struct sched_key* k) {
  if (k->count == 0) return ncclSuccess;
  if (k->nranks == 1) return pw_single(s, k);
  return pw_build_placed(s, k, pw_tree_scatter);
}

ncclResult_t pairwise_schedule_reduce(struct schedule* s, const struct sched_key* k) {
  if (k->count == 0) return ncclSuccess;
  if (k->nranks == 1) return pw_single(s, k);
  return pw_build_placed(s, k, pw_tree_reduce);
}

/* The tree's peers (every collective but the small all-reduce's). */
static int pw_tree_peers(const struct sched_key* k, int* peers, int max) {
  int r = k->rank, n = k->nranks, L = pairwise_levels(n), m = 0;
  for (int l = 0; l < L; l++) {
    int half = 1 << l, mine = block_base(r, l);
    if ((block_base(r, l + 1) | half) >= n) continue;
    for (int v = mine; v < mine + half; v++)
      if (pw_holder(v, l, n) == r) m = sched_add_peer(peers, m, max, pw_holder(v ^ half, l, n));
  }
  if (k->coll == COLL_REDUCE) {
    if (r != k->root) return sched_add_peer(peers, m, max, k->root);
    for (int q = 0; q < n; q++)
      if (q != r) m = sched_add_peer(peers, m, max, q);
  }
  return m;
}

int pairwise_peers(const struct sched_key* k, int* peers, int max) {
  int r = k->rank, n = k->nranks, m = 0;
  if (k->coll == COLL_ALLREDUCE && pairwise_uses_doubling(k->count, k->elem_size, n)) {
    int ppn = pw_node_block(k), leader = r & ~(ppn - 1);
    for (int mask = 1; mask < n; mask <<= 1)
      if (ppn == 0 || mask < ppn || r == leader) m = sched_add_peer(peers, m, max, r ^ mask);
    for (int q = leader; ppn && q < leader + ppn; q++)
      if (q != r && (r == leader || q == leader)) m = sched_add_peer(peers, m, max, q);
    return m;
  }
  if (!pw_placed(k)) return pw_tree_peers(k, peers, max);
  struct sched_key v = pw_virtual_key(k);
  m = pw_tree_peers(&v, peers, max);
  for (int i = 0; i < m; i++) peers[i] = pw_real(k, peers[i]);
  return m;
}
