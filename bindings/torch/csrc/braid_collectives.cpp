/*
 * The collectives of backend "braid": each torch op becomes one or more
 * Braid calls (a group when several), with staging copies where a tensor
 * is not one contiguous block, submitted to the process group
 * (braid_backend.cpp) as one unit.
 */
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "braid_ops.hpp"

namespace braid_torch {

/* ---------------------------------------------------------------- staging */

Block block_of(const at::Tensor& t, Call& c, bool in, bool out) {
  if (t.is_contiguous() && !t.is_neg() && !t.is_conj()) return {t, false};
  at::Tensor s = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor user = t;
  if (in) {
    auto prev = c.pre;
    c.pre = [prev, s, user]() mutable {
      if (prev) prev();
      s.copy_(user.resolve_conj().resolve_neg());
    };
  }
  if (out) {
    auto prev = c.post;
    c.post = [prev, s, user]() mutable {
      if (prev) prev();
      user.copy_(s);
    };
  }
  return {s, true};
}

void add_pre(Call& c, std::function<void()> f) {
  auto prev = c.pre;
  c.pre = [prev, f]() {
    if (prev) prev();
    f();
  };
}
void add_post(Call& c, std::function<void()> f) {
  auto prev = c.post;
  c.post = [prev, f]() {
    if (prev) prev();
    f();
  };
}

/* split sizes of an all-to-all: the rows each rank sends or gets */
std::vector<int64_t> splits_of(const char* op, const std::vector<int64_t>& given,
                               const at::Tensor& t, int n) {
  if (!given.empty()) {
    TORCH_CHECK((int)given.size() == n, "braid: ", op, ": ", given.size(), " split sizes for ", n,
                " ranks");
    int64_t sum = 0;
    for (int64_t s : given) {
      TORCH_CHECK(s >= 0, "braid: ", op, ": negative split size ", s);
      sum += s;
    }
    TORCH_CHECK(t.dim() > 0 && sum == t.size(0), "braid: ", op, ": split sizes add up to ", sum,
                " rows, the tensor has ", t.dim() ? t.size(0) : 0);
    return given;
  }
  TORCH_CHECK(t.dim() > 0 && t.size(0) % n == 0, "braid: ", op, ": ", t.dim() ? t.size(0) : 0,
              " rows do not split evenly over ", n, " ranks");
  return std::vector<int64_t>(n, t.size(0) / n);
}

/* ---------------------------------------------------------------- collectives */

c10::intrusive_ptr<c10d::Work> BraidBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  at::Tensor& t = single("broadcast", tensors);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "braid: broadcast: root ", opts.rootRank,
              " is not a rank of this group of ", size_);
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (t.numel() > 0) {
    Call c;
    Block b = block_of(t, c, rank_ == opts.rootRank, true);
    void* p = b.t.data_ptr();
    size_t n = nbytes(t);
    int root = (int)opts.rootRank;
    c.issue = [p, n, root](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(p, p, n, ncclUint8, root, comm, s);
    };
    keep.push_back(b.t);
    calls.push_back(std::move(c));
  }
  return submit("broadcast", c10d::OpType::BROADCAST, std::move(calls), tensors, keep,
                opts.timeout);
}

/* allreduce, or reduce to `root` (-1: all) of one tensor, in place */
static Call reduce_call(const char* op, const at::Tensor& t, const c10d::ReduceOp& rop, int root,
                        int nranks, std::vector<at::Tensor>& keep) {
  Red r = red_plan(op, t.scalar_type(), rop);
  if (r.bitwise >= 0) return bitwise_call(t, r, nranks, keep);
  Call c;
  Block b = red_block(t, r, c, true, true);
  void* p = b.t.data_ptr();
  size_t n = red_count(t, r);
  at::ScalarType st = reduced_type(t.scalar_type(), r);
  c.issue = [p, n, r, st, root](ncclComm_t comm, cudaStream_t s) {
    return with_op(r, st, comm, [&](ncclRedOp_t op) {
      return root < 0 ? ncclAllReduce(p, p, n, r.type, op, comm, s)
                      : ncclReduce(p, p, n, r.type, op, root, comm, s);
    });
  };
  keep.push_back(b.t);
  return c;
}

c10::intrusive_ptr<c10d::Work> BraidBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  if (tensors.size() == 1 && tensors[0].layout() == at::kSparse)
    return allreduceSparse(tensors, opts);
  at::Tensor& t = single("all_reduce", tensors);
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (t.numel() > 0)
    calls.push_back(reduce_call("all_reduce", t, opts.reduceOp, -1, size_, keep));
  else
    red_plan("all_reduce", t.scalar_type(), opts.reduceOp); /* still refuse what is wrong */
  return submit("all_reduce", c10d::OpType::ALLREDUCE, std::move(calls), tensors, keep,
                opts.timeout);
}

void BraidBackend::allReduceNow(at::Tensor& t, const c10d::ReduceOp& op) {
  check_tensor("all_reduce_", t);
  auto unit = std::make_shared<Unit>();
  unit->comm = comm_;
  unit->what = "all_reduce_ (sequence number " + std::to_string(++seq_) + ")";
  unit->timeout = comm_->timeout;
  if (t.numel() == 0) {
    red_plan("all_reduce_", t.scalar_type(), op); /* still refuse what is wrong */
    return;
  }
  Call c = reduce_call("all_reduce_", t, op, -1, size_, unit->keep);
  if (c.pre) unit->pre.push_back(c.pre);
  if (c.post) unit->post.push_back(c.post);
  unit->calls.push_back(std::move(c));
  comm_->runNow(unit);
}

double BraidBackend::libraryLoop(at::Tensor& t, int64_t iters) {
  check_tensor("library_loop", t);
  TORCH_CHECK(iters > 0 && t.numel() > 0, "braid: library_loop: needs iters > 0 and elements");
  auto unit = std::make_shared<Unit>();
  unit->comm = comm_;
  unit->what = "library_loop";
  unit->timeout = comm_->timeout;
  Call c =
      reduce_call("library_loop", t, c10d::ReduceOp(c10d::ReduceOp::SUM), -1, size_, unit->keep);
  TORCH_CHECK(!c.pre && !c.post, "braid: library_loop: ", t.scalar_type(),
              " is not reduced by the library as it is");
  unit->calls.assign((size_t)iters, c);
  auto t0 = std::chrono::steady_clock::now();
  comm_->runNow(unit);
  std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
  return dt.count() / (double)iters;
}

c10::intrusive_ptr<c10d::Work> BraidBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  for (auto& t : tensors) {
    check_tensor("all_reduce_coalesced", t);
    if (t.numel() > 0)
      calls.push_back(reduce_call("all_reduce_coalesced", t, opts.reduceOp, -1, size_, keep));
  }
  return submit("all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, std::move(calls),
                tensors, keep, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  at::Tensor& t = single("reduce", tensors);
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "braid: reduce: root ", opts.rootRank,
              " is not a rank of this group of ", size_);
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (t.numel() > 0)
    calls.push_back(reduce_call("reduce", t, opts.reduceOp, (int)opts.rootRank, size_, keep));
  return submit("reduce", c10d::OpType::REDUCE, std::move(calls), tensors, keep, opts.timeout);
}

/* all-gather of `in` into the one block `out` (n x in), bytes */
static Call allgather_call(const at::Tensor& in, const at::Tensor& out,
                           std::vector<at::Tensor>& keep) {
  Call c;
  Block bi = block_of(in, c, true, false);
  Block bo = block_of(out, c, false, true);
  void* src = bi.t.data_ptr();
  void* dst = bo.t.data_ptr();
  size_t n = nbytes(in);
  c.issue = [src, dst, n](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(src, dst, n, ncclUint8, comm, s);
  };
  keep.push_back(bi.t);
  keep.push_back(bo.t);
  return c;
}

/* the same, into a list of n tensors */
static Call allgather_list_call(const char* op, const at::Tensor& in,
                                const std::vector<at::Tensor>& outs, int nranks,
                                std::vector<at::Tensor>& keep) {
  TORCH_CHECK((int)outs.size() == nranks, "braid: ", op, ": ", outs.size(), " output tensors for ",
              nranks, " ranks");
  for (auto& o : outs) {
    check_tensor(op, o);
    TORCH_CHECK(o.numel() == in.numel() && o.element_size() == in.element_size(), "braid: ", op,
                ": an output tensor of ", o.numel(), " ", o.scalar_type(),
                " elements for an input of ", in.numel(), " ", in.scalar_type());
  }
  at::Tensor flat = at::empty({(int64_t)nranks, in.numel()}, in.options());
  Call c = allgather_call(in, flat, keep);
  std::vector<at::Tensor> dst = outs;
  add_post(c, [flat, dst]() mutable {
    for (size_t i = 0; i < dst.size(); i++) dst[i].copy_(flat[i].view(dst[i].sizes()));
  });
  return c;
}

c10::intrusive_ptr<c10d::Work> BraidBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  at::Tensor& in = single("all_gather", inputs);
  TORCH_CHECK(outputs.size() == 1, "braid: all_gather takes one output list per process");
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (in.numel() > 0)
    calls.push_back(allgather_list_call("all_gather", in, outputs[0], size_, keep));
  else
    TORCH_CHECK((int)outputs[0].size() == size_, "braid: all_gather: ", outputs[0].size(),
                " output tensors for ", size_, " ranks");
  return submit("all_gather", c10d::OpType::ALLGATHER, std::move(calls), outputs[0], keep,
                opts.timeout, &inputs);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  check_tensor("all_gather_into_tensor", input);
  check_tensor("all_gather_into_tensor", output);
  TORCH_CHECK(
      output.numel() == input.numel() * size_ && output.element_size() == input.element_size(),
      "braid: all_gather_into_tensor: the output has ", output.numel(), " elements, expected ",
      size_, " x ", input.numel());
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (input.numel() > 0) calls.push_back(allgather_call(input, output, keep));
  std::vector<at::Tensor> ins{input};
  return submit("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, std::move(calls), {output},
                keep, opts.timeout, &ins);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  /* outputs[r][i]: input i of rank r */
  TORCH_CHECK((int)outputs.size() == size_, "braid: all_gather_coalesced: ", outputs.size(),
              " output lists for ", size_, " ranks");
  std::vector<Call> calls;
  std::vector<at::Tensor> keep, outs;
  for (size_t i = 0; i < inputs.size(); i++) {
    check_tensor("all_gather_coalesced", inputs[i]);
    std::vector<at::Tensor> per_rank;
    for (int r = 0; r < size_; r++) {
      TORCH_CHECK(outputs[r].size() == inputs.size(), "braid: all_gather_coalesced: rank ", r,
                  "'s output list has ", outputs[r].size(), " tensors for ", inputs.size(),
                  " inputs");
      per_rank.push_back(outputs[r][i]);
      outs.push_back(outputs[r][i]);
    }
    if (inputs[i].numel() > 0)
      calls.push_back(
          allgather_list_call("all_gather_coalesced", inputs[i], per_rank, size_, keep));
  }
  return submit("all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, std::move(calls), outs,
                keep, opts.timeout, &inputs);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "braid: all_gather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); i++) {
    check_tensor("all_gather_into_tensor_coalesced", inputs[i]);
    check_tensor("all_gather_into_tensor_coalesced", outputs[i]);
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_,
                "braid: all_gather_into_tensor_coalesced: output ", i, " has ", outputs[i].numel(),
                " elements, expected ", size_, " x ", inputs[i].numel());
    if (inputs[i].numel() > 0) calls.push_back(allgather_call(inputs[i], outputs[i], keep));
  }
  return submit("all_gather_into_tensor_coalesced", c10d::OpType::COALESCED, std::move(calls),
                outputs, keep, opts.timeout);
}

/* The root's list of one tensor per rank for gather (outputs) and scatter
 * (inputs), each the size and element size of this rank's own tensor; the
 * other ranks pass none. `kind` names the list, `mine` the rank's tensor. */
std::vector<at::Tensor> BraidBackend::root_list(const char* op, int root,
                                                std::vector<std::vector<at::Tensor>>& lists,
                                                const at::Tensor& like, const char* kind,
                                                const char* mine) {
  TORCH_CHECK(root >= 0 && root < size_, "braid: ", op, ": root ", root,
              " is not a rank of this group of ", size_);
  if (rank_ != root) {
    TORCH_CHECK(lists.empty() || (lists.size() == 1 && lists[0].empty()), "braid: ", op,
                ": only the root (", root, ") takes ", kind, " tensors");
    return {};
  }
  TORCH_CHECK(lists.size() == 1 && (int)lists[0].size() == size_, "braid: ", op,
              ": the root needs one ", kind, " list of ", size_, " tensors");
  for (auto& t : lists[0]) {
    check_tensor(op, t);
    TORCH_CHECK(t.numel() == like.numel() && t.element_size() == like.element_size(), "braid: ", op,
                ": an ", kind, " tensor of ", t.numel(), " ", t.scalar_type(), " elements for an ",
                mine, " of ", like.numel(), " ", like.scalar_type());
  }
  return lists[0];
}

c10::intrusive_ptr<c10d::Work> BraidBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  at::Tensor& in = single("gather", inputs);
  int root = (int)opts.rootRank;
  std::vector<at::Tensor> outs = root_list("gather", root, outputs, in, "output", "input");
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (in.numel() > 0) {
    Call c;
    Block bi = block_of(in, c, true, false);
    at::Tensor flat;
    if (rank_ == root) flat = at::empty({(int64_t)size_, in.numel()}, in.options());
    void* src = bi.t.data_ptr();
    void* dst = rank_ == root ? flat.data_ptr() : nullptr;
    size_t n = nbytes(in);
    c.issue = [src, dst, n, root](ncclComm_t comm, cudaStream_t s) {
      return ncclGather(src, dst, n, ncclUint8, root, comm, s);
    };
    if (rank_ == root)
      add_post(c, [flat, outs]() mutable {
        for (size_t i = 0; i < outs.size(); i++) outs[i].copy_(flat[i].view(outs[i].sizes()));
      });
    keep.push_back(bi.t);
    if (flat.defined()) keep.push_back(flat);
    calls.push_back(std::move(c));
  }
  return submit("gather", c10d::OpType::GATHER, std::move(calls), outs, keep, opts.timeout,
                &inputs);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  at::Tensor& out = single("scatter", outputs);
  int root = (int)opts.rootRank;
  std::vector<at::Tensor> ins = root_list("scatter", root, inputs, out, "input", "output");
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (out.numel() > 0) {
    Call c;
    at::Tensor flat;
    if (rank_ == root) {
      flat = at::empty({(int64_t)size_, out.numel()}, out.options());
      add_pre(c, [flat, ins]() mutable {
        for (size_t i = 0; i < ins.size(); i++) flat[i].copy_(ins[i].reshape({-1}));
      });
    }
    Block bo = block_of(out, c, false, true);
    void* src = rank_ == root ? flat.data_ptr() : nullptr;
    void* dst = bo.t.data_ptr();
    size_t n = nbytes(out);
    c.issue = [src, dst, n, root](ncclComm_t comm, cudaStream_t s) {
      return ncclScatter(src, dst, n, ncclUint8, root, comm, s);
    };
    keep.push_back(bo.t);
    if (flat.defined()) keep.push_back(flat);
    calls.push_back(std::move(c));
  }
  return submit("scatter", c10d::OpType::SCATTER, std::move(calls), outputs, keep, opts.timeout);
}

/* reduce-scatter of the block `in` (n x out) into `out` */
static Call reduce_scatter_call(const char* op, const at::Tensor& in, const at::Tensor& out,
                                const c10d::ReduceOp& rop, std::vector<at::Tensor>& keep) {
  Red r = red_plan(op, out.scalar_type(), rop);
  TORCH_CHECK(r.bitwise < 0, "braid: ", op, " does not support ", op_name(rop),
              " (NCCL has no bitwise reductions; all_reduce does them by all-gathering)");
  Call c;
  Block bi = red_block(in, r, c, true, false);
  Block bo = red_block(out, r, c, false, true);
  void* src = bi.t.data_ptr();
  void* dst = bo.t.data_ptr();
  size_t n = red_count(out, r);
  at::ScalarType st = reduced_type(out.scalar_type(), r);
  c.issue = [src, dst, n, r, st](ncclComm_t comm, cudaStream_t s) {
    return with_op(r, st, comm, [&](ncclRedOp_t o) {
      return ncclReduceScatter(src, dst, n, r.type, o, comm, s);
    });
  };
  keep.push_back(bi.t);
  keep.push_back(bo.t);
  return c;
}

c10::intrusive_ptr<c10d::Work> BraidBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor& out = single("reduce_scatter", outputs);
  TORCH_CHECK(inputs.size() == 1 && (int)inputs[0].size() == size_,
              "braid: reduce_scatter takes one input list of ", size_, " tensors");
  for (auto& i : inputs[0]) {
    check_tensor("reduce_scatter", i);
    TORCH_CHECK(i.numel() == out.numel() && i.scalar_type() == out.scalar_type(),
                "braid: reduce_scatter: an input of ", i.numel(), " ", i.scalar_type(),
                " elements for an output of ", out.numel(), " ", out.scalar_type());
  }
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (out.numel() > 0) {
    at::Tensor flat = at::empty({(int64_t)size_, out.numel()}, out.options());
    std::vector<at::Tensor> ins = inputs[0];
    Call c = reduce_scatter_call("reduce_scatter", flat, out, opts.reduceOp, keep);
    /* the list is copied into one block before the call, in stream order */
    auto fill = [flat, ins]() mutable {
      for (size_t i = 0; i < ins.size(); i++) flat[i].copy_(ins[i].reshape({-1}));
    };
    auto prev = c.pre;
    c.pre = [fill, prev]() mutable {
      fill();
      if (prev) prev();
    };
    calls.push_back(std::move(c));
  } else {
    red_plan("reduce_scatter", out.scalar_type(), opts.reduceOp);
  }
  return submit("reduce_scatter", c10d::OpType::REDUCE_SCATTER, std::move(calls), outputs, keep,
                opts.timeout, &inputs[0]);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor("reduce_scatter_tensor", input);
  check_tensor("reduce_scatter_tensor", output);
  TORCH_CHECK(
      input.numel() == output.numel() * size_ && input.scalar_type() == output.scalar_type(),
      "braid: reduce_scatter_tensor: the input has ", input.numel(), " ", input.scalar_type(),
      " elements, expected ", size_, " x ", output.numel(), " ", output.scalar_type());
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (output.numel() > 0)
    calls.push_back(
        reduce_scatter_call("reduce_scatter_tensor", input, output, opts.reduceOp, keep));
  return submit("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, std::move(calls),
                {output}, keep, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(),
              "braid: reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
              inputs.size(), " inputs");
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  for (size_t i = 0; i < inputs.size(); i++) {
    check_tensor("reduce_scatter_tensor_coalesced", inputs[i]);
    check_tensor("reduce_scatter_tensor_coalesced", outputs[i]);
    TORCH_CHECK(inputs[i].numel() == outputs[i].numel() * size_,
                "braid: reduce_scatter_tensor_coalesced: input ", i, " has ", inputs[i].numel(),
                " elements, expected ", size_, " x ", outputs[i].numel());
    if (outputs[i].numel() > 0)
      calls.push_back(reduce_scatter_call("reduce_scatter_tensor_coalesced", inputs[i], outputs[i],
                                          opts.reduceOp, keep));
  }
  return submit("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, std::move(calls),
                outputs, keep, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplits,
                                                           std::vector<int64_t>& inputSplits,
                                                           const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all_single";
  check_tensor(op, input);
  check_tensor(op, output);
  TORCH_CHECK(input.element_size() == output.element_size(), "braid: ", op, ": input ",
              input.scalar_type(), " and output ", output.scalar_type(), " differ");
  std::vector<Call> calls;
  std::vector<at::Tensor> keep;
  if (outputSplits.empty() && inputSplits.empty()) {
    TORCH_CHECK(input.numel() == output.numel() && input.numel() % size_ == 0, "braid: ", op, ": ",
                input.numel(), " input and ", output.numel(),
                " output elements do not split evenly over ", size_, " ranks");
    if (input.numel() > 0) {
      Call c;
      Block bi = block_of(input, c, true, false);
      Block bo = block_of(output, c, false, true);
      void* src = bi.t.data_ptr();
      void* dst = bo.t.data_ptr();
      size_t n = nbytes(input) / size_;
      c.issue = [src, dst, n](ncclComm_t comm, cudaStream_t s) {
        return ncclAlltoAll(src, dst, n, ncclUint8, comm, s);
      };
      keep.push_back(bi.t), keep.push_back(bo.t);
      calls.push_back(std::move(c));
    }
  } else {
    std::vector<int64_t> ins = splits_of(op, inputSplits, input, size_);
    std::vector<int64_t> outs = splits_of(op, outputSplits, output, size_);
    size_t in_row = input.size(0) ? nbytes(input) / input.size(0) : 0;
    size_t out_row = output.size(0) ? nbytes(output) / output.size(0) : 0;
    Call c;
    Block bi = block_of(input, c, true, false);
    Block bo = block_of(output, c, false, true);
    uint8_t* src = (uint8_t*)bi.t.data_ptr();
    uint8_t* dst = (uint8_t*)bo.t.data_ptr();
    int me = rank_;
    /* each pair in one group; this rank's own rows are copied after it */
    c.issue = [src, dst, ins, outs, in_row, out_row, me](ncclComm_t comm, cudaStream_t s) {
      ncclResult_t res = ncclGroupStart();
      size_t io = 0, oo = 0;
      for (size_t j = 0; j < ins.size() && res == ncclSuccess; j++) {
        size_t ib = ins[j] * in_row, ob = outs[j] * out_row;
        if ((int)j != me && ib > 0) res = ncclSend(src + io, ib, ncclUint8, (int)j, comm, s);
        if ((int)j != me && ob > 0 && (res == ncclSuccess || res == ncclInProgress))
          res = ncclRecv(dst + oo, ob, ncclUint8, (int)j, comm, s);
        if (res == ncclInProgress) res = ncclSuccess;
        io += ib, oo += ob;
      }
      ncclResult_t end = ncclGroupEnd();
      return res == ncclSuccess ? end : res;
    };
    size_t self_in = 0, self_out = 0;
    for (int j = 0; j < me; j++) self_in += ins[j] * in_row, self_out += outs[j] * out_row;
    size_t self_bytes = ins[me] * in_row;
    TORCH_CHECK(self_bytes == (size_t)outs[me] * out_row, "braid: ", op, ": this rank sends ",
                self_bytes, " bytes to itself but expects ", outs[me] * out_row);
    at::Tensor bin = bi.t, bout = bo.t;
    auto prev = c.post;
    c.post = [bin, bout, self_in, self_out, self_bytes, prev]() mutable {
      if (self_bytes)
        std::memcpy((uint8_t*)bout.data_ptr() + self_out, (uint8_t*)bin.data_ptr() + self_in,
                    self_bytes);
      if (prev) prev(); /* then a staged output is copied back */
    };
    keep.push_back(bi.t), keep.push_back(bo.t);
    calls.push_back(std::move(c));
  }
  return submit(op, c10d::OpType::ALLTOALL_BASE, std::move(calls), {output}, keep, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  const char* op = "all_to_all";
  TORCH_CHECK((int)outputs.size() == size_ && (int)inputs.size() == size_, "braid: ", op, " takes ",
              size_, " input and output tensors, got ", inputs.size(), " and ", outputs.size());
  Call c;
  std::vector<at::Tensor> keep;
  std::vector<void*> src(size_), dst(size_);
  std::vector<size_t> sb(size_), rb(size_);
  for (int j = 0; j < size_; j++) {
    check_tensor(op, inputs[j]);
    check_tensor(op, outputs[j]);
    Block bi = block_of(inputs[j], c, true, false);
    Block bo = block_of(outputs[j], c, false, true);
    src[j] = bi.t.data_ptr(), dst[j] = bo.t.data_ptr();
    sb[j] = nbytes(inputs[j]), rb[j] = nbytes(outputs[j]);
    keep.push_back(bi.t), keep.push_back(bo.t);
  }
  int me = rank_;
  TORCH_CHECK(sb[me] == rb[me], "braid: ", op, ": this rank sends ", sb[me],
              " bytes to itself but expects ", rb[me]);
  c.issue = [src, dst, sb, rb, me](ncclComm_t comm, cudaStream_t s) {
    ncclResult_t res = ncclGroupStart();
    for (size_t j = 0; j < src.size() && res == ncclSuccess; j++) {
      if ((int)j == me) continue;
      if (sb[j] > 0) res = ncclSend(src[j], sb[j], ncclUint8, (int)j, comm, s);
      if (rb[j] > 0 && (res == ncclSuccess || res == ncclInProgress))
        res = ncclRecv(dst[j], rb[j], ncclUint8, (int)j, comm, s);
      if (res == ncclInProgress) res = ncclSuccess;
    }
    ncclResult_t end = ncclGroupEnd();
    return res == ncclSuccess ? end : res;
  };
  void *self_src = src[me], *self_dst = dst[me];
  size_t self_bytes = sb[me];
  auto prev = c.post;
  c.post = [self_src, self_dst, self_bytes, prev]() {
    if (self_bytes) std::memcpy(self_dst, self_src, self_bytes);
    if (prev) prev();
  };
  std::vector<Call> calls;
  calls.push_back(std::move(c));
  return submit(op, c10d::OpType::ALLTOALL, std::move(calls), outputs, keep, opts.timeout);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::barrier(const c10d::BarrierOptions& opts) {
  /* an all-reduce of one byte: nobody leaves before everyone came */
  at::Tensor b = at::zeros({1}, at::TensorOptions().dtype(at::kByte));
  Call c;
  void* p = b.data_ptr();
  c.issue = [p](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(p, p, 1, ncclUint8, ncclSum, comm, s);
  };
  std::vector<Call> calls;
  calls.push_back(std::move(c));
  return submit("barrier", c10d::OpType::BARRIER, std::move(calls), {}, {b}, opts.timeout);
}

}  // namespace braid_torch
