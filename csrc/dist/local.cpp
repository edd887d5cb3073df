#include "dist/local.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "aten/fused.h"
#include "aten/launch.h"
#include "aten/runtime.h"
#include "dist/backend.h"
#include "dist/local_p2p.h"
#include "dist/local_rendezvous.h"
#include "lower/types.h"

namespace torchtpu::dist {
namespace {

using c10d::ReduceOp;
using Tensors = std::vector<at::Tensor>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using Clock = std::chrono::steady_clock;

[[noreturn]] void raise(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

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

// The rows `x` ([rows, rowlen]) sends, padded with zeros to `m` rows per
// destination: [splits.size() * m, rowlen].
at::Tensor pad_rows(const at::Tensor& x, const std::vector<int64_t>& splits, int64_t m) {
  if (std::all_of(splits.begin(), splits.end(), [&](int64_t s) { return s == m; })) return x;
  Tensors pieces;
  int64_t off = 0;
  for (int64_t s : splits) {
    pieces.push_back(x.narrow(0, off, s));
    off += s;
    if (s < m) pieces.push_back(at::zeros({m - s, x.size(1)}, x.options()));
  }
  return at::cat(pieces);
}

// "Float rows of [3]": what every rank of an all_to_all must agree on.
std::string rows_detail(const at::Tensor& t) {
  std::vector<int64_t> trailing = t.dim() ? t.sizes().slice(1).vec() : std::vector<int64_t>{};
  return c10::str(t.scalar_type(), " rows of ", c10::IntArrayRef(trailing));
}

// Rank i's meta is [its input splits..., its output splits...]: what i sends
// to j must be what j expects from i.
std::string splits_pair_up(const Metas& metas) {
  const size_t n = metas.size();
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (metas[i][j] != metas[j][n + i])
        return c10::str("rank ", i, " sends ", metas[i][j], " rows to rank ", j, ", which expects ",
                        metas[j][n + i],
                        " from it (input_split_sizes and output_split_sizes must "
                        "pair up across ranks)");
  return "";
}

class TpuLocal final : public c10d::Backend {
 public:
  TpuLocal(std::shared_ptr<Rendezvous> rv, int rank, const std::vector<int>& devices,
           std::chrono::milliseconds timeout)
      : Backend(rank, int(devices.size())),
        rv_(std::move(rv)),
        device_(devices[rank]),
        devices_(devices.begin(), devices.end()),
        timeout_(timeout) {
    aten::set_rank_device(device_, true);
  }
  ~TpuLocal() override { release_device(); }

  const std::string getBackendName() const override { return "tpu_local"; }
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_; }
  void leave(const std::string& why) {
    release_device();
    dist::leave(*rv_, rank_, why);
  }

  // Coalesced calls run at once, each its own rendezvous, as tpu_dist.
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override { coalescing_.start(); }
  WorkPtr endCoalescing() override { return coalescing_.end(); }

  WorkPtr allreduce(Tensors& tensors, const c10d::AllreduceOptions& opts) override {
    const char* kind = "all_reduce";
    one_tensor(kind, tensors.size());
    at::Tensor& t = tensors[0];
    std::string problem;
    std::string red = reduce_of(kind, opts.reduceOp, t, problem);
    if (spmd_here(problem, {t})) {
      spmd_reduce(t, scaled(opts.reduceOp, {t})[0], "all_reduce", red, opts.reduceOp);
      return spmd_done(kind, {t}, {t});
    }
    return collective(
        kind, reduce_name(opts.reduceOp), {t}, {t}, program(kind, red, t, {t.numel()}),
        [&](const Bufs& out) {
          reduced(t, out[0], opts.reduceOp);
          return Tensors{t};
        },
        problem, scaled(opts.reduceOp, {t}));
  }

  // One program of one all_reduce per tensor (dtypes may differ).
  WorkPtr allreduce_coalesced(Tensors& tensors,
                              const c10d::AllreduceCoalescedOptions& opts) override {
    const char* kind = "all_reduce_coalesced";
    std::string red, problem;
    std::vector<Part> parts;
    for (auto& t : tensors) {
      red = reduce_of(kind, opts.reduceOp, t, problem);
      parts.push_back(part(t, {t.numel()}));
    }
    if (spmd_here(problem, tensors)) {
      Tensors xs = scaled(opts.reduceOp, tensors);
      for (size_t i = 0; i < tensors.size(); ++i)
        spmd_reduce(tensors[i], xs[i], "all_reduce", red, opts.reduceOp);
      return spmd_done(kind, tensors, tensors);
    }
    return collective(
        kind, reduce_name(opts.reduceOp), tensors, tensors, Program{"all_reduce", red, parts},
        [&](const Bufs& out) {
          for (size_t i = 0; i < tensors.size(); ++i) reduced(tensors[i], out[i], opts.reduceOp);
          return tensors;
        },
        problem, scaled(opts.reduceOp, tensors));
  }

  // An all_reduce of which the root keeps the result; the other ranks' tensors
  // stay as they were.
  WorkPtr reduce(Tensors& tensors, const c10d::ReduceOptions& opts) override {
    const char* kind = "reduce";
    one_tensor(kind, tensors.size());
    at::Tensor& t = tensors[0];
    const int root = int(opts.rootRank);
    std::string problem;
    std::string red = reduce_of(kind, opts.reduceOp, t, problem);
    return collective(
        kind, reduce_name(opts.reduceOp) + ", root " + std::to_string(root), {t}, {t},
        program("all_reduce", red, t, {t.numel()}),
        [&](const Bufs& out) {
          if (rank_ == root) reduced(t, out[0], opts.reduceOp);
          return Tensors{t};
        },
        problem, scaled(opts.reduceOp, {t}));
  }

  WorkPtr broadcast(Tensors& tensors, const c10d::BroadcastOptions& opts) override {
    one_tensor("broadcast", tensors.size());
    at::Tensor& t = tensors[0];
    const int root = int(opts.rootRank);
    return collective("broadcast", "root " + std::to_string(root), {t}, {t},
                      program("all_gather", "", t, {1, t.numel()}), [&](const Bufs& out) {
                        if (rank_ != root) copy_row(t, out[0], root);
                        return Tensors{t};
                      });
  }

  WorkPtr _allgather_base(at::Tensor& output, at::Tensor& input,
                          const c10d::AllgatherOptions&) override {
    const char* kind = "all_gather_into_tensor";
    std::string problem = like_check(kind, output, input, input.numel() * size_);
    if (spmd_here(problem, {input, output})) {
      output.copy_(spmd("all_gather", "", input).view(output.sizes()));
      return spmd_done(kind, {input}, {output});
    }
    return collective(
        kind, "", {input}, {input, output}, program("all_gather", "", input, {1, input.numel()}),
        [&](const Bufs& out) {
          assign(output, out[0]);
          return Tensors{output};
        },
        problem);
  }

  WorkPtr allgather_into_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::AllgatherOptions&) override {
    const char* kind = "all_gather_into_tensor_coalesced";
    std::string problem = count_check(kind, outputs.size(), inputs.size());
    std::vector<Part> parts;
    for (size_t i = 0; i < inputs.size(); ++i) {
      parts.push_back(part(inputs[i], {1, inputs[i].numel()}));
      if (problem.empty())
        problem = like_check(kind, outputs[i], inputs[i], inputs[i].numel() * size_);
    }
    if (spmd_here(problem, cat(inputs, outputs))) {
      for (size_t i = 0; i < inputs.size(); ++i)
        outputs[i].copy_(spmd("all_gather", "", inputs[i]).view(outputs[i].sizes()));
      return spmd_done(kind, inputs, outputs);
    }
    return collective(
        kind, "", inputs, cat(inputs, outputs), Program{"all_gather", "", parts},
        [&](const Bufs& out) {
          for (size_t i = 0; i < outputs.size(); ++i) assign(outputs[i], out[i]);
          return outputs;
        },
        problem);
  }

  WorkPtr allgather(std::vector<Tensors>& outputs, Tensors& inputs,
                    const c10d::AllgatherOptions&) override {
    const char* kind = "all_gather";
    one_tensor(kind, inputs.size());
    one_tensor(kind, outputs.size());
    at::Tensor& input = inputs[0];
    Tensors& outs = outputs[0];
    std::string problem = rows_check(kind, outs, input);
    return collective(
        kind, "", {input}, cat(outs, {input}), program("all_gather", "", input, {1, input.numel()}),
        [&](const Bufs& out) {
          for (int k = 0; k < size_; ++k) copy_row(outs[k], out[0], k);
          return outs;
        },
        problem);
  }

  // One program of one all_gather per input.
  WorkPtr allgather_coalesced(std::vector<Tensors>& outputs, Tensors& inputs,
                              const c10d::AllgatherOptions&) override {
    const char* kind = "all_gather_coalesced";
    std::string problem = count_check(kind, outputs.size(), inputs.size());
    std::vector<Part> parts;
    Tensors checked = inputs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      parts.push_back(part(inputs[i], {1, inputs[i].numel()}));
      if (problem.empty()) problem = rows_check(kind, outputs[i], inputs[i]);
      if (i < outputs.size()) checked = cat(checked, outputs[i]);
    }
    return collective(
        kind, "", inputs, checked, Program{"all_gather", "", parts},
        [&](const Bufs& out) {
          Tensors all;
          for (size_t i = 0; i < inputs.size(); ++i)
            for (int k = 0; k < size_; ++k) {
              copy_row(outputs[i][k], out[i], k);
              all.push_back(outputs[i][k]);
            }
          return all;
        },
        problem);
  }

  // An all_gather of which the root copies the rows out.
  WorkPtr gather(std::vector<Tensors>& outputs, Tensors& inputs,
                 const c10d::GatherOptions& opts) override {
    const char* kind = "gather";
    one_tensor(kind, inputs.size());
    at::Tensor& input = inputs[0];
    const int root = int(opts.rootRank);
    std::string problem;
    Tensors checked{input};
    if (rank_ == root) {
      problem = outputs.size() == 1
                    ? rows_check(kind, outputs[0], input)
                    : c10::str(kind, ": the root passes one gather_list, got ", outputs.size());
      if (problem.empty()) checked = cat(checked, outputs[0]);
    }
    return collective(
        kind, "root " + std::to_string(root), {input}, checked,
        program("all_gather", "", input, {1, input.numel()}),
        [&](const Bufs& out) {
          if (rank_ != root) return Tensors{};
          for (int k = 0; k < size_; ++k) copy_row(outputs[0][k], out[0], k);
          return outputs[0];
        },
        problem);
  }

  // An all_to_all in which only the root's rows are not zeros; each rank keeps
  // the row that came from the root.
  WorkPtr scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                  const c10d::ScatterOptions& opts) override {
    const char* kind = "scatter";
    one_tensor(kind, outputs.size());
    at::Tensor& output = outputs[0];
    const int root = int(opts.rootRank);
    std::string problem;
    Tensors checked{output};
    at::Tensor flat;
    if (rank_ == root) {
      problem = inputs.size() == 1
                    ? rows_check(kind, inputs[0], output)
                    : c10::str(kind, ": the root passes one scatter_list, got ", inputs.size());
      if (problem.empty()) {
        checked = cat(checked, inputs[0]);
        Tensors pieces;
        for (auto& i : inputs[0]) pieces.push_back(i.reshape({-1}));
        flat = at::cat(pieces);
      }
    } else {
      flat = at::zeros({size_ * output.numel()}, output.options());
    }
    return collective(kind, "root " + std::to_string(root), {output}, checked,
                      program("all_to_all", "", output, {size_, output.numel()}),
                      [&](const Bufs& out) {
                        copy_row(output, out[0], root);
                        return Tensors{output};
                      },
                      problem, {flat.defined() ? flat : output});
  }

  WorkPtr _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                               const c10d::ReduceScatterOptions& opts) override {
    const char* kind = "reduce_scatter_tensor";
    std::string problem = like_check(kind, input, output, output.numel() * size_);
    std::string red = reduce_of(kind, opts.reduceOp, input, problem);
    if (spmd_here(problem, {input, output})) {
      spmd_reduce(output, scaled(opts.reduceOp, {input})[0], "reduce_scatter", red, opts.reduceOp);
      return spmd_done(kind, {input}, {output});
    }
    return collective(
        kind, reduce_name(opts.reduceOp), {input}, {input, output},
        program("reduce_scatter", red, input, {size_, output.numel()}),
        [&](const Bufs& out) {
          reduced(output, out[0], opts.reduceOp);
          return Tensors{output};
        },
        problem, scaled(opts.reduceOp, {input}));
  }

  // One program of one reduce_scatter per pair.
  WorkPtr reduce_scatter_tensor_coalesced(Tensors& outputs, Tensors& inputs,
                                          const c10d::ReduceScatterOptions& opts) override {
    const char* kind = "reduce_scatter_tensor_coalesced";
    std::string problem = count_check(kind, outputs.size(), inputs.size());
    std::string red;
    std::vector<Part> parts;
    for (size_t i = 0; i < inputs.size(); ++i) {
      red = reduce_of(kind, opts.reduceOp, inputs[i], problem);
      const int64_t n = i < outputs.size() ? outputs[i].numel() : 0;
      parts.push_back(part(inputs[i], {size_, n}));
      if (problem.empty()) problem = like_check(kind, inputs[i], outputs[i], n * size_);
    }
    if (spmd_here(problem, cat(inputs, outputs))) {
      Tensors xs = scaled(opts.reduceOp, inputs);
      for (size_t i = 0; i < inputs.size(); ++i)
        spmd_reduce(outputs[i], xs[i], "reduce_scatter", red, opts.reduceOp);
      return spmd_done(kind, inputs, outputs);
    }
    return collective(
        kind, reduce_name(opts.reduceOp), inputs, cat(inputs, outputs),
        Program{"reduce_scatter", red, parts},
        [&](const Bufs& out) {
          for (size_t i = 0; i < outputs.size(); ++i) reduced(outputs[i], out[i], opts.reduceOp);
          return outputs;
        },
        problem, scaled(opts.reduceOp, inputs));
  }

  WorkPtr reduce_scatter(Tensors& outputs, std::vector<Tensors>& inputs,
                         const c10d::ReduceScatterOptions& opts) override {
    const char* kind = "reduce_scatter";
    one_tensor(kind, outputs.size());
    one_tensor(kind, inputs.size());
    at::Tensor& output = outputs[0];
    std::string problem = rows_check(kind, inputs[0], output);
    std::string red = reduce_of(kind, opts.reduceOp, output, problem);
    at::Tensor flat;
    if (problem.empty()) {
      Tensors pieces;
      for (auto& i : inputs[0]) pieces.push_back(i.reshape({-1}));
      flat = at::cat(pieces);
    }
    return collective(
        kind, reduce_name(opts.reduceOp), inputs[0], cat(inputs[0], {output}),
        program("reduce_scatter", red, output, {size_, output.numel()}),
        [&](const Bufs& out) {
          reduced(output, out[0], opts.reduceOp);
          return Tensors{output};
        },
        problem, scaled(opts.reduceOp, {flat.defined() ? flat : output}));
  }

  WorkPtr alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& out_splits,
                        std::vector<int64_t>& in_splits, const c10d::AllToAllOptions&) override {
    const char* kind = "all_to_all_single";
    std::string problem;
    std::vector<int64_t> ins = splits(kind, "input", input, in_splits, problem);
    std::vector<int64_t> outs = splits(kind, "output", output, out_splits, problem);
    if (problem.empty() &&
        (output.scalar_type() != input.scalar_type() || rows_detail(output) != rows_detail(input)))
      problem = c10::str(kind, ": the output ", output.scalar_type(), output.sizes(),
                         " must have the input's dtype and trailing sizes (input ",
                         input.scalar_type(), input.sizes(), ")");
    at::Tensor rows =
        problem.empty() ? input.reshape({input.dim() ? input.size(0) : 1, -1}) : input;
    auto [got, whole] =
        exchange_rows(kind, rows_detail(input), rows, ins, outs, {input, output}, problem);
    if (whole)
      assign(output, whole);
    else
      output.copy_(got.view(output.sizes()));
    return completed_work({output});
  }

  // List all-to-all: one uneven exchange of the flattened pieces.
  WorkPtr alltoall(Tensors& outputs, Tensors& inputs, const c10d::AllToAllOptions&) override {
    const char* kind = "all_to_all";
    std::string problem;
    if (int(inputs.size()) != size_ || int(outputs.size()) != size_)
      problem = c10::str(kind, ": ", inputs.size(), " inputs and ", outputs.size(), " outputs for ",
                         size_, " ranks");
    const auto dtype = inputs.empty() ? c10::kFloat : inputs[0].scalar_type();
    std::vector<int64_t> ins, outs;
    for (auto& t : cat(inputs, outputs))
      if (problem.empty() && t.scalar_type() != dtype)
        problem = c10::str(kind, ": a ", t.scalar_type(), t.sizes(), " tensor among ", dtype,
                           " ones (one dtype for every input and output)");
    Tensors flat;
    for (auto& t : inputs) {
      ins.push_back(t.numel());
      flat.push_back(t.reshape({-1, 1}));
    }
    for (auto& t : outputs) outs.push_back(t.numel());
    at::Tensor rows = problem.empty() ? at::cat(flat) : at::Tensor();
    if (!problem.empty()) ins.assign(size_, 0), outs.assign(size_, 0);
    auto [got, whole] = exchange_rows(kind, c10::str(dtype, " elements"), rows, ins, outs,
                                      cat(inputs, outputs), problem);
    int64_t off = 0;
    for (auto& t : outputs) {
      t.copy_(got.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    return completed_work(outputs);
  }

  WorkPtr barrier(const c10d::BarrierOptions&) override {
    // Work queued before the barrier finishes first, as on CUDA.
    aten::synchronize();
    return collective("barrier", "", {}, {}, Program{}, [](const Bufs&) { return Tensors{}; });
  }

  WorkPtr send(Tensors& tensors, int dst, int tag) override {
    one_tensor("send", tensors.size());
    const at::Tensor& t = tensors[0];
    peer_check("send", dst, t);
    aten::fused_flush("collective");
    return local_send(p2p(), t, input_buffer(t), dst, tag);
  }

  WorkPtr recv(Tensors& tensors, int src, int tag) override {
    one_tensor("recv", tensors.size());
    peer_check("recv", src, tensors[0]);
    return local_recv(p2p(), tensors[0], src, tag, assign);
  }

  WorkPtr recvAnysource(Tensors& tensors, int tag) override {
    one_tensor("recv", tensors.size());
    peer_check("recv", -1, tensors[0]);
    return local_recv(p2p(), tensors[0], -1, tag, assign);
  }

 private:
  void release_device() {
    if (std::exchange(owns_device_, false)) aten::set_rank_device(device_, false);
  }

  // SPMD mode (torchtpu.distributed.spmd) in Fused Eager: the collective is
  // recorded into this rank's graph, which then runs across it as one
  // replicated program with the other ranks' graphs. Elsewhere, and for a
  // call with a problem (raised by the ordinary path), it runs on its own.
  bool spmd_here(const std::string& problem, const Tensors& ts) const {
    if (!aten::spmd_mode() || !problem.empty() || aten::mode() != aten::Mode::Fused ||
        aten::in_compiled_graph())
      return false;
    return std::all_of(ts.begin(), ts.end(),
                       [&](const at::Tensor& t) { return device_check(t).empty(); });
  }

  // `x` flattened through torchtpu::spmd_collective (recorded, not run). A
  // view at a rank's own offset (a shard of a flat buffer) is copied out
  // first, so the collective alone is the same program on every rank.
  at::Tensor spmd(const char* kind, const std::string& red, const at::Tensor& x) const {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("torchtpu::spmd_collective", "")
                         .typed<at::Tensor(const at::Tensor&, c10::string_view, c10::string_view,
                                           int64_t, at::IntArrayRef, int64_t)>();
    at::Tensor flat = x.reshape({-1});
    if (flat.storage_offset() != 0 ||
        int64_t(aten::device_storage(flat.storage()).nbytes) != flat.numel() * flat.element_size())
      flat = flat.clone();
    return op.call(flat, kind, red, 0, devices_, group_tag(*rv_));
  }

  // A reduction of `x` (the caller's input, or PREMUL_SUM's scaled copy) into `out`.
  void spmd_reduce(at::Tensor& out, const at::Tensor& x, const char* kind, const std::string& red,
                   const ReduceOp& op) {
    out.copy_(spmd(kind, red, x).view(out.sizes()));
    average(op, out);
  }

  // Counted by `agreed`'s bytes, as collective(); the Work carries `outputs`.
  WorkPtr spmd_done(const char* kind, const Tensors& agreed, const Tensors& outputs) {
    ++seq_;
    count(kind, agreed, Clock::now());
    return done(outputs);
  }

  // The caller's fingerprint, local checks and input buffers (one per part).
  Entry entry(const char* kind, std::string detail, const Tensors& agreed, const Tensors& local,
              std::string problem, const Tensors& inputs) const {
    Entry e{Call{kind, std::move(detail), agreed, ""}, {}, {}, std::move(problem)};
    if (auto* where = aten::caller_location()) e.call.where = *where;
    for (auto& t : local)
      if (e.problem.empty()) e.problem = device_check(t);
    for (auto& t : inputs) {
      if (!e.problem.empty()) break;
      try {
        e.inputs.push_back(input_buffer(t));
      } catch (const std::exception& ex) {
        e.problem = ex.what();
      }
    }
    return e;
  }

  // Cut the recorded Fused graph, bring this rank's inputs (by default the
  // first agreed tensor of each part), meet the other ranks (agreement, then
  // one launch), take this rank's outputs, count.
  template <class Finish>
  WorkPtr collective(const char* kind, std::string detail, const Tensors& agreed,
                     const Tensors& local, const Program& prog, Finish finish,
                     std::string problem = "", Tensors inputs = {}) {
    const uint64_t seq = ++seq_;
    auto start = Clock::now();
    aten::fused_flush("collective");
    if (inputs.empty())
      inputs.assign(agreed.begin(), agreed.begin() + std::min(agreed.size(), prog.parts.size()));
    Entry e = entry(kind, std::move(detail), agreed, local, std::move(problem), inputs);
    Met met = meet(*rv_, seq, 0, rank_, std::move(e), prog, timeout_);
    Tensors outputs = finish(met.out);
    count(kind, agreed, start);
    return done(outputs);
  }

  // An all_to_all whose split sizes may differ between ranks and pairs: the
  // ranks first exchange their splits (no data), then run the even device
  // all_to_all over rows padded to the largest split, and each rank drops
  // the padding. Returns the rows this rank receives, [sum(outs), rowlen],
  // and the program's buffer itself when no padding was dropped.
  std::pair<at::Tensor, pjrt::BufferPtr> exchange_rows(const char* kind, std::string detail,
                                                       const at::Tensor& rows,
                                                       const std::vector<int64_t>& ins,
                                                       const std::vector<int64_t>& outs,
                                                       const Tensors& local, std::string problem) {
    const uint64_t seq = ++seq_;
    auto start = Clock::now();
    aten::fused_flush("collective");
    Entry e = entry(kind, detail, {}, local, std::move(problem), {});
    e.meta = cat_splits(ins, outs);
    Program sizes;
    sizes.check = splits_pair_up;
    Met met = meet(*rv_, seq, 0, rank_, std::move(e), sizes, timeout_);
    int64_t m = 0;
    for (auto& meta : met.metas) m = std::max(m, *std::max_element(meta.begin(), meta.end()));
    const int64_t rowlen = rows.size(1), total = sum(outs);
    at::Tensor got;
    pjrt::BufferPtr whole;
    if (m == 0 || rowlen == 0) {
      got = at::zeros({total, rowlen}, rows.options());
    } else {
      at::Tensor padded = pad_rows(rows, ins, m);
      Program prog = program("all_to_all", "", rows, {size_, m * rowlen});
      Entry e2 = entry(kind, detail + ", padded to " + std::to_string(m), {}, {}, "", {padded});
      Met moved = meet(*rv_, seq, 1, rank_, std::move(e2), prog, timeout_);
      at::Tensor all =
          aten::wrap_buffer(moved.out[0], {size_, m, rowlen}, rows.scalar_type(), device_);
      if (std::all_of(outs.begin(), outs.end(), [&](int64_t s) { return s == m; })) {
        got = all.view({size_ * m, rowlen});
        whole = moved.out[0];
      } else {
        Tensors pieces;
        for (int k = 0; k < size_; ++k) pieces.push_back(all.select(0, k).narrow(0, 0, outs[k]));
        got = at::cat(pieces);
      }
    }
    count(kind, {rows}, start);
    return {got, whole};
  }

  // Split sizes as given, or even ones when none are ("" in `problem` else).
  std::vector<int64_t> splits(const char* kind, const char* which, const at::Tensor& t,
                              const std::vector<int64_t>& given, std::string& problem) const {
    const int64_t rows = t.dim() ? t.size(0) : 1;
    if (given.empty()) {
      if (rows % size_ != 0 && problem.empty())
        problem = c10::str(kind, ": ", rows, " ", which, " rows do not split evenly over ", size_,
                           " ranks; pass ", which, "_split_sizes");
      return std::vector<int64_t>(size_, rows / size_);
    }
    if (problem.empty() && (int(given.size()) != size_ || sum(given) != rows))
      problem = c10::str(kind, ": ", which, "_split_sizes ", c10::IntArrayRef(given), " for ", rows,
                         " rows and ", size_, " ranks");
    if (int(given.size()) != size_) return std::vector<int64_t>(size_, 0);
    return given;
  }

  PointToPoint p2p() const {
    PointToPoint p{mailbox(*rv_), rank_, device_, timeout_, ""};
    if (auto* where = aten::caller_location()) p.where = *where;
    return p;
  }

  void peer_check(const char* kind, int peer, const at::Tensor& t) const {
    std::string problem = device_check(t);
    if (problem.empty() && (peer >= size_ || peer == rank_ || peer < -1))
      problem = c10::str("the peer rank ", peer, " is not another rank of ", size_);
    if (!problem.empty()) raise(c10::str("tpu_local: ", kind, " on rank ", rank_, ": ", problem));
  }

  WorkPtr done(const Tensors& outputs) { return coalescing_.done(outputs); }

  static void count(const char* kind, const Tensors& agreed, Clock::time_point start) {
    int64_t bytes = 0;
    for (auto& t : agreed) bytes += t.numel() * t.element_size();
    std::chrono::duration<double> took = Clock::now() - start;
    count_collective(kind, bytes, 0, took.count());
  }

  static Part part(const at::Tensor& t, std::vector<int64_t> sizes) {
    return Part{lower::to_dtype(t.scalar_type()), std::move(sizes)};
  }

  Program program(const char* kind, const std::string& red, const at::Tensor& t,
                  std::vector<int64_t> sizes) const {
    return Program{kind, red, {part(t, std::move(sizes))}};
  }

  std::string device_check(const at::Tensor& t) const {
    if (t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == device_)
      return "";
    return c10::str("a ", t.scalar_type(), t.sizes(), " tensor on ", t.device(), "; rank ", rank_,
                    " of a thread group runs on tpu:", device_,
                    " (torch.tpu.set_device(rank) and tensors made there)");
  }

  // The device reduce op, or a problem naming the op and what to do.
  std::string reduce_of(const char* kind, const ReduceOp& op, const at::Tensor& t,
                        std::string& problem) const {
    const bool integral =
        !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type());
    switch (op.op_) {
      case ReduceOp::SUM:
      case ReduceOp::AVG: return "sum";
      case ReduceOp::PRODUCT: return "prod";
      case ReduceOp::MIN: return "min";
      case ReduceOp::MAX: return "max";
      case ReduceOp::PREMUL_SUM:
        if (!integral && premul_factor(op)) return "sum";  // of the scaled inputs
        break;
      case ReduceOp::BAND:
      case ReduceOp::BOR:
      case ReduceOp::BXOR:
        if (integral)
          return op.op_ == ReduceOp::BAND ? "band" : op.op_ == ReduceOp::BOR ? "bor" : "bxor";
        break;
      default: break;
    }
    if (problem.empty())
      problem = c10::str(kind, " with ", reduce_name(op), " on ", t.scalar_type(),
                         " is not supported between thread ranks; run the ranks as processes "
                         "with tpu_dist for it");
    return "sum";
  }

  static const c10d::PreMulSumSupplement* premul_factor(const ReduceOp& op) {
    return dynamic_cast<const c10d::PreMulSumSupplement*>(op.supplement_.get());
  }

  // PREMUL_SUM sums the inputs times its factor: the program takes scaled
  // copies, so the callers' tensors keep their values until the result lands.
  // Other ops take `ts` as they are.
  static Tensors scaled(const ReduceOp& op, Tensors ts) {
    const auto* sup = op.op_ == ReduceOp::PREMUL_SUM ? premul_factor(op) : nullptr;
    if (!sup) return ts;
    for (auto& t : ts)
      t = sup->tensor_factor.defined() ? t * sup->tensor_factor.to(t.device())
                                       : t * sup->double_factor;
    return ts;
  }

  // AVG is SUM then a division on the device (truncating for integers, as NCCL).
  // A reduction's result into `t`: the buffer, then AVG's division.
  void reduced(at::Tensor& t, const pjrt::BufferPtr& buf, const ReduceOp& op) const {
    assign(t, buf);
    average(op, t);
  }

  void average(const ReduceOp& op, at::Tensor& t) const {
    if (op.op_ != ReduceOp::AVG) return;
    if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type()))
      t.div_(size_);
    else
      t.div_(size_, "trunc");
  }

  // Row `k` of a gathered [size, numel] buffer into `dst` (a device copy).
  void copy_row(at::Tensor& dst, const pjrt::BufferPtr& buf, int k) const {
    at::Tensor all = aten::wrap_buffer(buf, {size_, dst.numel()}, dst.scalar_type(), device_);
    dst.copy_(all.select(0, k).view(dst.sizes()));
  }

  // One tensor per rank, each like `like` (dtype and number of elements).
  std::string rows_check(const char* kind, const Tensors& ts, const at::Tensor& like) const {
    if (int(ts.size()) != size_)
      return c10::str(kind, ": ", ts.size(), " tensors in the list for ", size_, " ranks");
    for (auto& t : ts)
      if (auto p = like_check(kind, t, like, like.numel()); !p.empty()) return p;
    return "";
  }

  static std::string like_check(const char* kind, const at::Tensor& t, const at::Tensor& like,
                                int64_t want) {
    if (t.numel() == want && t.scalar_type() == like.scalar_type()) return "";
    return c10::str(kind, ": a ", t.scalar_type(), t.sizes(), " tensor where ", want, " ",
                    like.scalar_type(), " elements are needed");
  }

  static std::string count_check(const char* kind, size_t outputs, size_t inputs) {
    if (outputs == inputs) return "";
    return c10::str(kind, ": ", outputs, " outputs for ", inputs, " inputs");
  }

  static void one_tensor(const char* kind, size_t n) {
    if (n != 1)
      raise(c10::str("tpu_local: ", kind, " takes one tensor per rank, got ", n,
                     " (each thread rank has one device)"));
  }

  static Tensors cat(Tensors a, const Tensors& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static std::vector<int64_t> cat_splits(std::vector<int64_t> a, const std::vector<int64_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static int64_t sum(const std::vector<int64_t>& v) {
    int64_t s = 0;
    for (int64_t x : v) s += x;
    return s;
  }

  std::shared_ptr<Rendezvous> rv_;
  const int device_;                    // this rank's tpu device index
  const std::vector<int64_t> devices_;  // the group's, by group rank
  bool owns_device_ = true;             // counted in aten::set_rank_device
  std::chrono::milliseconds timeout_;
  uint64_t seq_ = 0;
  Coalescing coalescing_;
};
}  // namespace

c10::intrusive_ptr<c10d::Backend> make_local_backend(const std::string& session, int rank,
                                                     const std::vector<int>& devices,
                                                     std::chrono::milliseconds timeout) {
  const int size = int(devices.size());
  TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "tpu_local: rank ", rank,
                    " of world_size ", size);
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  TORCH_CHECK_VALUE(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() &&
                        sorted.front() >= 0 && sorted.back() < aten::device_count(),
                    "tpu_local: the group's ranks run on devices ",
                    c10::IntArrayRef(std::vector<int64_t>(devices.begin(), devices.end())), " but ",
                    aten::device_count(),
                    " tpu devices are in this process, one per rank (set TORCHTPU_NUM_DEVICES "
                    "before importing torchtpu)");
  return c10::make_intrusive<TpuLocal>(rendezvous(session, devices, timeout), rank, devices,
                                       timeout);
}

bool local_rank_left(const c10::intrusive_ptr<c10d::Backend>& backend, const std::string& why) {
  auto* local = dynamic_cast<TpuLocal*>(backend.get());
  if (!local) return false;
  local->leave(why);
  return true;
}

}  // namespace torchtpu::dist
