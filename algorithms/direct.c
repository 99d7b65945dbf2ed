/*
 * The direct algorithm's plan (direct.h).
 */
#include "direct.h"

#include <string.h>

#include "core.h"
#include "schedule.h"

/* Rank r's slice of `count` elements: an equal share, rounded up to
 * `align`, so the last ranks may get less, or nothing. */
static void direct_slice(size_t count, int r, int nranks, size_t align, size_t* lo, size_t* hi) {
  size_t share = (count + (size_t)nranks - 1) / (size_t)nranks;
  share = ALIGN_UP(share, align);
  *lo = MIN((size_t)r * share, count);
  *hi = MIN(*lo + share, count);
}

static struct direct_ref ref(int rank, int buf, size_t off) {
  return (struct direct_ref){rank, buf, off};
}

/* Every rank's `buf` at `off`, in rank order, as sources or destinations. */
static int refs_all(struct direct_ref* out, int nranks, int buf, size_t off) {
  for (int k = 0; k < nranks; k++) out[k] = ref(k, buf, off);
  return nranks;
}

ncclResult_t direct_plan(int coll, int rank, int nranks, int root, size_t count, size_t stride,
                         size_t align, struct direct_task* t) {
  size_t lo, hi;
  memset(t, 0, sizeof(*t));
  if (nranks < 1 || nranks > DIRECT_MAX_RANKS || rank < 0 || rank >= nranks) {
    WARN("Direct: %d ranks (rank %d); it joins 1 to %d", nranks, rank, DIRECT_MAX_RANKS);
    return ncclInvalidArgument;
  }
  if (stride == 0) stride = count;
  direct_slice(count, rank, nranks, MAX(align, (size_t)1), &lo, &hi);
  switch (coll) {
    case COLL_ALLREDUCE:
      t->nsrcs = refs_all(t->srcs, nranks, DIRECT_SEND, lo);
      t->ndsts = refs_all(t->dsts, nranks, DIRECT_RECV, lo);
      t->n = hi - lo;
      break;
    case COLL_REDUCE:
      t->nsrcs = refs_all(t->srcs, nranks, DIRECT_SEND, lo);
      t->ndsts = 1, t->dsts[0] = ref(root, DIRECT_RECV, lo);
      t->n = hi - lo;
      break;
    case COLL_BROADCAST:
      t->nsrcs = 1, t->srcs[0] = ref(root, DIRECT_SEND, lo);
      t->ndsts = refs_all(t->dsts, nranks, DIRECT_RECV, lo);
      t->n = hi - lo;
      break;
    case COLL_REDUCESCATTER: /* this rank's block, whole: the ranks' blocks are the slices */
      t->nsrcs = refs_all(t->srcs, nranks, DIRECT_SEND, (size_t)rank * stride);
      t->ndsts = 1, t->dsts[0] = ref(rank, DIRECT_RECV, 0);
      t->n = count;
      break;
    case COLL_ALLGATHER:
      t->nsrcs = 1, t->srcs[0] = ref(rank, DIRECT_SEND, 0);
      t->ndsts = refs_all(t->dsts, nranks, DIRECT_RECV, (size_t)rank * stride);
      t->n = count;
      break;
    default:
      WARN("Direct: collective %d has no direct plan", coll);
      return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t direct_plan_staged(int rank, int nranks, size_t count, size_t align,
                                struct direct_task* reduce, struct direct_task* spread,
                                size_t* lo) {
  struct direct_task whole;
  ncclResult_t res = direct_plan(COLL_ALLREDUCE, rank, nranks, 0, count, 0, align, &whole);
  if (res != ncclSuccess) return res;
  *lo = whole.srcs[0].off;
  *reduce = whole;
  reduce->ndsts = 1, reduce->dsts[0] = ref(rank, DIRECT_SCRATCH, 0);
  *spread = whole;
  spread->nsrcs = 1, spread->srcs[0] = ref(rank, DIRECT_SCRATCH, 0);
  return ncclSuccess;
}
