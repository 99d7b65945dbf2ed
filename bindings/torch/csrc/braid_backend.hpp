/*
 * torch.distributed backend "braid": a c10d::Backend whose every byte moves
 * through Braid's public API (nccl.h, braid.h). Each process group owns one
 * Braid communicator and one host stream; an op only enqueues its calls on
 * the stream and returns a BraidWork, which a host function on the stream
 * completes (braidStreamLaunchHostFunc).
 */
#pragma once

#include <braid.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

/* setup.py passes the torch it builds against (the Backend API grows). */
#ifndef BRAID_TORCH_MINOR
#define BRAID_TORCH_MINOR 4
#endif
#define BRAID_TORCH_AT_LEAST(minor) (BRAID_TORCH_MINOR >= (minor))

namespace braid_torch {

struct Unit;
class BraidWork;

/* A batch (coalescing) whose sends and receives run on their own: its work
 * completes with the last of its parts (each transfer, and the unit of its
 * other calls), with the first error. It counts itself as a part until the
 * batch is closed (endCoalescing), so it cannot complete early. */
struct Join {
  std::mutex mu;
  int left = 1;
  std::exception_ptr error;
  c10::intrusive_ptr<BraidWork> work; /* set by endCoalescing */
  void add();
  void part(std::exception_ptr err);
};

/* The communicator, its stream, and what is in flight on them. Shared by
 * the backend and every unit still queued, so the last one frees it.
 *
 * How a unit reaches Braid (braid_queue.cpp): a small one with nothing
 * before it is *deferred*: kept here, not yet issued. If its work is
 * waited for first (a synchronous op: torch waits at once), the waiting
 * thread runs it inline, on a NULL stream of the blocking comm: no thread
 * hand-off. Anything else (a later op, getFuture, polling, or the watchdog
 * after kKickDelay) puts it on the stream first, so an asynchronous op
 * still runs on its own while the caller goes on, as gloo's do. Every
 * other unit goes on the stream at once.
 *
 * Locks, always taken in this order: run_mu (held by a thread running a
 * unit inline, and while a unit is put on the stream: units reach Braid in
 * issue order), issue_mu (the handle `comm`, stream issue), mu (the rest). */
struct Comm {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int rank = 0, size = 0;
  std::chrono::milliseconds timeout;

  std::mutex run_mu;
  std::mutex issue_mu;
  std::mutex mu;
  std::condition_variable cv; /* the watchdog's: abort, stopping, a deferred unit */
  std::list<Unit*> pending;   /* issued and not yet completed, oldest first */
  bool aborted = false;
  std::string reason;                            /* why it was aborted (a timeout names the op) */
  std::shared_ptr<Unit> deferred;                /* not issued yet (at most one: it was alone) */
  std::chrono::steady_clock::time_point kick_at; /* when the watchdog issues it */
  std::chrono::steady_clock::time_point last_deferred; /* the latest unit deferred, its kick_at */
  std::chrono::steady_clock::time_point watch_until =  /* when the watchdog wakes next */
      std::chrono::steady_clock::time_point::max();
  /* threads running a call inline with the handle, outside issue_mu (under
   * issue_mu): while any does, abort revokes the comm (which wakes them and
   * keeps the handle valid) and the last of them aborts it */
  int inline_users = 0;
  bool inline_on = true; /* units are deferred and run by their waiter (BRAID_TORCH_INLINE) */

  std::thread watchdog;
  bool stopping = false;

  ~Comm();
  /* Abort the communicator (idempotent): work in flight fails with `why`. */
  void abort(const std::string& why);
  /* The verdict on the job now (braidCommStatus, its first lines), for a
   * timeout's message; "" when there is none. */
  std::string verdict(int max_lines);
  /* A deferred unit fails with `why` (abort, shutdown). */
  void failDeferred(const std::string& why);
  void watch();

  /* braid_queue.cpp. Issue a unit (its calls in unit->calls): deferred,
   * else on the stream; an earlier deferred unit goes on the stream first.
   * Throws when the communicator is gone. */
  void issue(const std::shared_ptr<Unit>& unit);
  /* The deferred unit, if any, goes on the stream now; without `wait`,
   * false when it would have to wait for another thread to do so. */
  bool flushDeferred(bool wait = true);
  /* If w's unit is the deferred one, run it here and now; true if it ran. */
  bool runIfDeferred(const c10d::Work* w);
  /* Run a unit of no work here and now, after what was issued before it
   * (the direct op, braid_torch.all_reduce_); throws when it failed. */
  void runNow(const std::shared_ptr<Unit>& unit);
  /* Whether w's unit is the deferred one. */
  bool isDeferred(const c10d::Work* w);

 private:
  /* On the stream; "" or why it could not be issued. */
  std::string toStream(const std::shared_ptr<Unit>& unit);
  /* The calls of a unit on this thread, holding run_mu; its outcome. */
  ncclResult_t runCalls(const std::shared_ptr<Unit>& unit);
  void runInline(const std::shared_ptr<Unit>& unit);
  /* Completes a unit that never ran with `why`. */
  void failUnit(const std::shared_ptr<Unit>& unit, const std::string& why);
};

class BraidWork : public c10d::Work {
 public:
  /* inputs: what the profiler's event shows (the outputs when null) */
  BraidWork(int rank, c10d::OpType type, const char* name, uint64_t seq,
            std::vector<at::Tensor> outputs, std::shared_ptr<Comm> comm,
            const std::vector<at::Tensor>* inputs = nullptr);
  ~BraidWork() override = default;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;
  uint64_t getSequencenumber() const override;

  /* Called once, from the stream's host function. */
  void complete(std::exception_ptr error);
  /* A receive from any source: the lane writes the sender's rank here
   * before it completes the work; sourceRank() reads it. */
  int* sourceSlot() { return &source_; }
  int sourceRank() const override;

  const std::string name;

 private:
  const uint64_t seq_;
  int source_ = -1;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool future_wanted_ = false; /* getFuture was called (under mutex_) */
  bool future_set_ = false;    /* someone completes the future (under mutex_) */
  std::weak_ptr<Comm> comm_;
  void setFuture(bool on_pool);
};

/* One Braid call of an op, and what must run around it on the stream. */
struct Call {
  std::function<ncclResult_t(ncclComm_t, cudaStream_t)> issue;
  std::function<void()> pre;  /* before the call (copy into staging) */
  std::function<void()> post; /* after it succeeded (copy out of staging) */
};

/* What the stream's host functions need: the works it completes, the calls'
 * pre/post steps, and every tensor the calls touch, kept alive. */
struct Unit {
  std::shared_ptr<Comm> comm;
  std::vector<c10::intrusive_ptr<BraidWork>> works;
  std::vector<Call> calls; /* until issued */
  bool grouped = false;    /* the calls go in one Braid group */
  std::vector<std::function<void()>> pre, post;
  std::vector<at::Tensor> keep;
  std::string what;
  std::chrono::milliseconds timeout{0};
  std::chrono::steady_clock::time_point deadline;
  std::exception_ptr pre_error;
  bool listed = false;        /* in Comm::pending (at pos) */
  std::shared_ptr<Join> join; /* a batch it is a part of, told when it is done */
  std::list<Unit*>::iterator pos;
};

class BraidBackend : public c10d::Backend {
 public:
  BraidBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
               std::chrono::milliseconds timeout);
  /* A communicator made by ncclCommSplit of a parent's. */
  BraidBackend(std::shared_ptr<Comm> comm, std::chrono::milliseconds timeout,
               c10::intrusive_ptr<c10d::Store> store);
  ~BraidBackend() override;

  const std::string getBackendName() const override { return "braid"; }
  bool supportsSplitting() const override { return true; }
  /* Virtual in the torch versions that have them; no `override`, since 2.4
   * has none of these and later versions add them one by one. */
  bool supportsCoalescing() const { return true; }
  c10::intrusive_ptr<Options> getBackendOptions() { return options_; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts);
  void setTimeout(std::chrono::milliseconds timeout) { comm_->timeout = timeout; }
  /* The collective core of split(): every rank of this group calls it; a
   * rank not in `ranks` gets nullptr. */
  c10::intrusive_ptr<BraidBackend> splitRanks(const std::vector<int>& ranks,
                                              std::chrono::milliseconds timeout,
                                              c10::intrusive_ptr<c10d::Store> store);

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits,
                                               std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  /* gloo's barrier that names the ranks which did not come, through the
   * Store (braid_gloo_ops.cpp) */
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void abort();    /* virtual where torch has it, as above */
  void shutdown(); /* the same */

  /* For tests and tools: the communicator's rank count and handle. */
  ncclComm_t ncclComm() const { return comm_->comm; }

  /* all_reduce of t in place, here and now, with no Work: the torch op
   * braid::all_reduce_ (module.cpp) for callers that wait at once anyway,
   * tensor-parallel inference say, where a Work's cost is most of a small
   * call's. In issue order with the group's other ops. */
  void allReduceNow(at::Tensor& t, const c10d::ReduceOp& op);

  /* For perf/ scripts: `iters` sum all-reduces of t in place, one after
   * the other in one unit, no torch or Python between them (the library's
   * own time, in this process and on this group's comm, for a comparison
   * that runs in the same moment as the torch calls beside it); the
   * seconds per call. */
  double libraryLoop(at::Tensor& t, int64_t iters);

  /* What the job is doing, as braid-status tells it (braid.h: text, json
   * or prometheus), gathered from every rank of the group; and this rank's
   * flight recorder as JSON lines (what BRAID_TRACE_DIR gets). */
  std::string status(const std::string& format) const;
  std::string recorder() const;

 private:
  c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, int tag,
                                     bool sending);
  /* sparse COO all-reduce, gloo's (braid_gloo_ops.cpp) */
  c10::intrusive_ptr<c10d::Work> allreduceSparse(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts);
  std::vector<at::Tensor> root_list(const char* op, int root,
                                    std::vector<std::vector<at::Tensor>>& lists,
                                    const at::Tensor& like, const char* kind, const char* mine);
  c10::intrusive_ptr<c10d::Work> submit(const char* name, c10d::OpType type,
                                        std::vector<Call> calls, std::vector<at::Tensor> outputs,
                                        std::vector<at::Tensor> keep,
                                        std::chrono::milliseconds timeout,
                                        const std::vector<at::Tensor>* inputs = nullptr,
                                        std::vector<c10::intrusive_ptr<BraidWork>> partners = {});
  void issueUnit(const std::shared_ptr<Unit>& unit, std::vector<Call>& calls, bool grouped);
  std::chrono::milliseconds timeoutOf(std::chrono::milliseconds t) const;
  void start(std::shared_ptr<Comm> comm);

  std::shared_ptr<Comm> comm_;
  c10::intrusive_ptr<c10d::Store> store_; /* the group's; null for a split's leftover */
  uint64_t seq_ = 0;
  uint64_t monitored_ = 0; /* monitored barriers so far: their keys in the store */
  bool shut_ = false;
  int splits_ = 0;
  c10::intrusive_ptr<Options> options_;

  /* coalescing: the calls collected since startCoalescing */
  bool coalescing_ = false;
  std::vector<Call> coal_calls_;
  std::vector<at::Tensor> coal_outputs_, coal_keep_;
  std::vector<c10::intrusive_ptr<BraidWork>> coal_works_;
  std::string coal_names_;
  std::shared_ptr<Join> coal_join_; /* made at the batch's first send or receive */
};

/* stream host functions (braid_work.cpp); each takes a new'd shared_ptr<Unit> */
void unit_pre(void* p, ncclResult_t status);
void unit_done(void* p, ncclResult_t status);
std::exception_ptr make_error(const std::string& msg);

}  // namespace braid_torch
