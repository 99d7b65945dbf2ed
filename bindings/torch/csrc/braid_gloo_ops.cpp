/*
 * The two ops gloo has beyond NCCL's, so that a gloo user loses nothing by
 * switching: all_reduce of sparse COO tensors and monitored_barrier. One
 * file, since every file that includes torch's headers costs a minute of
 * compiling.
 *
 * Sparse all_reduce (SUM only, as gloo's): every rank's indices and values
 * are gathered, the union is coalesced, and the sum replaces the input. Each
 * rank coalesces the same gathered lists in the same rank order, so all get
 * the same bits. The second gather is sized by the first (the largest nnz),
 * so this op waits in its caller; the Work it returns completes behind it on
 * the stream. Dense all-reduces stay asynchronous.
 *
 * monitored_barrier: a barrier that, instead of hanging, tells rank 0 which
 * ranks did not come (torch's debugging aid for desynchronized jobs). It
 * goes through the group's Store, not the communicator: a rank stuck in a
 * collective must not stop the others from finding out. Each rank r > 0
 * sets "arrive/r" and waits for "outcome", which rank 0 sets to "ok" once
 * every rank arrived within the timeout, or to the failure. As gloo's, only
 * rank 0 enforces the barrier's timeout (so that the report comes from it);
 * the others wait up to the group's timeout, but learn a failure at once
 * from "outcome". The keys carry a count of the group's monitored barriers,
 * so that calls never see each other's keys.
 */
#include "braid_backend.hpp"

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
  at::Tensor in = t.coalesce();
  at::Tensor idx = in._indices().contiguous(); /* [sparse_dim, nnz] int64 */
  at::Tensor val = in._values().contiguous();  /* [nnz, dense sizes...] */
  Ms timeout = opts.timeout;

  at::Tensor nnz = gather_now(*this, at::full({1}, in._nnz(), idx.options()), size_, timeout);
  int64_t most = nnz.max().item<int64_t>();
  at::Tensor all_idx = gather_now(*this, padded(idx, 1, most), size_, timeout);
  at::Tensor all_val = gather_now(*this, padded(val, 0, most), size_, timeout);

  std::vector<at::Tensor> idxs, vals;
  for (int r = 0; r < size_; r++) {
    int64_t n = nnz[r][0].item<int64_t>();
    TORCH_CHECK(n >= 0, "braid: all_reduce (sparse): rank ", r, " sent ", n, " entries");
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
    std::string why =
        "rank 0 did not answer within " + std::to_string(comm_->timeout.count()) + " ms";
    if (appears(*store_, outcome, comm_->timeout)) {
      std::vector<uint8_t> v = store_->get(outcome);
      std::string said(v.begin(), v.end());
      if (said == "ok") return;
      why = "rank 0 reports: " + said;
    }
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
  store_->set(outcome, bytes_of(error.empty() ? "ok" : error));
  TORCH_CHECK(error.empty(), "braid: [Rank 0]: ", error);
}

}  // namespace braid_torch
