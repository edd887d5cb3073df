#include "dist/backend.h"

#include <ATen/core/ivalue.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <utility>

#include "aten/fused.h"
#include "aten/launch.h"
#include "dist/check.h"

namespace torchtpu::dist {
namespace {

using c10d::ReduceOp;
using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using Tensors = std::vector<at::Tensor>;

bool on_tpu(const at::Tensor& t) { return t.device().type() == c10::DeviceType::PrivateUse1; }

int64_t nbytes(const Tensors& ts) {
  int64_t n = 0;
  for (auto& t : ts) n += t.numel() * t.element_size();
  return n;
}

struct Counters {
  std::mutex mu;
  std::map<std::string, KindCount> by_kind;
};
Counters& counters() {
  static Counters c;
  return c;
}

// Host twins of device tensors: the transport across processes works on
// contiguous host tensors; results are copied back into the device
// storages (through views, so every alias sees them). CPU tensors pass as
// they are.
class Staging {
 public:
  at::Tensor in(const at::Tensor& t) { return twin(t, true, false); }
  at::Tensor out(const at::Tensor& t) { return twin(t, false, true); }
  at::Tensor inout(const at::Tensor& t) { return twin(t, true, true); }
  Tensors in(const Tensors& ts) { return twins(ts, true, false); }
  Tensors out(const Tensors& ts) { return twins(ts, false, true); }
  Tensors inout(const Tensors& ts) { return twins(ts, true, true); }
  std::vector<Tensors> in(const std::vector<Tensors>& lists) {
    return twin_lists(lists, true, false);
  }
  std::vector<Tensors> out(const std::vector<Tensors>& lists) {
    return twin_lists(lists, false, true);
  }
  void write_back() {
    for (auto& [dev, host] : back_) {
      dev.copy_(host);
      bytes_ += host.numel() * host.element_size();
    }
    back_.clear();
  }
  int64_t host_copy_bytes() const { return bytes_; }

 private:
  at::Tensor twin(const at::Tensor& t, bool read, bool write) {
    if (!on_tpu(t)) return t;
    at::Tensor host = at::empty(t.sizes(), t.options().device(c10::kCPU));
    if (read) {
      host.copy_(t);
      bytes_ += host.numel() * host.element_size();
    }
    if (write) back_.emplace_back(t, host);
    return host;
  }
  Tensors twins(const Tensors& ts, bool read, bool write) {
    Tensors out;
    for (auto& t : ts) out.push_back(twin(t, read, write));
    return out;
  }
  std::vector<Tensors> twin_lists(const std::vector<Tensors>& lists, bool read, bool write) {
    std::vector<Tensors> out;
    for (auto& l : lists) out.push_back(twins(l, read, write));
    return out;
  }
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;
  int64_t bytes_ = 0;
};

}  // namespace

std::string reduce_name(const ReduceOp& op) {
  switch (op.op_) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

namespace {

bool integral(const Tensors& ts) {
  return !ts.empty() && !at::isFloatingType(ts[0].scalar_type()) &&
         !at::isComplexType(ts[0].scalar_type());
}

// gloo has no PREMUL_SUM and no integer AVG: the first becomes SUM of the
// (staged, private) inputs times the factor, the second SUM then a
// truncating division, as NCCL does.
ReduceOp host_reduce(const ReduceOp& op, Tensors& staged) {
  if (op.op_ == ReduceOp::PREMUL_SUM) {
    auto* sup = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
    TORCH_CHECK(sup, "tpu_dist: PREMUL_SUM without a factor");
    for (auto& h : staged) {
      if (sup->tensor_factor.defined())
        h.mul_(sup->tensor_factor.to(c10::kCPU));
      else
        h.mul_(sup->double_factor);
    }
    return ReduceOp(ReduceOp::SUM);
  }
  if (op.op_ == ReduceOp::AVG && integral(staged)) return ReduceOp(ReduceOp::SUM);
  return op;
}

void finish_reduce(const ReduceOp& op, Tensors& staged, int size) {
  if (op.op_ == ReduceOp::AVG && integral(staged))
    for (auto& h : staged) h.div_(size, "trunc");
}

// A point-to-point transfer in flight on the host transport: completes (and,
// for a receive, writes the device tensors) when waited on or polled.
class HostWork final : public Work {
 public:
  HostWork(WorkPtr inner, std::function<void()> finish, std::function<std::string()> context,
           Tensors outputs)
      : Work(-1, c10d::OpType::UNKNOWN),
        inner_(std::move(inner)),
        finish_(std::move(finish)),
        context_(std::move(context)),
        outputs_(std::move(outputs)) {}

  bool isCompleted() override {
    if (!inner_->isCompleted()) return false;
    complete();
    return true;
  }
  bool isSuccess() const override { return inner_->isSuccess(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  bool wait(std::chrono::milliseconds timeout) override {
    try {
      inner_->wait(timeout);
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, context_() + e.what());
    }
    complete();
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    wait(kNoTimeout);
    return completed_work(outputs_)->getFuture();
  }

 private:
  void complete() {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_) std::exchange(finish_, nullptr)();
  }
  WorkPtr inner_;
  std::function<void()> finish_;
  std::function<std::string()> context_;
  Tensors outputs_;
  std::mutex mu_;
};

std::string root_detail(int64_t root) { return "root " + std::to_string(root); }

class TpuDist final : public c10d::Backend {
 public:
  TpuDist(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
          c10::intrusive_ptr<c10d::Backend> host, std::chrono::milliseconds timeout, bool detail)
      : Backend(rank, size), host_(host), check_(host, store, rank, size, timeout, detail) {}

  const std::string getBackendName() const override { return "tpu_dist"; }
  bool supportsCoalescing() const override { return true; }
  // The transport is synchronous: coalesced calls run at once.
  void startCoalescing() override { coalescing_.start(); }
  WorkPtr endCoalescing() override { return coalescing_.end(); }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override {
    return collective("broadcast", root_detail(opts.rootRank), tensors, [&](Staging& st) {
      Tensors h;
      for (auto& t : tensors) h.push_back(rank_ == opts.rootRank ? st.in(t) : st.out(t));
      host_->broadcast(h, opts)->wait();
      return tensors;
    });
  }

  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    return collective("all_reduce", reduce_name(opts.reduceOp), tensors, [&](Staging& st) {
      for (auto& t : tensors) reduce_one(st.inout(t), opts.reduceOp);
      return tensors;
    });
  }

  // gloo's own coalesced all-reduce (one flat buffer), so sums associate as
  // on CPU tensors.
  WorkPtr allreduce_coalesced(Tensors& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override {
    return collective("all_reduce_coalesced", reduce_name(opts.reduceOp), tensors,
                      [&](Staging& st) {
                        Tensors hs = st.inout(tensors);
                        auto o = with_reduce(opts, host_reduce(opts.reduceOp, hs));
                        host_->allreduce_coalesced(hs, o)->wait();
                        finish_reduce(opts.reduceOp, hs, size_);
                        return tensors;
                      });
  }

  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override {
    std::string d = reduce_name(opts.reduceOp) + ", " + root_detail(opts.rootRank);
    return collective("reduce", d, tensors, [&](Staging& st) {
      Tensors h;
      // Non-root inputs stay unchanged: gloo may use them as scratch space.
      for (auto& t : tensors)
        h.push_back(rank_ == opts.rootRank ? st.inout(t) : private_copy(st, t));
      host_->reduce(h, with_reduce(opts, host_reduce(opts.reduceOp, h)))->wait();
      if (rank_ == opts.rootRank) finish_reduce(opts.reduceOp, h, size_);
      return tensors;
    });
  }

  WorkPtr allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions& opts) override {
    return collective("all_gather", "", inputs, [&](Staging& st) {
      Tensors hin = st.in(inputs);
      std::vector<Tensors> hout = st.out(outputs);
      host_->allgather(hout, hin, opts)->wait();
      return flatten(outputs);
    });
  }

  WorkPtr allgather_coalesced(std::vector<Tensors>& outputs, Tensors& inputs,
                              const c10d::AllgatherOptions& opts) override {
    return collective("all_gather_coalesced", "", inputs, [&](Staging& st) {
      for (size_t i = 0; i < inputs.size(); ++i) gather_into(st, outputs[i], inputs[i], opts);
      return flatten(outputs);
    });
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions& opts) override {
    Tensors ins{input};
    return collective("all_gather_into_tensor", "", ins, [&](Staging& st) {
      gather_into_tensor(st, output, input, opts);
      return Tensors{output};
    });
  }

  WorkPtr allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::AllgatherOptions& opts) override {
    return collective("all_gather_into_tensor_coalesced", "", inputs, [&](Staging& st) {
      for (size_t i = 0; i < inputs.size(); ++i)
        gather_into_tensor(st, outputs[i], inputs[i], opts);
      return outputs;
    });
  }

  WorkPtr gather(std::vector<Tensors>& outputs, Tensors& inputs,
                 const c10d::GatherOptions& opts) override {
    return collective("gather", root_detail(opts.rootRank), inputs, [&](Staging& st) {
      Tensors hin = st.in(inputs);
      std::vector<Tensors> hout = st.out(outputs);
      host_->gather(hout, hin, opts)->wait();
      return flatten(outputs);
    });
  }

  WorkPtr scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                  const c10d::ScatterOptions& opts) override {
    return collective("scatter", root_detail(opts.rootRank), outputs, [&](Staging& st) {
      Tensors hout = st.out(outputs);
      std::vector<Tensors> hin = st.in(inputs);
      host_->scatter(hout, hin, opts)->wait();
      return outputs;
    });
  }

  WorkPtr reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    return collective("reduce_scatter", reduce_name(opts.reduceOp), outputs, [&](Staging& st) {
      Tensors hout = st.out(outputs);
      std::vector<Tensors> hin(inputs.size());
      Tensors all;
      for (size_t i = 0; i < inputs.size(); ++i)
        for (auto& t : inputs[i]) {
          hin[i].push_back(private_copy(st, t));
          all.push_back(hin[i].back());
        }
      auto o = with_reduce(opts, host_reduce(opts.reduceOp, all));
      host_->reduce_scatter(hout, hin, o)->wait();
      finish_reduce(opts.reduceOp, hout, size_);
      return outputs;
    });
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override {
    Tensors outs{output};
    return collective("reduce_scatter_tensor", reduce_name(opts.reduceOp), outs, [&](Staging& st) {
      scatter_reduced(st, output, input, opts);
      return outs;
    });
  }

  WorkPtr reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    return collective("reduce_scatter_tensor_coalesced", reduce_name(opts.reduceOp), outputs,
                      [&](Staging& st) {
                        for (size_t i = 0; i < outputs.size(); ++i)
                          scatter_reduced(st, outputs[i], inputs[i], opts);
                        return outputs;
                      });
  }

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& out_splits,
                        std::vector<int64_t>& in_splits,
                        const c10d::AllToAllOptions& opts) override {
    // Split sizes may differ between ranks; dtypes and trailing dims may not.
    std::string d =
        std::string(c10::toString(input.scalar_type())) + " rows of " +
        std::to_string(input.dim() ? input.numel() / std::max<int64_t>(1, input.size(0)) : 1);
    Tensors none;
    return collective(
        "all_to_all_single", d, none,
        [&](Staging& st) {
          at::Tensor hi = st.in(input), ho = st.out(output);
          host_->alltoall_base(ho, hi, out_splits, in_splits, opts)->wait();
          return Tensors{output};
        },
        nbytes({input}));
  }

  // List all-to-all as one uneven all_to_all of the flattened pieces.
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions& opts) override {
    std::string d = inputs.empty() ? "" : std::string(c10::toString(inputs[0].scalar_type()));
    Tensors none;
    return collective(
        "all_to_all", d, none,
        [&](Staging& st) {
          Tensors flat;
          std::vector<int64_t> in_splits, out_splits;
          for (auto& t : inputs) {
            flat.push_back(st.in(t).reshape({-1}));
            in_splits.push_back(t.numel());
          }
          int64_t total = 0;
          for (auto& t : outputs) {
            out_splits.push_back(t.numel());
            total += t.numel();
          }
          at::Tensor hi = at::cat(flat);
          at::Tensor ho = at::empty({total}, hi.options());
          host_->alltoall_base(ho, hi, out_splits, in_splits, opts)->wait();
          int64_t off = 0;
          for (auto& t : outputs) {
            at::Tensor piece = ho.narrow(0, off, t.numel()).view(t.sizes());
            off += t.numel();
            st.out(t).copy_(piece);
          }
          return outputs;
        },
        nbytes(inputs));
  }

  WorkPtr barrier(const c10d::BarrierOptions&) override {
    // The agreement is itself a rendezvous of every rank; device work queued
    // before the barrier finishes first, as on CUDA.
    Tensors none;
    aten::synchronize();
    return collective("barrier", "", none, [&](Staging&) { return Tensors{}; });
  }

  // Point-to-point calls have no group-wide agreement (only two ranks take
  // part) and stay asynchronous, so a ring of isend/irecv cannot deadlock; a
  // peer that never answers ends the wait at the transport's timeout.
  WorkPtr send(Tensors& tensors, int dst, int tag) override {
    aten::fused_flush("collective");
    auto st = std::make_shared<Staging>();
    Tensors h = st->in(tensors);
    return point_to_point("send", dst, tag, tensors, st, host_->send(h, dst, tag));
  }

  WorkPtr recv(Tensors& tensors, int src, int tag) override {
    aten::fused_flush("collective");
    auto st = std::make_shared<Staging>();
    Tensors h = st->out(tensors);
    return point_to_point("recv", src, tag, tensors, st, host_->recv(h, src, tag));
  }

  WorkPtr recvAnysource(Tensors& tensors, int tag) override {
    aten::fused_flush("collective");
    auto st = std::make_shared<Staging>();
    Tensors h = st->out(tensors);
    return point_to_point("recv", -1, tag, tensors, st, host_->recvAnysource(h, tag));
  }

 private:
  // Every collective: cut a recorded Fused graph, agree with every rank on
  // the call, move the data, write the results back, count.
  template <class Body>
  WorkPtr collective(const char* kind, std::string detail, const Tensors& agreed, Body body,
                     int64_t payload = -1) {
    uint64_t seq = ++seq_;
    auto start = std::chrono::steady_clock::now();
    aten::fused_flush("collective");
    Call call{kind, std::move(detail), agreed, ""};
    if (auto* where = aten::caller_location()) call.where = *where;
    check_.agree(seq, call);
    Staging st;
    Tensors outputs;
    try {
      outputs = body(st);
      st.write_back();
    } catch (const c10::DistBackendError&) {
      throw;
    } catch (const std::exception& e) {
      check_.fail(seq, call, e.what());
    }
    count(kind, payload < 0 ? nbytes(agreed) : payload, st.host_copy_bytes(), start);
    return coalescing_.done(outputs);
  }

  WorkPtr point_to_point(const char* kind, int peer, int tag, const Tensors& tensors,
                         std::shared_ptr<Staging> st, WorkPtr inner) {
    std::string where;
    if (auto* w = aten::caller_location()) where = " at " + *w;
    std::string dir = peer < 0                      ? " from any rank"
                      : std::string(kind) == "send" ? " to rank " + std::to_string(peer)
                                                    : " from rank " + std::to_string(peer);
    std::string context =
        c10::str("tpu_dist: ", kind, " (rank ", rank_, dir, ", tag ", tag, ")", where,
                 " failed after waiting at most ", check_.timeout().count() / 1000.0, " s: ");
    int64_t bytes = nbytes(tensors);
    std::string k = kind;
    auto start = std::chrono::steady_clock::now();
    auto finish = [st, bytes, k, start] {
      st->write_back();
      count(k, bytes, st->host_copy_bytes(), start);
    };
    return c10::make_intrusive<HostWork>(
        std::move(inner), finish, [context] { return context; }, tensors);
  }

  // `h` is a host twin, or a CPU tensor itself (the backend also serves
  // "cpu" under init_process_group("tpu_dist")), reduced in place as gloo would.
  void reduce_one(at::Tensor h, const ReduceOp& op) {
    Tensors hs{h};
    host_->allreduce(hs, with_reduce(c10d::AllreduceOptions(), host_reduce(op, hs)))->wait();
    finish_reduce(op, hs, size_);
  }

  void gather_into(Staging& st, Tensors& outs, const at::Tensor& in,
                   const c10d::AllgatherOptions& opts) {
    std::vector<Tensors> hout{st.out(outs)};
    Tensors hin{st.in(in)};
    host_->allgather(hout, hin, opts)->wait();
  }

  // The output's rows, rank by rank, as contiguous host chunks gloo fills.
  void gather_into_tensor(Staging& st, at::Tensor& output, const at::Tensor& input,
                          const c10d::AllgatherOptions& opts) {
    at::Tensor ho = st.out(output).reshape({size_, -1});
    std::vector<Tensors> hout(1);
    for (int r = 0; r < size_; ++r) hout[0].push_back(ho[r]);
    Tensors hin{st.in(input).reshape({-1})};
    host_->allgather(hout, hin, opts)->wait();
  }

  void scatter_reduced(Staging& st, at::Tensor& output, const at::Tensor& input,
                       const c10d::ReduceScatterOptions& opts) {
    Tensors hin{private_copy(st, input)}, hout{st.out(output)};
    auto o = with_reduce(opts, host_reduce(opts.reduceOp, hin));
    host_->_reduce_scatter_base(hout[0], hin[0], o)->wait();
    finish_reduce(opts.reduceOp, hout, size_);
  }

  // A host copy the reduction may scale in place without touching the caller's tensor.
  static at::Tensor private_copy(Staging& st, const at::Tensor& t) {
    at::Tensor h = st.in(t);
    return h.is_same(t) ? h.clone() : h;
  }

  template <class Opts>
  static Opts with_reduce(const Opts& opts, const ReduceOp& op) {
    Opts o = opts;
    o.reduceOp = op;
    return o;
  }

  static Tensors flatten(const std::vector<Tensors>& lists) {
    Tensors all;
    for (auto& l : lists) all.insert(all.end(), l.begin(), l.end());
    return all;
  }

  static void count(const std::string& kind, int64_t bytes, int64_t host_bytes,
                    std::chrono::steady_clock::time_point since) {
    std::chrono::duration<double> dt = std::chrono::steady_clock::now() - since;
    count_collective(kind, bytes, host_bytes, dt.count());
  }

  c10::intrusive_ptr<c10d::Backend> host_;
  Checker check_;
  uint64_t seq_ = 0;
  Coalescing coalescing_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size,
                                               const c10::intrusive_ptr<c10d::Backend>& host,
                                               std::chrono::milliseconds timeout) {
  const char* dbg = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  bool detail = dbg && std::string(dbg) == "DETAIL";
  return c10::make_intrusive<TpuDist>(store, rank, size, host, timeout, detail);
}

namespace {
// A call that finished before returning. (Work::create_from_future's result()
// reads a future made in Python, so it cannot carry ours.)
class DoneWork final : public Work {
 public:
  explicit DoneWork(Tensors outputs)
      : Work(-1, c10d::OpType::UNKNOWN), outputs_(std::move(outputs)) {
    std::vector<c10::Device> devices;
    for (auto& t : outputs_)
      if (on_tpu(t) && std::find(devices.begin(), devices.end(), t.device()) == devices.end())
        devices.push_back(t.device());
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), devices);
    future_->markCompleted(c10::IValue(outputs_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  Tensors outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};
}  // namespace

c10::intrusive_ptr<c10d::Work> completed_work(const std::vector<at::Tensor>& outputs) {
  return c10::make_intrusive<DoneWork>(outputs);
}

std::vector<KindCount> collective_report() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  std::vector<KindCount> out;
  for (auto& [_, k] : c.by_kind) out.push_back(k);
  return out;
}

void count_collective(const std::string& kind, int64_t bytes, int64_t host_copy_bytes,
                      double seconds) {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  auto& k = c.by_kind[kind];
  k.kind = kind;
  k.calls++;
  k.bytes += bytes;
  k.host_copy_bytes += host_copy_bytes;
  k.seconds += seconds;
}

void reset_collective_report() {
  auto& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  c.by_kind.clear();
}

}  // namespace torchtpu::dist
