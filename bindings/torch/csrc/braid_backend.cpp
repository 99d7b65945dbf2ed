/*
 * The ops of backend "braid": each torch op becomes one or more Braid calls
 * (a group when several), with staging copies where a tensor is not one
 * contiguous block, queued on the process group's host stream.
 */
#include "braid_backend.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace braid_torch {
namespace {

using Ms = std::chrono::milliseconds;

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

/* A tensor's bytes as one block: itself when dense, else a staging copy
 * that `pre` fills (inputs) and/or `post` copies back (outputs). */
struct Block {
  at::Tensor t;
  bool staged = false;
};

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

/* ---- reductions: torch's ReduceOp on a dtype as Braid's type and op ---- */

struct Red {
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  at::ScalarType wide = at::ScalarType::Undefined; /* reduce in this type (int16, uint16) */
  bool premul = false;
  double factor = 1.0;
  int bitwise = -1; /* ReduceOp BAND/BOR/BXOR: all-gathered, folded here */
};

std::string op_name(const c10d::ReduceOp& r) {
  static const char* names[] = {"SUM",  "AVG", "PRODUCT", "MIN",        "MAX",
                                "BAND", "BOR", "BXOR",    "PREMUL_SUM", "UNUSED"};
  return std::string("ReduceOp.") + names[std::min<int>(r.op_, 9)];
}

Red red_plan(const char* op, at::ScalarType st, const c10d::ReduceOp& rop) {
  using R = c10d::ReduceOp;
  Red r;
  bool is_bool = st == at::kBool, is_float = false, is_complex = false;
  switch (st) {
    case at::kChar:
      r.type = ncclInt8;
      break;
    case at::kByte:
      r.type = ncclUint8;
      break;
    case at::kBool:
      r.type = ncclUint8;
      break;
    case at::kInt:
      r.type = ncclInt32;
      break;
    case at::kLong:
      r.type = ncclInt64;
      break;
    case at::kUInt32:
      r.type = ncclUint32;
      break;
    case at::kUInt64:
      r.type = ncclUint64;
      break;
    case at::kShort:
    case at::kUInt16:
      /* no 16-bit integers in NCCL: reduced as int32, whose wrap-around
       * agrees with theirs modulo 2^16 for every op */
      r.type = ncclInt32;
      r.wide = at::kInt;
      break;
    case at::kHalf:
      r.type = ncclFloat16, is_float = true;
      break;
    case at::kBFloat16:
      r.type = ncclBfloat16, is_float = true;
      break;
    case at::kFloat:
      r.type = ncclFloat32, is_float = true;
      break;
    case at::kDouble:
      r.type = ncclFloat64, is_float = true;
      break;
    case at::kFloat8_e4m3fn:
      r.type = ncclFloat8e4m3, is_float = true;
      break;
    case at::kFloat8_e5m2:
      r.type = ncclFloat8e5m2, is_float = true;
      break;
    case at::kComplexFloat:
      r.type = ncclFloat32, is_float = is_complex = true;
      break;
    case at::kComplexDouble:
      r.type = ncclFloat64, is_float = is_complex = true;
      break;
    default:
      TORCH_CHECK(false, "braid: ", op, " cannot reduce ", st,
                  " tensors: Braid reduces int8, uint8, int16, uint16, int32, uint32, int64, "
                  "uint64, bool, float16, bfloat16, float32, float64, float8_e4m3fn and "
                  "float8_e5m2 (it moves any dtype where nothing is reduced)");
  }
  auto no = [&](const char* why) {
    TORCH_CHECK(false, "braid: ", op, " does not support ", op_name(rop), " on ", st,
                " tensors: ", why);
  };
  switch (rop.op_) {
    case R::SUM:
      r.op = is_bool ? ncclMax : ncclSum;
      break; /* a logical or, as NCCL's torch does */
    case R::AVG:
      if (is_bool) no("an average of booleans is not a boolean");
      r.op = ncclAvg;
      break;
    case R::PRODUCT:
      if (is_complex) no("complex products do not reduce element-wise");
      r.op = is_bool ? ncclMin : ncclProd;
      break;
    case R::MIN:
    case R::MAX:
      if (is_complex) no("complex numbers are not ordered");
      r.op = rop.op_ == R::MIN ? ncclMin : ncclMax;
      break;
    case R::BAND:
    case R::BOR:
    case R::BXOR:
      if (is_float) no("bitwise operations need integer or bool tensors");
      if (is_bool && rop.op_ != R::BXOR) {
        r.op = rop.op_ == R::BAND ? ncclMin : ncclMax;
        break;
      }
      /* NCCL has no bitwise reductions: all-gather and fold here */
      r.bitwise = rop.op_;
      break;
    case R::PREMUL_SUM: {
      if (is_bool) no("a scaled sum of booleans is not a boolean");
      auto* s = dynamic_cast<c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK(s != nullptr, "braid: ", op, ": PREMUL_SUM without its factor");
      r.factor = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      r.premul = true;
      r.op = ncclSum;
      break;
    }
    default:
      no("unknown reduction");
  }
  return r;
}

at::ScalarType reduced_type(at::ScalarType st, const Red& r) {
  if (r.wide != at::ScalarType::Undefined) return r.wide;
  if (st == at::kComplexFloat) return at::kFloat;
  if (st == at::kComplexDouble) return at::kDouble;
  return st;
}

/* the number of `r.type` elements in t's bytes */
size_t red_count(const at::Tensor& t, const Red& r) {
  return (t.is_complex() ? 2 : 1) * (size_t)t.numel();
}

/* Run `call` with the op `r` names: a PreMulSum is made for the call and
 * dropped once it is enqueued (NCCL's rule: the enqueued call keeps it). */
ncclResult_t with_op(const Red& r, at::ScalarType st, ncclComm_t comm,
                     const std::function<ncclResult_t(ncclRedOp_t)>& call) {
  if (!r.premul) return call(r.op);
  at::Tensor scalar = at::scalar_tensor(r.factor, at::TensorOptions().dtype(st));
  ncclRedOp_t op;
  ncclResult_t res =
      ncclRedOpCreatePreMulSum(&op, scalar.data_ptr(), r.type, ncclScalarHostImmediate, comm);
  if (res != ncclSuccess) return res;
  res = call(op);
  ncclRedOpDestroy(op, comm);
  return res;
}

/* A reduction's input/output block: widened (int16) or staged (strided). */
Block red_block(const at::Tensor& t, const Red& r, Call& c, bool in, bool out) {
  if (r.wide == at::ScalarType::Undefined) {
    Block b = block_of(t, c, in, out);
    if (b.t.is_complex()) b.t = at::view_as_real(b.t);
    return b;
  }
  at::Tensor w = at::empty(t.sizes(), t.options().dtype(r.wide));
  at::Tensor user = t;
  if (in) add_pre(c, [w, user]() mutable { w.copy_(user); });
  if (out) add_post(c, [w, user]() mutable { user.copy_(w); });
  return {w, true};
}

/* Bitwise and/or/xor over ranks: all-gather every rank's tensor, fold. */
Call bitwise_call(const at::Tensor& t, const Red& r, int nranks, std::vector<at::Tensor>& keep) {
  Call c;
  Block in = block_of(t, c, true, false);
  at::Tensor all = at::empty({(int64_t)nranks, t.numel()}, t.options());
  at::Tensor user = t;
  void* src = in.t.data_ptr();
  void* dst = all.data_ptr();
  size_t n = nbytes(t);
  int which = r.bitwise;
  c.issue = [src, dst, n](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(src, dst, n, ncclUint8, comm, s);
  };
  add_post(c, [all, user, which]() mutable {
    /* the bits, as the signed type of their width: torch before 2.5 has no
     * bitwise kernels for uint16/32/64, and the bits come out the same */
    at::ScalarType st = all.scalar_type();
    at::ScalarType as = st == at::kUInt16   ? at::kShort
                        : st == at::kUInt32 ? at::kInt
                        : st == at::kUInt64 ? at::kLong
                                            : st;
    at::Tensor bits = all.view(as);
    at::Tensor acc = bits[0].clone();
    for (int64_t i = 1; i < bits.size(0); i++) {
      if (which == c10d::ReduceOp::BAND)
        acc.bitwise_and_(bits[i]);
      else if (which == c10d::ReduceOp::BOR)
        acc.bitwise_or_(bits[i]);
      else
        acc.bitwise_xor_(bits[i]);
    }
    user.copy_(acc.view(st).view(user.sizes()));
  });
  keep.push_back(in.t);
  keep.push_back(all);
  return c;
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

}  // namespace

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
