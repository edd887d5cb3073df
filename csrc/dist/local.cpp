#include "dist/local.h"

#include <ATen/ops/cat.h>
#include <c10/util/Exception.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "aten/fused.h"
#include "aten/launch.h"
#include "aten/runtime.h"
#include "dist/backend.h"
#include "dist/check.h"
#include "dist/device.h"
#include "lower/types.h"

namespace torchtpu::dist {
namespace {

using c10d::ReduceOp;
using Tensors = std::vector<at::Tensor>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using Clock = std::chrono::steady_clock;

[[noreturn]] void raise(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

// The device program of one collective; an empty kind runs none (barrier).
struct Program {
  std::string kind, reduce;
  DType dt = DType::F32;
  std::vector<int64_t> sizes;
  int64_t dim = 0, dim2 = 0;
};

// What one rank brings: its call (the fingerprint), its input buffer, or a
// problem found on this rank alone (a tensor on another device), which fails
// the collective on every rank instead of leaving the others waiting.
struct Entry {
  Call call;
  pjrt::BufferPtr input;
  std::string problem;
};

struct Round {
  std::vector<std::optional<Entry>> in;
  int arrived = 0, taken = 0;
  bool done = false;
  // A failure: each rank formats the report from its own side.
  enum { None, Disagree, Missing, Problem } failed = None;
  std::vector<std::string> lines;  // per rank: "#seq description" (or why it is absent)
  std::string error;
  std::vector<pjrt::BufferPtr> out;
};

class Rendezvous {
 public:
  explicit Rendezvous(int size) : size_(size), left_(size) {}
  int size() const { return size_; }

  // Blocks until every rank brought collective `seq`; returns this rank's output.
  pjrt::BufferPtr meet(uint64_t seq, int rank, Entry entry, const Program& prog,
                       std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!broken_.empty())
      raise("tpu_local: this group stopped at an earlier failure; collective #" +
            std::to_string(seq) + " on rank " + std::to_string(rank) + " is not run:\n" + broken_);
    Round& r = rounds_[seq];
    if (r.in.empty()) r.in.resize(size_);
    r.in[rank] = std::move(entry);
    r.arrived++;
    if (r.arrived == size_) {
      settle(r, seq, prog);
      cv_.notify_all();
    } else if (absent_left(r, seq)) {
      cv_.notify_all();
    } else {
      auto deadline = Clock::now() + timeout;
      bool ready = cv_.wait_until(lock, deadline, [&] { return r.done || r.failed; });
      if (!ready) {
        missing(r, seq, "timed out waiting for the other ranks");
        cv_.notify_all();
      }
    }
    r.taken++;
    if (r.failed) {
      std::string msg = report(r, seq, rank, timeout);
      if (broken_.empty()) broken_ = msg;
      raise(msg);
    }
    pjrt::BufferPtr out = r.out.empty() ? nullptr : r.out[rank];
    if (r.taken == size_) rounds_.erase(seq);
    return out;
  }

  void leave(int rank, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    left_[rank] = why.empty() ? "left" : why;
    for (auto& [seq, r] : rounds_)
      if (!r.done && !r.failed) absent_left(r, seq);
    cv_.notify_all();
  }

 private:
  // Every rank is here: agree, then launch once for all.
  void settle(Round& r, uint64_t seq, const Program& prog) {
    for (int k = 0; k < size_; ++k) {
      r.lines.push_back("#" + std::to_string(seq) + " " + r.in[k]->call.describe());
      if (!r.in[k]->problem.empty()) {
        r.failed = Round::Problem;
        r.error += "\n  rank " + std::to_string(k) + ": " + r.in[k]->problem;
      }
    }
    if (r.failed) return;
    const uint64_t h = r.in[0]->call.hash();
    for (int k = 1; k < size_; ++k)
      if (r.in[k]->call.hash() != h) r.failed = Round::Disagree;
    if (r.failed) return;
    try {
      r.out = launch(r, prog);
    } catch (const std::exception& e) {
      r.failed = Round::Problem;
      r.error = std::string("\n  the device program failed: ") + e.what();
      return;
    }
    r.done = true;
    last_agreed_ = seq;
    last_call_ = r.in[0]->call.describe(true);
  }

  std::vector<pjrt::BufferPtr> launch(Round& r, const Program& prog) {
    if (prog.kind.empty()) return {};
    ReplicatedProgram p = replicated_program(prog.kind, prog.dt, prog.sizes, prog.reduce, prog.dim,
                                             prog.dim2, {}, size_);
    std::vector<std::vector<pjrt::Buffer*>> args(size_);
    for (int k = 0; k < size_; ++k) args[k].push_back(r.in[k]->input.get());
    auto outs = run_replicated(*p.exe, args);
    std::vector<pjrt::BufferPtr> mine;
    for (auto& o : outs) mine.push_back(o.at(0));
    return mine;
  }

  // A rank that left the group and is absent from round `seq` fails it now.
  bool absent_left(Round& r, uint64_t seq) {
    for (int k = 0; k < size_; ++k)
      if (!left_[k].empty() && !r.in[k]) {
        missing(r, seq, "rank " + std::to_string(k) + " left the group (" + left_[k] + ")");
        return true;
      }
    return false;
  }

  void missing(Round& r, uint64_t seq, const std::string& why) {
    r.failed = Round::Missing;
    r.error = why;
    r.lines.assign(size_, "");
    for (int k = 0; k < size_; ++k) {
      if (r.in[k])
        r.lines[k] = "#" + std::to_string(seq) + " " + r.in[k]->call.describe();
      else if (!left_[k].empty())
        r.lines[k] =
            "left the group before collective #" + std::to_string(seq) + " (" + left_[k] + ")";
    }
  }

  std::string report(const Round& r, uint64_t seq, int rank, std::chrono::milliseconds timeout) {
    if (r.failed == Round::Disagree)
      return disagreement_report("tpu_local", seq, rank, size_, r.lines);
    if (r.failed == Round::Missing)
      return failure_report("tpu_local", seq, rank, size_, timeout, r.error, r.lines, true,
                            last_agreed_, last_call_);
    std::string s = "tpu_local: collective #" + std::to_string(seq) + " failed on rank " +
                    std::to_string(rank) + " of " + std::to_string(size_) + ":" + r.error;
    for (int k = 0; k < size_; ++k) s += "\n  rank " + std::to_string(k) + " ran " + r.lines[k];
    return s;
  }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Round> rounds_;
  std::vector<std::string> left_;
  std::string broken_;  // the first failure: the group runs nothing after it
  uint64_t last_agreed_ = 0;
  std::string last_call_;
};

std::shared_ptr<Rendezvous> rendezvous(const std::string& session, int size) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Rendezvous>> all;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = all.begin(); it != all.end();)
    it = it->second.expired() ? all.erase(it) : std::next(it);
  if (auto p = all[session].lock()) {
    TORCH_CHECK_VALUE(p->size() == size, "tpu_local: group '", session, "' has ", p->size(),
                      " ranks, a rank joined with world_size ", size);
    return p;
  }
  auto p = std::make_shared<Rendezvous>(size);
  all[session] = p;
  return p;
}

// The flat device buffer of `t` in its own dtype (a contiguous copy when `t`
// is a view), materialized (Fused Eager records the copy).
pjrt::BufferPtr input_buffer(const at::Tensor& t) {
  const DType dt = lower::to_dtype(t.scalar_type());
  at::Tensor c = t.contiguous();
  const auto* st = &aten::device_storage(c.storage());
  if (c.storage_offset() != 0 || st->dtype != dt ||
      int64_t(st->nbytes) != c.numel() * c.element_size())
    c = c.clone();
  aten::fused_flush("collective");
  st = &aten::device_storage(c.storage());
  if (st->error) TORCH_CHECK(false, *st->error);
  if (!st->buffer) return aten::zeros_buffer(dt, c.numel(), int(t.device().index()));
  return st->buffer;
}

// `dst` takes the value of `buf` (same element count and dtype): the storage
// swaps to the new buffer when `dst` covers all of it, else a device copy.
void assign(at::Tensor& dst, const pjrt::BufferPtr& buf) {
  auto& st = aten::device_storage(dst.storage());
  if (dst.is_contiguous() && dst.storage_offset() == 0 &&
      int64_t(st.nbytes) == dst.numel() * dst.element_size() && !st.pending &&
      !aten::fused_holds(st)) {
    st.buffer = buf;
    st.dtype = lower::to_dtype(dst.scalar_type());
    if (!dst.is_inference()) dst.unsafeGetTensorImpl()->bump_version();
    return;
  }
  dst.copy_(aten::wrap_buffer(buf, dst.sizes(), dst.scalar_type(), dst.device().index()));
}

const char* kSupported =
    "all_reduce (SUM, AVG, PRODUCT, MIN, MAX; BAND, BOR, BXOR on integers), all_gather, "
    "all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, broadcast, "
    "all_to_all_single (even splits) and barrier";

class TpuLocal final : public c10d::Backend {
 public:
  TpuLocal(std::shared_ptr<Rendezvous> rv, int rank, int size, std::chrono::milliseconds timeout)
      : Backend(rank, size), rv_(std::move(rv)), timeout_(timeout) {}

  const std::string getBackendName() const override { return "tpu_local"; }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void leave(const std::string& why) { rv_->leave(rank_, why); }

  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    const char* kind = "all_reduce";
    one_tensor(kind, tensors.size());
    at::Tensor& t = tensors[0];
    std::string red = reduce_of(kind, opts.reduceOp, t);
    return collective(kind, reduce_name(opts.reduceOp), {t}, {t},
                      program(kind, red, t, {t.numel()}), [&](const pjrt::BufferPtr& out) {
                        assign(t, out);
                        average(opts.reduceOp, t);
                        return Tensors{t};
                      });
  }

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override {
    one_tensor("broadcast", tensors.size());
    at::Tensor& t = tensors[0];
    const int root = int(opts.rootRank);
    return collective("broadcast", "root " + std::to_string(root), {t}, {t},
                      program("all_gather", "", t, {1, t.numel()}),
                      [&](const pjrt::BufferPtr& out) {
                        if (rank_ != root) copy_row(t, out, root);
                        return Tensors{t};
                      });
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions&) override {
    const char* kind = "all_gather_into_tensor";
    return collective(
        kind, "", {input}, {input, output}, program("all_gather", "", input, {1, input.numel()}),
        [&](const pjrt::BufferPtr& out) {
          assign(output, out);
          return Tensors{output};
        },
        numel_check(kind, output, input.numel() * size_));
  }

  WorkPtr allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions&) override {
    const char* kind = "all_gather";
    one_tensor(kind, inputs.size());
    one_tensor(kind, outputs.size());
    at::Tensor& input = inputs[0];
    Tensors& outs = outputs[0];
    std::string problem;
    if (int(outs.size()) != size_)
      problem = c10::str(kind, ": ", outs.size(), " output tensors for ", size_, " ranks");
    for (auto& o : outs)
      if (problem.empty()) problem = numel_check(kind, o, input.numel());
    Tensors checked = outs;
    checked.push_back(input);
    return collective(
        kind, "", {input}, checked, program("all_gather", "", input, {1, input.numel()}),
        [&](const pjrt::BufferPtr& out) {
          for (int k = 0; k < size_; ++k) copy_row(outs[k], out, k);
          return outs;
        },
        problem);
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override {
    const char* kind = "reduce_scatter_tensor";
    std::string red = reduce_of(kind, opts.reduceOp, input);
    return collective(
        kind, reduce_name(opts.reduceOp), {input}, {input, output},
        program("reduce_scatter", red, input, {size_, output.numel()}),
        [&](const pjrt::BufferPtr& out) {
          assign(output, out);
          average(opts.reduceOp, output);
          return Tensors{output};
        },
        numel_check(kind, input, output.numel() * size_));
  }

  WorkPtr reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    const char* kind = "reduce_scatter";
    one_tensor(kind, outputs.size());
    one_tensor(kind, inputs.size());
    at::Tensor& output = outputs[0];
    std::string problem;
    if (int(inputs[0].size()) != size_)
      problem = c10::str(kind, ": ", inputs[0].size(), " input tensors for ", size_, " ranks");
    for (auto& i : inputs[0])
      if (problem.empty()) problem = numel_check(kind, i, output.numel());
    std::string red = reduce_of(kind, opts.reduceOp, output);
    Tensors checked = inputs[0];
    checked.push_back(output);
    at::Tensor flat;
    if (problem.empty()) {
      Tensors pieces;
      for (auto& i : inputs[0]) pieces.push_back(i.reshape({-1}));
      flat = at::cat(pieces);
    }
    return collective(
        kind, reduce_name(opts.reduceOp), inputs[0], checked,
        program("reduce_scatter", red, output, {size_, output.numel()}),
        [&](const pjrt::BufferPtr& out) {
          assign(output, out);
          average(opts.reduceOp, output);
          return Tensors{output};
        },
        problem, flat);
  }

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& out_splits,
                        std::vector<int64_t>& in_splits, const c10d::AllToAllOptions&) override {
    const char* kind = "all_to_all_single";
    const int64_t rows = input.dim() ? input.size(0) : 0;
    auto even = [&](const std::vector<int64_t>& s) {
      for (int64_t v : s)
        if (v * size_ != rows) return false;
      return true;
    };
    // Split sizes may differ between ranks: a rank with uneven ones fails them all.
    std::string problem;
    if (!even(in_splits) || !even(out_splits))
      problem = c10::str(kind,
                         " with uneven split sizes is not supported between thread ranks (only "
                         "even splits); run the ranks as processes with tpu_dist for it");
    if (problem.empty()) problem = numel_check(kind, output, input.numel());
    if (problem.empty() && rows % size_ != 0)
      problem = c10::str(kind, ": ", rows, " rows do not split evenly over ", size_, " ranks");
    return collective(
        kind, "", {input}, {input, output},
        program("all_to_all", "", input, {size_, input.numel() / size_}),
        [&](const pjrt::BufferPtr& out) {
          assign(output, out);
          return Tensors{output};
        },
        problem);
  }

  WorkPtr barrier(const c10d::BarrierOptions&) override {
    // Work queued before the barrier finishes first, as on CUDA.
    aten::synchronize();
    return collective("barrier", "", {}, {}, Program{},
                      [](const pjrt::BufferPtr&) { return Tensors{}; });
  }

  // Everything else says so at once on every rank (they all call it).
  WorkPtr reduce(Tensors&, const c10d::ReduceOptions&) override { unsupported("reduce"); }
  WorkPtr gather(std::vector<Tensors>&, Tensors&, const c10d::GatherOptions&) override {
    unsupported("gather");
  }
  WorkPtr scatter(Tensors&, std::vector<Tensors>&, const c10d::ScatterOptions&) override {
    unsupported("scatter");
  }
  WorkPtr alltoall(Tensors&, Tensors&, const c10d::AllToAllOptions&) override {
    unsupported("all_to_all (lists)");
  }
  WorkPtr allreduce_coalesced(Tensors&, const c10d::AllreduceCoalescedOptions&) override {
    unsupported("all_reduce_coalesced");
  }
  WorkPtr allgather_coalesced(std::vector<Tensors>&, Tensors&,
                              const c10d::AllgatherOptions&) override {
    unsupported("all_gather_coalesced");
  }
  WorkPtr allgather_into_tensor_coalesced(Tensors&, Tensors&,
                                          const c10d::AllgatherOptions&) override {
    unsupported("all_gather_into_tensor_coalesced");
  }
  WorkPtr reduce_scatter_tensor_coalesced(Tensors&, Tensors&,
                                          const c10d::ReduceScatterOptions&) override {
    unsupported("reduce_scatter_tensor_coalesced");
  }
  WorkPtr send(Tensors&, int, int) override { unsupported("send"); }
  WorkPtr recv(Tensors&, int, int) override { unsupported("recv"); }
  WorkPtr recvAnysource(Tensors&, int) override { unsupported("recv"); }

 private:
  // Cut the recorded Fused graph, bring this rank's input, meet the other
  // ranks (agreement, then one launch), take this rank's output, count.
  template <class Finish>
  WorkPtr collective(const char* kind, std::string detail, const Tensors& agreed,
                     const Tensors& local, const Program& prog, Finish finish,
                     std::string problem = "", at::Tensor input = {}) {
    const uint64_t seq = ++seq_;
    auto start = Clock::now();
    aten::fused_flush("collective");
    Entry e{Call{kind, std::move(detail), agreed, ""}, nullptr, std::move(problem)};
    if (auto* where = aten::caller_location()) e.call.where = *where;
    for (auto& t : local)
      if (e.problem.empty()) e.problem = device_check(t);
    if (!input.defined() && !agreed.empty()) input = agreed[0];
    if (e.problem.empty() && !prog.kind.empty()) {
      try {
        e.input = input_buffer(input);
      } catch (const std::exception& ex) {
        e.problem = ex.what();
      }
    }
    int64_t bytes = 0;
    for (auto& t : agreed) bytes += t.numel() * t.element_size();
    pjrt::BufferPtr out = rv_->meet(seq, rank_, std::move(e), prog, timeout_);
    Tensors outputs = finish(out);
    std::chrono::duration<double> took = Clock::now() - start;
    count_collective(kind, bytes, 0, took.count());
    return completed_work(outputs);
  }

  Program program(const char* kind, const std::string& red, const at::Tensor& t,
                  std::vector<int64_t> sizes) const {
    return Program{kind, red, lower::to_dtype(t.scalar_type()), std::move(sizes), 0, 0};
  }

  std::string device_check(const at::Tensor& t) const {
    if (t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == rank_) return "";
    return c10::str("a ", t.scalar_type(), t.sizes(), " tensor on ", t.device(), "; rank ", rank_,
                    " of a thread group runs on tpu:", rank_,
                    " (torch.tpu.set_device(rank) and tensors made there)");
  }

  // The device reduce op, or an error naming the op and what to do.
  std::string reduce_of(const char* kind, const ReduceOp& op, const at::Tensor& t) const {
    const bool integral =
        !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type());
    switch (op.op_) {
      case ReduceOp::SUM:
      case ReduceOp::AVG: return "sum";
      case ReduceOp::PRODUCT: return "prod";
      case ReduceOp::MIN: return "min";
      case ReduceOp::MAX: return "max";
      case ReduceOp::BAND:
      case ReduceOp::BOR:
      case ReduceOp::BXOR:
        if (integral)
          return op.op_ == ReduceOp::BAND ? "band" : op.op_ == ReduceOp::BOR ? "bor" : "bxor";
        break;
      default: break;
    }
    raise(c10::str("tpu_local: ", kind, " with ", reduce_name(op), " on ", t.scalar_type(),
                   " is not supported between thread ranks; run the ranks as processes with "
                   "tpu_dist for it"));
  }

  // AVG is SUM then a division on the device (truncating for integers, as NCCL).
  void average(const ReduceOp& op, at::Tensor& t) const {
    if (op.op_ != ReduceOp::AVG) return;
    if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()))
      t.div_(size_);
    else
      t.div_(size_, "trunc");
  }

  // Row `k` of a gathered [size, numel] buffer into `dst` (a device copy).
  void copy_row(at::Tensor& dst, const pjrt::BufferPtr& buf, int k) const {
    at::Tensor all = aten::wrap_buffer(buf, {size_, dst.numel()}, dst.scalar_type(), rank_);
    dst.copy_(all.select(0, k).view(dst.sizes()));
  }

  static std::string numel_check(const char* kind, const at::Tensor& t, int64_t want) {
    if (t.numel() == want) return "";
    return c10::str(kind, ": a ", t.scalar_type(), t.sizes(), " tensor where ", want,
                    " elements are needed");
  }

  static void one_tensor(const char* kind, size_t n) {
    if (n != 1)
      raise(c10::str("tpu_local: ", kind, " takes one tensor per rank, got ", n,
                     " (each thread rank has one device)"));
  }

  [[noreturn]] static void unsupported(const char* kind) {
    raise(c10::str("tpu_local: ", kind,
                   " is not supported between thread ranks (supported: ", kSupported,
                   "); run the ranks as processes with the tpu_dist backend "
                   "(torchrun) for it"));
  }

  std::shared_ptr<Rendezvous> rv_;
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_local_backend(const std::string& session, int rank, int size,
                                                     std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "tpu_local: rank ", rank,
                    " of world_size ", size);
  TORCH_CHECK_VALUE(size <= aten::device_count(), "tpu_local: world_size ", size, " but ",
                    aten::device_count(),
                    " tpu devices in this process (set TORCHTPU_NUM_DEVICES before importing "
                    "torchtpu)");
  return c10::make_intrusive<TpuLocal>(rendezvous(session, size), rank, size, timeout);
}

bool local_rank_left(const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& why) {
  auto* local = dynamic_cast<TpuLocal*>(backend.get());
  if (!local) return false;
  local->leave(why);
  return true;
}

}  // namespace torchtpu::dist
