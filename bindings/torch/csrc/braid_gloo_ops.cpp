/*
 * The two ops gloo has beyond NCCL's, so that a gloo user loses nothing by
 * switching: all_reduce of sparse COO tensors and monitored_barrier. One
 * file, since every file that includes torch's headers costs a minute of
 * compiling.
 *
 * Sparse all_reduce (SUM only, as gloo's): every rank's indices and values
 * are gathered, the union is coalesced, and the sum replaces the input. Each
 * rank coalesces the same gathered lists in the same rank order, so all get
 * the same bits. The first gather carries each rank's description (entries,
 * shape, type, whether its indices lie inside its shape), so that every rank
 * judges the call alike: one rank's bad input fails every rank with the same
 * error naming it, never one rank while another returns a sum. The next
 * gathers are sized by the first (the largest nnz), so this op waits in its
 * caller; the Work it returns completes behind it on the stream. Dense
 * all-reduces stay asynchronous.
 *
 * monitored_barrier: a barrier that, instead of hanging, tells rank 0 which
 * ranks did not come (torch's debugging aid for desynchronized jobs). It
 * goes through the group's Store, not the communicator: a rank stuck in a
 * collective must not stop the others from finding out. Each rank r > 0
 * sets "arrive/r" and waits for "outcome", which rank 0 sets to "ok" once
 * every rank arrived within the timeout, or to the failure. As gloo's, only
 * rank 0 enforces the barrier's timeout (so that the report comes from it);
 * the others wait up to the group's timeout, but learn a failure at once
 * from "outcome". A rank that gives up on rank 0 writes its own failure to
 * "outcome" instead, and rank 0 writes its verdict only where "outcome" is
 * still empty (the store's compare-and-set): whoever comes first decides
 * for every rank, so a late rank 0 fails with the others instead of passing
 * after they raised. The keys carry a count of the group's monitored
 * barriers, so that calls never see each other's keys.
 */
#include "braid_backend.hpp"

#include <algorithm>
#include <sstream>

namespace braid_torch {

namespace {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

/* ---------------------------------------------------------------- sparse all_reduce */

/* all-gather of `in` into a fresh [size, in...] tensor, waited for */
at::Tensor gather_now(BraidBackend& b, const at::Tensor& in, int size, Ms timeout) {
  std::vector<int64_t> shape{(int64_t)size};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(shape, in.options());
  c10d::AllgatherOptions opts;
  opts.timeout = timeout;
  at::Tensor src = in;
  b._allgather_base(out, src, opts)->wait();
  return out;
}

/* `t` widened along `dim` to `len` entries, zeros after its own */
at::Tensor padded(const at::Tensor& t, int64_t dim, int64_t len) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim] = len;
  at::Tensor p = at::zeros(shape, t.options());
  p.narrow(dim, 0, t.size(dim)).copy_(t);
  return p;
}

/* What each rank says of its sparse tensor in the first gather: entries,
 * whether its indices lie inside its shape, then type, sparse dims, dims and
 * sizes (up to kSparseMaxDims). */
constexpr int64_t kSparseMaxDims = 64;
enum SparseMeta : int64_t { kNnz, kInRange, kType, kSparseDims, kDims, kSizes };
constexpr int64_t kSparseMetaLen = kSizes + kSparseMaxDims;

/* Do t's indices lie inside its shape? Looked at before coalesce(), which
 * trusts them (torch's sparse invariant checks are off by default). */
bool indices_in_range(const at::Tensor& t) {
  at::Tensor idx = t._indices();
  for (int64_t d = 0; d < idx.size(0) && idx.size(1) > 0; d++)
    if (idx[d].min().item<int64_t>() < 0 || idx[d].max().item<int64_t>() >= t.size(d)) return false;
  return true;
}

at::Tensor sparse_meta(const at::Tensor& t, bool in_range, int64_t nnz) {
  at::Tensor m = at::zeros({kSparseMetaLen}, at::kLong);
  int64_t* p = m.data_ptr<int64_t>();
  p[kNnz] = nnz;
  p[kInRange] = in_range && t.dim() <= kSparseMaxDims;
  p[kType] = (int64_t)t.scalar_type();
  p[kSparseDims] = t.sparse_dim();
  p[kDims] = t.dim();
  for (int64_t d = 0; d < t.dim() && d < kSparseMaxDims; d++) p[kSizes + d] = t.size(d);
  return m;
}

std::string shape_of(const int64_t* m) {
  std::ostringstream o;
  o << c10::toString((c10::ScalarType)m[kType]) << " [";
  for (int64_t d = 0; d < std::min(m[kDims], kSparseMaxDims); d++)
    o << (d ? ", " : "") << m[kSizes + d];
  o << "] over " << m[kSparseDims] << " sparse dims";
  return o.str();
}

/* The same verdict on every rank, from the gathered descriptions: empty
 * when the call may go on, else the error naming the first rank at fault. */
std::string sparse_verdict(const at::Tensor& metas, int size) {
  const int64_t* m0 = metas[0].data_ptr<int64_t>();
  for (int r = 0; r < size; r++) {
    const int64_t* m = metas[r].data_ptr<int64_t>();
    if (!m[kInRange] || m[kNnz] < 0)
      return "rank " + std::to_string(r) + "'s indices lie outside its tensor's size (" +
             shape_of(m) + ")";
    if (!std::equal(m + kType, m + kSparseMetaLen, m0 + kType))
      return "rank " + std::to_string(r) + "'s tensor is " + shape_of(m) + ", rank 0's " +
             shape_of(m0);
  }
  return "";
}

/* ---------------------------------------------------------------- monitored_barrier */

std::vector<uint8_t> bytes_of(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string join(const std::vector<int>& ranks) {
  std::ostringstream o;
  for (size_t i = 0; i < ranks.size(); i++) o << (i ? ", " : "") << ranks[i];
  return o.str();
}

/* Whether `key` appears within `timeout` (a Store reads 0 ms as "forever",
 * so a spent budget only looks once). */
bool appears(c10d::Store& store, const std::string& key, Ms timeout) {
  try {
    if (timeout.count() <= 0) return store.check({key});
    store.wait({key}, timeout);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

c10::intrusive_ptr<c10d::Work> BraidBackend::allreduceSparse(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  at::Tensor& t = tensors[0];
  TORCH_CHECK(t.device().is_cpu(), "braid: all_reduce takes CPU tensors, got a sparse one on ",
              t.device());
  TORCH_CHECK(opts.reduceOp == c10d::ReduceOp::SUM,
              "braid: all_reduce of sparse tensors only sums (ReduceOp.SUM), as gloo's");
  TORCH_CHECK(!coalescing_, "braid: all_reduce of a sparse tensor cannot be coalesced");
  Ms timeout = opts.timeout;
  /* a rank whose input is bad still takes part in the first gather, so
   * that every rank fails alike */
  bool in_range = indices_in_range(t);
  at::Tensor in = in_range ? t.coalesce() : t;
  at::Tensor metas = gather_now(*this, sparse_meta(t, in_range, in._nnz()), size_, timeout);
  std::string verdict = sparse_verdict(metas, size_);
  TORCH_CHECK(verdict.empty(), "braid: all_reduce (sparse): ", verdict);
  at::Tensor idx = in._indices().contiguous(); /* [sparse_dim, nnz] int64 */
  at::Tensor val = in._values().contiguous();  /* [nnz, dense sizes...] */

  int64_t most = metas.select(1, kNnz).max().item<int64_t>();
  at::Tensor all_idx = gather_now(*this, padded(idx, 1, most), size_, timeout);
  at::Tensor all_val = gather_now(*this, padded(val, 0, most), size_, timeout);

  std::vector<at::Tensor> idxs, vals;
  for (int r = 0; r < size_; r++) {
    int64_t n = metas[r][kNnz].item<int64_t>();
    idxs.push_back(all_idx[r].narrow(1, 0, n));
    vals.push_back(all_val[r].narrow(0, 0, n));
  }
  at::Tensor all = at::cat(idxs, 1);
  /* every index inside the shape before torch builds on them: it does not
   * check (its sparse invariant checks are off by default), and an index
   * out of range, from a peer's bug or bytes, would be a write out of bounds */
  for (int64_t d = 0; d < all.size(0) && all.size(1) > 0; d++)
    TORCH_CHECK(all[d].min().item<int64_t>() >= 0 && all[d].max().item<int64_t>() < t.size(d),
                "braid: all_reduce (sparse): an index of dimension ", d,
                " is outside the tensor's size ", t.size(d));
  at::Tensor sum = at::sparse_coo_tensor(all, at::cat(vals, 0), t.sizes(), t.options()).coalesce();
  t.copy_(sum);
  return submit("all_reduce", c10d::OpType::ALLREDUCE, {}, tensors, {}, timeout);
}

void BraidBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  TORCH_CHECK(store_, "braid: monitored_barrier needs the group's store, and this group has none");
  const Ms timeout = timeoutOf(opts.timeout);
  const std::string prefix = "braid/monitored_barrier/" + std::to_string(monitored_++) + "/";
  const std::string outcome = prefix + "outcome";
  if (size_ == 1) return;

  if (rank_ != 0) {
    store_->set(prefix + "arrive/" + std::to_string(rank_), bytes_of("1"));
    const std::string gave_up = "Rank " + std::to_string(rank_) + " gave up on rank 0 after " +
                                std::to_string(comm_->timeout.count()) + " ms";
    std::vector<uint8_t> v = appears(*store_, outcome, comm_->timeout)
                                 ? store_->get(outcome)
                                 : store_->compareSet(outcome, {}, bytes_of(gave_up));
    std::string said(v.begin(), v.end());
    if (said == "ok") return;
    std::string why = said == gave_up ? "rank 0 did not answer within " +
                                            std::to_string(comm_->timeout.count()) + " ms"
                      : said.find(" gave up on rank 0 ") != std::string::npos
                          ? said /* another rank's verdict came first */
                          : "rank 0 reports: " + said;
    TORCH_CHECK(false, "braid: Rank ", rank_,
                " successfully reached monitoredBarrier, but received errors while waiting for "
                "send/recv from rank 0 (",
                why, "). Please check rank 0 logs for faulty rank.");
  }

  /* rank 0: each rank's arrival, in rank order; without waitAllRanks the
   * first missing rank ends it, and the time left shrinks as it goes */
  const auto start = Clock::now();
  std::vector<int> missing, arrived;
  std::string error;
  for (int r = 1; r < size_ && error.empty(); r++) {
    Ms left =
        waitAllRanks ? timeout : timeout - std::chrono::duration_cast<Ms>(Clock::now() - start);
    if (!waitAllRanks && left.count() <= 0) {
      error = "Rank 0 timed out in monitoredBarrier after " + std::to_string(timeout.count()) +
              " ms. Successfully processed ranks: " + (arrived.empty() ? "none" : join(arrived));
      break;
    }
    const std::string key = prefix + "arrive/" + std::to_string(r);
    if (appears(*store_, key, left)) {
      arrived.push_back(r);
      store_->deleteKey(key);
    } else if (waitAllRanks) {
      missing.push_back(r);
    } else {
      error = "Rank " + std::to_string(r) + " failed to pass monitoredBarrier in " +
              std::to_string(timeout.count()) + " ms";
    }
  }
  if (error.empty() && !missing.empty())
    error = "Ranks " + join(missing) + " failed to pass monitoredBarrier in " +
            std::to_string(timeout.count()) + " ms";
  /* a rank that gave up first has decided: it raised, so must rank 0 */
  const std::string verdict = error.empty() ? "ok" : error;
  std::vector<uint8_t> v = store_->compareSet(outcome, {}, bytes_of(verdict));
  std::string said(v.begin(), v.end());
  if (said != verdict) error = said + ", before rank 0 came (the barrier failed for every rank)";
  TORCH_CHECK(error.empty(), "braid: [Rank 0]: ", error);
}

}  // namespace braid_torch
