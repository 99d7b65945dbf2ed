/*
 * The process group of backend "braid": its communicator's set-up, how its
 * ops' calls are submitted (one unit each, or a coalesced batch), its
 * sends and receives, status and split. The collectives are
 * braid_collectives.cpp, a reduction's plan braid_tables.cpp.
 */
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "braid_ops.hpp"

namespace braid_torch {

/* ---------------------------------------------------------------- checks */

[[noreturn]] void refuse(const std::string& op, ncclResult_t res) {
  const char* last = ncclGetLastError(nullptr);
  TORCH_CHECK(false, "braid: ", op, " was refused by Braid: ", ncclGetErrorString(res),
              (last && *last) ? std::string(" (") + last + ")" : std::string());
}

void check_tensor(const char* op, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "braid: ", op, " takes CPU tensors, got one on ", t.device(),
              " (route device tensors to another backend: \"cpu:braid,cuda:nccl\")");
  TORCH_CHECK(t.layout() == at::kStrided, "braid: ", op,
              " does not support sparse or other non-strided tensors");
}

at::Tensor& single(const char* op, std::vector<at::Tensor>& ts) {
  TORCH_CHECK(ts.size() == 1, "braid: ", op, " takes one tensor per process, got ", ts.size());
  check_tensor(op, ts[0]);
  return ts[0];
}

size_t nbytes(const at::Tensor& t) {
  return (size_t)t.numel() * t.element_size();
}

/* ---------------------------------------------------------------- set-up */

static void wait_ready(ncclComm_t comm, ncclResult_t res, Ms timeout, const std::string& what) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (res == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm);
      C10_THROW_ERROR(DistBackendError,
                      "braid: " + what + " did not complete within the process group's timeout (" +
                          std::to_string(timeout.count()) +
                          " ms): a rank did not join, or cannot be reached");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (ncclCommGetAsyncError(comm, &res) != ncclSuccess) break;
  }
  if (res != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    if (comm != nullptr) ncclCommAbort(comm);
    C10_THROW_ERROR(DistBackendError, "braid: " + what + " failed: " + ncclGetErrorString(res) +
                                          ((last && *last) ? std::string(" (") + last + ")" : ""));
  }
}

static ncclConfig_t nonblocking_config() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0; /* so that init and split honour the process group's timeout */
  return cfg;
}

BraidBackend::BraidBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                           Ms timeout)
    : c10d::Backend(rank, size), store_(store) {
  auto comm = std::make_shared<Comm>();
  comm->rank = rank;
  comm->size = size;
  comm->timeout = timeout;
  /* rank 0 makes the id; the store hands it to the others */
  ncclUniqueId id;
  const std::string key = "braid/unique_id";
  if (rank == 0) {
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) refuse("ncclGetUniqueId", res);
    store->set(key, std::vector<uint8_t>((uint8_t*)&id, (uint8_t*)&id + sizeof(id)));
  } else {
    std::vector<uint8_t> v = store->get(key);
    TORCH_CHECK(v.size() == sizeof(id), "braid: the store's unique id has ", v.size(),
                " bytes, expected ", sizeof(id));
    std::memcpy(&id, v.data(), sizeof(id));
  }
  ncclConfig_t cfg = nonblocking_config();
  ncclResult_t res = ncclCommInitRankConfig(&comm->comm, size, id, rank, &cfg);
  wait_ready(comm->comm, res, timeout,
             "the communicator's init (rank " + std::to_string(rank) + " of " +
                 std::to_string(size) + ")");
  start(comm);
}

BraidBackend::BraidBackend(std::shared_ptr<Comm> comm, Ms timeout,
                           c10::intrusive_ptr<c10d::Store> store)
    : c10d::Backend(comm->rank, comm->size), store_(std::move(store)) {
  comm->timeout = timeout;
  start(comm);
}

void BraidBackend::start(std::shared_ptr<Comm> comm) {
  /* made non-blocking so that its init kept the group's timeout; its calls
   * on a NULL stream (runInline's) block */
  ncclResult_t res = braidCommSetBlocking(comm->comm, 1);
  if (res != ncclSuccess) {
    ncclCommAbort(comm->comm);
    comm->comm = nullptr;
    refuse("braidCommSetBlocking", res);
  }
  const char* inl = std::getenv("BRAID_TORCH_INLINE");
  comm->inline_on = inl == nullptr || std::strcmp(inl, "0") != 0;
  res = braidStreamCreate(&comm->stream);
  if (res != ncclSuccess) {
    ncclCommAbort(comm->comm);
    comm->comm = nullptr;
    refuse("braidStreamCreate", res);
  }
  comm_ = comm;
  Comm* c = comm.get();
  comm->watchdog = std::thread([c]() { c->watch(); });
  options_ = c10::make_intrusive<Options>("braid", comm->timeout);
  init();
}

BraidBackend::~BraidBackend() {
  try {
    shutdown();
  } catch (...) {
  }
}

void BraidBackend::shutdown() {
  if (shut_ || !comm_) return;
  shut_ = true;
  /* the queued work finishes (or fails: the watchdog bounds it) first */
  comm_->flushDeferred();
  if (comm_->stream) braidStreamSynchronize(comm_->stream);
  {
    std::lock_guard<std::mutex> g(comm_->issue_mu);
    bool aborted;
    {
      std::lock_guard<std::mutex> g2(comm_->mu);
      aborted = comm_->aborted;
      comm_->aborted = true;
      if (comm_->reason.empty()) comm_->reason = "braid: the process group was shut down";
    }
    if (comm_->comm) (aborted ? ncclCommAbort : ncclCommDestroy)(comm_->comm);
    comm_->comm = nullptr;
  }
  comm_->failDeferred("braid: the process group was shut down");
  if (comm_->stream) braidStreamDestroy(comm_->stream);
  comm_->stream = nullptr;
}

void BraidBackend::abort() {
  if (comm_) comm_->abort("braid: the process group was aborted");
}

Ms BraidBackend::timeoutOf(Ms t) const {
  return t.count() < 0 ? comm_->timeout : t;
}

/* ---------------------------------------------------------------- issuing */

c10::intrusive_ptr<c10d::Work> BraidBackend::submit(
    const char* name, c10d::OpType type, std::vector<Call> calls, std::vector<at::Tensor> outputs,
    std::vector<at::Tensor> keep, Ms timeout, const std::vector<at::Tensor>* inputs,
    std::vector<c10::intrusive_ptr<BraidWork>> partners) {
  auto work = c10::make_intrusive<BraidWork>(rank_, type, name, ++seq_, outputs, comm_, inputs);
  if (coalescing_) {
    for (auto& c : calls) coal_calls_.push_back(std::move(c));
    coal_outputs_.insert(coal_outputs_.end(), outputs.begin(), outputs.end());
    coal_keep_.insert(coal_keep_.end(), keep.begin(), keep.end());
    coal_works_.insert(coal_works_.end(), partners.begin(), partners.end());
    coal_works_.push_back(work);
    coal_names_ += (coal_names_.empty() ? "" : ", ") + std::string(name);
    return work;
  }
  auto unit = std::make_shared<Unit>();
  unit->comm = comm_;
  unit->works = std::move(partners);
  unit->works.push_back(work);
  unit->keep = std::move(keep);
  unit->keep.insert(unit->keep.end(), outputs.begin(), outputs.end());
  unit->what = std::string(name) + " (sequence number " + std::to_string(seq_) + ")";
  unit->timeout = timeoutOf(timeout);
  issueUnit(unit, calls, calls.size() > 1);
  return work;
}

void BraidBackend::issueUnit(const std::shared_ptr<Unit>& unit, std::vector<Call>& calls,
                             bool grouped) {
  for (auto& c : calls) {
    if (c.pre) unit->pre.push_back(c.pre);
    if (c.post) unit->post.push_back(c.post);
  }
  unit->calls = std::move(calls);
  unit->grouped = grouped;
  comm_->issue(unit);
}

void BraidBackend::startCoalescing() {
  TORCH_CHECK(!coalescing_, "braid: startCoalescing called twice without endCoalescing");
  coalescing_ = true;
}

c10::intrusive_ptr<c10d::Work> BraidBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "braid: endCoalescing without startCoalescing");
  coalescing_ = false;
  auto calls = std::move(coal_calls_);
  auto works = std::move(coal_works_);
  auto outputs = std::move(coal_outputs_);
  auto keep = std::move(coal_keep_);
  std::string names = std::move(coal_names_);
  coal_calls_.clear(), coal_works_.clear(), coal_outputs_.clear(), coal_keep_.clear();
  coal_names_.clear();
  auto work = c10::make_intrusive<BraidWork>(rank_, c10d::OpType::COALESCED, "coalesced", ++seq_,
                                             outputs, comm_);
  std::shared_ptr<Join> join = std::move(coal_join_); /* sends and receives among them */
  coal_join_.reset();
  if (join) join->work = work;
  if (!calls.empty()) {
    auto unit = std::make_shared<Unit>();
    unit->comm = comm_;
    unit->works = std::move(works);
    if (join) {
      unit->join = join;
      join->add();
    } else {
      unit->works.push_back(work);
    }
    unit->keep = std::move(keep);
    unit->keep.insert(unit->keep.end(), outputs.begin(), outputs.end());
    unit->what = "coalesced [" + names + "] (sequence number " + std::to_string(seq_) + ")";
    unit->timeout = comm_->timeout;
    try {
      issueUnit(unit, calls, true);
    } catch (...) {
      if (join) join->part(nullptr);
      throw;
    }
  } else if (!join) {
    work->complete(nullptr); /* nothing in it */
  }
  if (join) join->part(nullptr); /* its own count: done once every part is */
  return work;
}

/* ---------------------------------------------------------------- status */

/* The library's text, owned here; throws with its error. */
static std::string take_text(ncclResult_t res, char* text, const char* what) {
  std::string out = text ? text : "";
  free(text);
  TORCH_CHECK(res == ncclSuccess, "braid: ", what, ": ", ncclGetErrorString(res));
  return out;
}

std::string BraidBackend::status(const std::string& format) const {
  static const std::pair<const char*, braidStatusFormat_t> formats[] = {
      {"text", braidStatusText}, {"json", braidStatusJson}, {"prometheus", braidStatusPrometheus}};
  const braidStatusFormat_t* f = nullptr;
  for (auto& x : formats)
    if (format == x.first) f = &x.second;
  TORCH_CHECK(f, "braid: status: format \"", format, "\" is none of text, json, prometheus");
  ncclComm_t handle = comm_->comm;
  TORCH_CHECK(handle != nullptr, "braid: status: the communicator was aborted: ", comm_->reason);
  char* text = nullptr;
  ncclResult_t res = braidCommStatus(handle, *f, &text);
  return take_text(res, text, "status");
}

std::string BraidBackend::recorder() const {
  ncclComm_t handle = comm_->comm;
  TORCH_CHECK(handle != nullptr, "braid: recorder: the communicator was aborted: ", comm_->reason);
  char* text = nullptr;
  ncclResult_t res = braidCommRecorder(handle, &text);
  return take_text(res, text, "recorder");
}

/* ---------------------------------------------------------------- point to point */

/* Sends and receives go through Braid's tagged lane (braidTaggedSend,
 * braidTaggedRecv): each runs on its own, whatever order the ranks post
 * them in, matched by (peer, tag) in posting order, as gloo's are; not on
 * the stream, where a receive would hold up every later op. The lane's
 * thread completes the work (unit_done). In a batch (coalescing), each
 * goes at once, and the batch's work completes with the last (Join). */
c10::intrusive_ptr<c10d::Work> BraidBackend::p2p(std::vector<at::Tensor>& tensors, int peer,
                                                 int tag, bool sending) {
  /* the profiler's event names, as gloo's: braid:send, braid:recv, braid:recvAnySource */
  const char* op = sending ? "send" : peer < 0 ? "recvAnySource" : "recv";
  at::Tensor& t = single(op, tensors);
  TORCH_CHECK((peer >= 0 || !sending) && peer < size_, "braid: ", op,
              sending ? ": destination " : ": source ", peer, " is not a rank of this group of ",
              size_);
  c10d::OpType type = sending    ? c10d::OpType::SEND
                      : peer < 0 ? c10d::OpType::RECVANYSOURCE
                                 : c10d::OpType::RECV;
  auto work = c10::make_intrusive<BraidWork>(rank_, type, op, ++seq_, tensors, comm_);
  auto unit = std::make_shared<Unit>();
  unit->comm = comm_;
  unit->works.push_back(work);
  std::string whom =
      peer < 0        ? std::string(" from any rank")
      : peer == rank_ ? std::string(sending ? " to self" : " from self")
                      : std::string(sending ? " to rank " : " from rank ") + std::to_string(peer);
  unit->what = std::string(op) + whom + " with tag " + std::to_string(tag) + " (sequence number " +
               std::to_string(seq_) + ")";
  unit->timeout = comm_->timeout;
  Call c;
  Block b = block_of(t, c, sending, !sending);
  if (c.post) unit->post.push_back(c.post);
  if (c.pre) c.pre(); /* a staged send's copy, now: the transfer starts now */
  unit->keep = {b.t, t};
  if (coalescing_) {
    if (!coal_join_) coal_join_ = std::make_shared<Join>();
    unit->join = coal_join_;
    unit->join->add();
  }
  void* p = t.numel() > 0 ? b.t.data_ptr() : nullptr;
  size_t n = nbytes(t);
  Comm& cm = *comm_;
  std::lock_guard<std::mutex> g(cm.issue_mu);
  {
    std::lock_guard<std::mutex> g2(cm.mu);
    if (cm.aborted || cm.comm == nullptr) {
      if (unit->join) unit->join->part(nullptr); /* counted above: no part of it now */
      C10_THROW_ERROR(DistBackendError,
                      "braid: " + unit->what + " cannot run: " +
                          (cm.reason.empty() ? "the communicator is gone" : cm.reason));
    }
    unit->deadline = std::chrono::steady_clock::now() + unit->timeout;
    unit->pos = cm.pending.insert(cm.pending.end(), unit.get());
    unit->listed = true;
  }
  auto* h = new std::shared_ptr<Unit>(unit);
  ncclResult_t res =
      sending ? braidTaggedSend(p, n, ncclUint8, peer, tag, cm.comm, unit_done, h)
      : peer < 0
          ? braidTaggedRecvAny(p, n, ncclUint8, tag, cm.comm, work->sourceSlot(), unit_done, h)
          : braidTaggedRecv(p, n, ncclUint8, peer, tag, cm.comm, unit_done, h);
  if (res != ncclSuccess) {
    delete h;
    {
      std::lock_guard<std::mutex> g2(cm.mu);
      cm.pending.erase(unit->pos);
      unit->listed = false;
    }
    if (unit->join) unit->join->part(nullptr);
    refuse(unit->what, res);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> BraidBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                  int tag) {
  return p2p(tensors, dst, tag, true);
}

c10::intrusive_ptr<c10d::Work> BraidBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                  int tag) {
  return p2p(tensors, src, tag, false);
}

/* From whichever rank sends with the tag first (braidTaggedRecvAny); the
 * work's sourceRank() says which, once complete. */
c10::intrusive_ptr<c10d::Work> BraidBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                           int tag) {
  return p2p(tensors, -1, tag, false);
}

/* ---------------------------------------------------------------- split */

c10::intrusive_ptr<BraidBackend> BraidBackend::splitRanks(const std::vector<int>& ranks, Ms timeout,
                                                          c10::intrusive_ptr<c10d::Store> store) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  auto it = std::find(sorted.begin(), sorted.end(), rank_);
  /* ranks that name the same group pick the same color */
  uint32_t h = 2166136261u;
  for (int r : sorted) h = (h ^ (uint32_t)r) * 16777619u;
  int color = it == sorted.end() ? NCCL_SPLIT_NOCOLOR : (int)(h & 0x3fffffff);
  int key = it == sorted.end() ? 0 : (int)(it - sorted.begin());
  /* the parent's queued work runs first: a split is a call on the parent */
  comm_->flushDeferred();
  braidStreamSynchronize(comm_->stream);
  auto child = std::make_shared<Comm>();
  ncclConfig_t cfg = nonblocking_config();
  ncclResult_t res;
  {
    std::lock_guard<std::mutex> g(comm_->issue_mu);
    TORCH_CHECK(comm_->comm != nullptr, "braid: split: the parent communicator is gone");
    res = ncclCommSplit(comm_->comm, color, key, &child->comm, &cfg);
  }
  splits_++;
  if (color == NCCL_SPLIT_NOCOLOR) {
    if (res == ncclInProgress) {
      /* nothing to wait for on a rank left out */
    } else if (res != ncclSuccess) {
      refuse("split", res);
    }
    return nullptr;
  }
  wait_ready(child->comm, res, timeout,
             "split of ranks [" + std::to_string(sorted.front()) + ".." +
                 std::to_string(sorted.back()) + "]");
  child->rank = key;
  child->size = (int)sorted.size();
  return c10::make_intrusive<BraidBackend>(child, timeout, std::move(store));
}

c10::intrusive_ptr<c10d::Backend> BraidBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                      const std::vector<int>& ranks,
                                                      const c10::intrusive_ptr<Options>& opts) {
  Ms timeout = opts ? opts->timeout : comm_->timeout;
  auto b = splitRanks(ranks, timeout, store);
  if (b && opts) {
    b->options_ = opts;
  }
  return b;
}

}  // namespace braid_torch
