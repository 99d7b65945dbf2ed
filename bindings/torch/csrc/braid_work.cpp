/*
 * Works, the communicator's watchdog, and the host functions that run on
 * the stream around each unit of calls: the staging copies, then the
 * completion of its works (their futures completed off the stream's thread).
 */
#include <ATen/Parallel.h>

#include <thread>
#include <c10/util/Exception.h>

#include "braid_backend.hpp"

namespace braid_torch {

std::exception_ptr make_error(const std::string& msg) {
  try {
    C10_THROW_ERROR(DistBackendError, msg);
  } catch (...) {
    return std::current_exception();
  }
}

/* ---------------------------------------------------------------- Comm */

void Comm::abort(const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (aborted) return;
    aborted = true;
    reason = why;
  }
  cv.notify_all();
  /* not while an op is being put on the stream with this handle; a call
   * running inline is woken by the revoke, and its thread aborts the comm
   * when it leaves (BraidBackend::runInline) */
  {
    std::lock_guard<std::mutex> g(issue_mu);
    if (comm != nullptr && inline_users > 0) {
      ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT);
    } else {
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
    }
  }
  failDeferred(why);
}

/* A timeout's message waits this long after the status was taken before the
 * comm goes: the ranks that timed out at the same moment are still asking. */
static constexpr std::chrono::milliseconds kStatusGrace{500};

std::string Comm::verdict(int max_lines) {
  ncclComm_t handle;
  {
    std::lock_guard<std::mutex> g(issue_mu);
    handle = comm;
  }
  char* text = nullptr;
  /* a stale handle is refused by the library's registry, not used */
  if (handle == nullptr || braidCommStatus(handle, braidStatusText, &text) != ncclSuccess)
    return "";
  std::string all(text), out;
  free(text);
  size_t at = 0;
  for (int line = 0; line < max_lines && at < all.size(); line++) {
    size_t end = all.find('\n', at);
    if (end == std::string::npos) end = all.size();
    if (all.compare(at, 8, "  rank  ") == 0) break; /* the table: braid_torch.status() has it */
    size_t from = all.find_first_not_of(' ', at); /* the detail lines' indent */
    out += (line ? "; " : "") + all.substr(from, end - std::min(from, end));
    at = end + 1;
  }
  return out;
}

void Comm::failDeferred(const std::string& why) {
  std::shared_ptr<Unit> unit;
  {
    std::lock_guard<std::mutex> g(mu);
    unit = std::move(deferred); /* never issued */
    deferred.reset();
  }
  if (unit) failUnit(unit, why);
}

void Join::add() {
  std::lock_guard<std::mutex> g(mu);
  left++;
}

void Join::part(std::exception_ptr err) {
  c10::intrusive_ptr<BraidWork> w;
  std::exception_ptr first;
  {
    std::lock_guard<std::mutex> g(mu);
    if (err && !error) error = err;
    if (--left > 0) return;
    w = work;
    first = error;
  }
  if (w) w->complete(first);
}

/* The oldest unit past its deadline aborts the communicator: its peers then
 * fail too (their connections close), so a dead or stuck rank becomes an
 * error on every rank instead of a hang. */
void Comm::watch() {
  std::unique_lock<std::mutex> lk(mu);
  while (!stopping) {
    auto now = std::chrono::steady_clock::now();
    auto next = now + std::chrono::seconds(1);
    Unit* late = nullptr;
    if (!aborted)
      for (Unit* u : pending) {
        if (u->deadline <= now) {
          late = u;
          break;
        }
        next = std::min(next, u->deadline);
      }
    if (deferred && kick_at <= now) { /* nobody waited for it: it runs on the stream */
      lk.unlock();
      bool done = flushDeferred(false);
      lk.lock();
      if (done) continue;
      next = now + std::chrono::microseconds(100); /* run_mu was busy: look again soon */
    }
    if (deferred && kick_at > now) next = std::min(next, kick_at);
    /* units are being deferred: look often, so that they need not wake us */
    if (now - last_deferred < std::chrono::milliseconds(200))
      next = std::min(next, now + std::chrono::milliseconds(2));
    if (late != nullptr) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    now - (late->deadline - late->timeout))
                    .count();
      std::string why = "braid: " + late->what + " on rank " + std::to_string(rank) + " of " +
                        std::to_string(size) + " timed out (not complete after " +
                        std::to_string(ms) + " ms; its timeout is " +
                        std::to_string(late->timeout.count()) +
                        " ms); the communicator was aborted";
      lk.unlock();
      /* who holds it up, from every rank's recorder, before the comm goes;
       * the ranks that timed out with this one are still there to answer */
      std::string seen = verdict(6);
      if (!seen.empty()) {
        why += ". Status: " + seen;
        std::this_thread::sleep_for(kStatusGrace);
      }
      TORCH_WARN(why);
      abort(why);
      lk.lock();
      continue;
    }
    watch_until = next;
    cv.wait_until(lk, next);
    watch_until = std::chrono::steady_clock::time_point::max();
  }
}

Comm::~Comm() {
  {
    std::lock_guard<std::mutex> g(mu);
    stopping = true;
  }
  cv.notify_all();
  if (watchdog.joinable()) watchdog.join();
}

/* ---------------------------------------------------------------- BraidWork */

BraidWork::BraidWork(int rank, c10d::OpType type, const char* name, uint64_t seq,
                     std::vector<at::Tensor> outputs, std::shared_ptr<Comm> comm,
                     const std::vector<at::Tensor>* inputs)
    /* the profiler's event, "braid:all_reduce" with the tensors' shapes, as
     * torch's backends record theirs; it ends when the work completes */
    : c10d::Work(rank, type, ("braid:" + std::string(name)).c_str(),
                 std::optional<std::vector<at::Tensor>>(inputs ? *inputs : outputs)),
      name(name),
      seq_(seq),
      outputs_(std::move(outputs)),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      comm_(comm) {}

/* Polling means the caller goes on meanwhile: a deferred unit must run on
 * its own (braid_queue.cpp). */
bool BraidWork::isCompleted() {
  {
    std::lock_guard<std::mutex> g(mutex_);
    if (completed_) return true;
  }
  if (auto c = comm_.lock()) {
    if (c->isDeferred(this)) c->flushDeferred();
  }
  std::lock_guard<std::mutex> g(mutex_);
  return completed_;
}

bool BraidWork::isSuccess() const {
  std::lock_guard<std::mutex> g(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr BraidWork::exception() const {
  std::lock_guard<std::mutex> g(mutex_);
  return exception_;
}

bool BraidWork::wait(std::chrono::milliseconds timeout) {
  if (auto c = comm_.lock()) c->runIfDeferred(this); /* not issued yet: run it on this thread */
  std::unique_lock<std::mutex> lk(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lk, [&] { return completed_; });
  } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
    std::string msg = "braid: " + name + " (sequence number " + std::to_string(seq_) +
                      ") did not complete within the " + std::to_string(timeout.count()) +
                      " ms given to wait()";
    lk.unlock();
    std::rethrow_exception(make_error(msg));
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void BraidWork::synchronize() {}

void BraidWork::abort() {
  if (auto c = comm_.lock()) c->abort("braid: Work.abort() on " + name);
}

/* The future is completed only once someone asked for it: most works are
 * only waited for, and a completion would cost every op a thread's wake-up. */
c10::intrusive_ptr<c10::ivalue::Future> BraidWork::getFuture() {
  if (auto c = comm_.lock()) { /* a future's user goes on: a deferred unit runs on its own */
    if (c->isDeferred(this)) c->flushDeferred();
  }
  bool now;
  {
    std::lock_guard<std::mutex> g(mutex_);
    future_wanted_ = true;
    now = completed_ && !future_set_;
    if (now) future_set_ = true;
  }
  if (now) setFuture(false);
  return future_;
}

void BraidWork::setFuture(bool on_pool) {
  auto fut = future_;
  auto outs = outputs_;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> g(mutex_);
    error = exception_;
  }
  auto set = [fut, outs, error]() {
    if (error)
      fut->setError(error);
    else
      fut->markCompleted(c10::IValue(outs));
  };
  /* A future's callbacks run where it is completed. They may issue more
   * work on this group and wait for it (PowerSGD does), which would never
   * run behind a blocked stream thread: on the stream, complete it on
   * torch's pool. */
  if (on_pool)
    at::launch(set);
  else
    set();
}

std::vector<at::Tensor> BraidWork::result() {
  return outputs_;
}

int BraidWork::sourceRank() const {
  std::lock_guard<std::mutex> g(mutex_);
  TORCH_CHECK(completed_ && source_ >= 0,
              "braid: sourceRank() is known once a receive from any source completed");
  return source_;
}

uint64_t BraidWork::getSequencenumber() const {
  return seq_;
}

void BraidWork::complete(std::exception_ptr error) {
  bool fut;
  {
    std::lock_guard<std::mutex> g(mutex_);
    completed_ = true;
    exception_ = error;
    if (recordFunctionEndCallback_) {
      recordFunctionEndCallback_();
      recordFunctionEndCallback_ = nullptr;
    }
    fut = future_wanted_ && !future_set_;
    if (fut) future_set_ = true;
  }
  cv_.notify_all();
  if (fut) setFuture(true);
}

/* ---------------------------------------------------------------- host functions */

/* Before the unit's calls: copies into staging buffers. */
void unit_pre(void* p, ncclResult_t status) {
  std::unique_ptr<std::shared_ptr<Unit>> hold(static_cast<std::shared_ptr<Unit>*>(p));
  Unit& u = **hold;
  if (status != ncclSuccess) return;
  try {
    for (auto& f : u.pre) f();
  } catch (...) {
    u.pre_error = std::current_exception();
  }
}

/* After them: copies out on success, then every work of the unit completes
 * with the outcome. */
void unit_done(void* p, ncclResult_t status) {
  std::unique_ptr<std::shared_ptr<Unit>> hold(static_cast<std::shared_ptr<Unit>*>(p));
  Unit& u = **hold;
  std::exception_ptr err = u.pre_error;
  if (status != ncclSuccess && !err) {
    std::string reason;
    {
      std::lock_guard<std::mutex> g(u.comm->mu);
      reason = u.comm->reason;
    }
    std::string msg = "braid: " + u.what + " failed on rank " + std::to_string(u.comm->rank) +
                      ": " + ncclGetErrorString(status);
    const char* last = ncclGetLastError(nullptr);
    if (last != nullptr && *last) msg += " (" + std::string(last) + ")";
    if (!reason.empty()) msg = reason + "; " + msg;
    err = make_error(msg);
  }
  if (!err) try {
      for (auto& f : u.post) f();
    } catch (...) {
      err = std::current_exception();
    }
  {
    std::lock_guard<std::mutex> g(u.comm->mu);
    if (u.listed) u.comm->pending.erase(u.pos);
    u.listed = false;
  }
  for (auto& w : u.works) w->complete(err);
  if (u.join) u.join->part(err);
}

}  // namespace braid_torch
