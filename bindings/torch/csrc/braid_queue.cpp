/*
 * How a unit of calls reaches Braid (braid_backend.hpp, Comm): deferred and
 * then run by the thread that waits for it, or put on the process group's
 * host stream. A small all_reduce costs two thread hand-offs on the stream
 * (the stream's thread wakes for it, then wakes the waiter): most of its
 * time through torch (issue 49). Running it on the waiting thread removes
 * both; deferring it until then keeps an op the caller does not wait for
 * asynchronous, as gloo's are, so a program that issues an op and goes on
 * to other communication cannot deadlock on it.
 */
#include <c10/util/Exception.h>

#include "braid_backend.hpp"

namespace braid_torch {

namespace {

/* How long a deferred unit waits for its waiter before the watchdog puts it
 * on the stream: torch waits for a synchronous op within microseconds of
 * issuing it. The watchdog is woken for it only when it would otherwise
 * sleep more than kKickSlack past that; while units are being deferred it
 * looks every kKickSlack (Comm::watch), so an asynchronous op that nobody
 * waits for, polls or asks a future of starts at most that much later, and
 * a stream of synchronous ones costs no wake-up each: a wake-up per op, on
 * two cores shared by two ranks, made a 1 MiB all_reduce 2x slower (the
 * woken thread takes a rank's core in the middle of its collective). */
constexpr std::chrono::microseconds kKickDelay{50};
constexpr std::chrono::microseconds kKickSlack{2000};

bool has_work(const Unit& u, const c10d::Work* w) {
  for (auto& x : u.works)
    if (x.get() == w) return true;
  return false;
}

}  // namespace

void Comm::failUnit(const std::shared_ptr<Unit>& unit, const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (unit->listed) pending.erase(unit->pos);
    unit->listed = false;
  }
  std::exception_ptr err = make_error("braid: " + unit->what + " cannot run: " + why);
  for (auto& w : unit->works) w->complete(err);
  if (unit->join) unit->join->part(err);
}

std::string Comm::toStream(const std::shared_ptr<Unit>& unit) {
  std::lock_guard<std::mutex> g(issue_mu);
  {
    std::lock_guard<std::mutex> g2(mu);
    if (aborted || comm == nullptr)
      return reason.empty() ? std::string("the communicator is gone") : reason;
  }
  auto why = [](ncclResult_t res) {
    const char* last = ncclGetLastError(nullptr);
    return std::string("Braid refused it: ") + ncclGetErrorString(res) +
           ((last && *last) ? std::string(" (") + last + ")" : std::string());
  };
  ncclResult_t res = ncclSuccess;
  if (!unit->pre.empty()) {
    auto* h = new std::shared_ptr<Unit>(unit);
    res = braidStreamLaunchHostFunc(stream, unit_pre, h);
    if (res != ncclSuccess) {
      delete h;
      return why(res);
    }
  }
  if (unit->grouped) res = ncclGroupStart();
  for (auto& c : unit->calls) {
    if (res != ncclSuccess && res != ncclInProgress) break;
    res = c.issue(comm, stream);
  }
  if (unit->grouped) {
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess || res == ncclInProgress) res = end;
  }
  unit->calls.clear();
  if (res != ncclSuccess && res != ncclInProgress) return why(res);
  {
    std::lock_guard<std::mutex> g2(mu);
    if (!unit->listed) {
      unit->deadline = std::chrono::steady_clock::now() + unit->timeout;
      unit->pos = pending.insert(pending.end(), unit.get());
      unit->listed = true;
    }
  }
  /* the watchdog looks at least once a second: no wake-up per op */
  auto* h = new std::shared_ptr<Unit>(unit);
  res = braidStreamLaunchHostFunc(stream, unit_done, h);
  if (res != ncclSuccess) {
    delete h;
    return why(res);
  }
  return "";
}

void Comm::issue(const std::shared_ptr<Unit>& unit) {
  flushDeferred();
  if (inline_on) {
    std::lock_guard<std::mutex> g(mu);
    if (aborted)
      C10_THROW_ERROR(DistBackendError, "braid: " + unit->what + " cannot run: " + reason);
    if (pending.empty()) {
      unit->deadline = std::chrono::steady_clock::now() + unit->timeout;
      unit->pos = pending.insert(pending.end(), unit.get());
      unit->listed = true;
      deferred = unit;
      kick_at = unit->deadline - unit->timeout + kKickDelay;
      last_deferred = kick_at;
      if (watch_until > kick_at + kKickSlack) cv.notify_all();
      return;
    }
  }
  std::lock_guard<std::mutex> run(run_mu); /* after any unit running inline */
  std::string why = toStream(unit);
  if (why.empty()) return;
  {
    std::lock_guard<std::mutex> g(mu);
    if (unit->listed) pending.erase(unit->pos);
    unit->listed = false;
  }
  C10_THROW_ERROR(DistBackendError, "braid: " + unit->what + " cannot run: " + why);
}

bool Comm::flushDeferred(bool wait) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (!deferred) return true;
  }
  /* run_mu is held long only by a unit running inline, and then nothing is
   * deferred (it was alone); the watchdog still never waits for it */
  std::unique_lock<std::mutex> run(run_mu, std::defer_lock);
  if (wait)
    run.lock();
  else if (!run.try_lock())
    return false;
  std::shared_ptr<Unit> unit;
  {
    std::lock_guard<std::mutex> g(mu);
    unit = std::move(deferred);
    deferred.reset();
  }
  if (!unit) return true; /* its waiter took it meanwhile */
  std::string why = toStream(unit);
  if (!why.empty()) failUnit(unit, why);
  return true;
}

bool Comm::isDeferred(const c10d::Work* w) {
  std::lock_guard<std::mutex> g(mu);
  return deferred && has_work(*deferred, w);
}

bool Comm::runIfDeferred(const c10d::Work* w) {
  if (!isDeferred(w)) return false;
  std::lock_guard<std::mutex> run(run_mu);
  std::shared_ptr<Unit> unit;
  {
    std::lock_guard<std::mutex> g(mu);
    if (deferred && has_work(*deferred, w)) unit = std::move(deferred);
    deferred.reset();
  }
  if (!unit) return false;
  runInline(unit);
  return true;
}

/* On this thread, holding run_mu: the comm blocks (braidCommSetBlocking),
 * so a NULL stream runs the calls here. The watchdog bounds it as any unit:
 * its abort revokes the comm, which wakes the call. */
void Comm::runInline(const std::shared_ptr<Unit>& unit) {
  ncclResult_t res = runCalls(unit); /* the comm gone: an error, the reason says why */
  unit_done(new std::shared_ptr<Unit>(unit), res); /* copies out, completes the works */
}

void Comm::runNow(const std::shared_ptr<Unit>& unit) {
  flushDeferred();
  std::lock_guard<std::mutex> run(run_mu);
  {
    std::lock_guard<std::mutex> g(mu);
    if (aborted)
      C10_THROW_ERROR(DistBackendError, "braid: " + unit->what + " cannot run: " + reason);
    unit->deadline = std::chrono::steady_clock::now() + unit->timeout;
    unit->pos = pending.insert(pending.end(), unit.get());
    unit->listed = true;
  }
  ncclResult_t res = runCalls(unit);
  std::string reason_now;
  {
    std::lock_guard<std::mutex> g(mu);
    if (unit->listed) pending.erase(unit->pos);
    unit->listed = false;
    reason_now = reason;
  }
  if (unit->pre_error) std::rethrow_exception(unit->pre_error);
  if (res == ncclSuccess) {
    for (auto& f : unit->post) f();
    return;
  }
  const char* last = ncclGetLastError(nullptr);
  std::string msg = "braid: " + unit->what + " failed on rank " + std::to_string(rank) + ": " +
                    ncclGetErrorString(res);
  if (last != nullptr && *last) msg += " (" + std::string(last) + ")";
  if (!reason_now.empty()) msg = reason_now + "; " + msg;
  C10_THROW_ERROR(DistBackendError, msg);
}

ncclResult_t Comm::runCalls(const std::shared_ptr<Unit>& unit) {
  ncclComm_t handle = nullptr;
  {
    std::lock_guard<std::mutex> g(issue_mu);
    std::lock_guard<std::mutex> g2(mu);
    if (!aborted && comm != nullptr) {
      inline_users++;
      handle = comm;
    }
  }
  if (handle == nullptr) return ncclInvalidUsage; /* the comm is gone: reason says why */
  unit_pre(new std::shared_ptr<Unit>(unit), ncclSuccess);
  ncclResult_t res = unit->pre_error ? ncclInternalError : ncclSuccess;
  if (res == ncclSuccess && unit->grouped) res = ncclGroupStart();
  for (auto& c : unit->calls) {
    if (res != ncclSuccess) break;
    res = c.issue(handle, nullptr);
  }
  if (unit->grouped && !unit->pre_error) {
    ncclResult_t end = ncclGroupEnd();
    if (res == ncclSuccess) res = end;
  }
  unit->calls.clear();
  {
    std::lock_guard<std::mutex> g(issue_mu);
    bool gone;
    {
      std::lock_guard<std::mutex> g2(mu);
      gone = aborted;
    }
    if (--inline_users == 0 && gone && comm != nullptr) { /* revoked meanwhile */
      ncclCommAbort(comm);
      comm = nullptr;
    }
  }
  return res;
}

}  // namespace braid_torch
