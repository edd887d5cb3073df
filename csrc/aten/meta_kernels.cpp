// Meta kernels PyTorch does not register for a few ops that reach the tpu
// backend; the executor needs an op's output metadata before lowering it.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "lower/external.h"
#include "lower/types.h"

namespace torchtpu::aten {
namespace {

// Writes into preallocated values/indices shaped like self: nothing to compute.
void cum_helper_meta(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t) {
  values.resize_(self.sizes());
  indices.resize_(self.sizes());
}
at::Tensor logcumsumexp_meta(const at::Tensor& self, int64_t) { return at::empty_like(self); }
std::tuple<at::Tensor, at::Tensor> geqrf_meta(const at::Tensor& self) {
  TORCH_CHECK(self.dim() >= 2, "geqrf: input must have at least 2 dimensions.");
  auto tau = self.sizes().vec();
  tau.pop_back();
  tau.back() = std::min(self.size(-2), self.size(-1));
  return {at::empty_like(self), at::empty(tau, self.options())};
}

at::Tensor multi_margin_backward_meta(const at::Tensor&, const at::Tensor& self, const at::Tensor&,
                                      const at::Scalar&, const at::Scalar&,
                                      const std::optional<at::Tensor>&, int64_t) {
  return at::empty_like(self);
}
at::Tensor multilabel_margin_backward_meta(const at::Tensor&, const at::Tensor& self,
                                           const at::Tensor&, int64_t, const at::Tensor&) {
  return at::empty_like(self);
}

at::Tensor fractional_max_pool3d_backward_meta(const at::Tensor&, const at::Tensor& self,
                                               at::IntArrayRef, at::IntArrayRef,
                                               const at::Tensor&) {
  return at::empty_like(self);
}

std::tuple<at::Tensor, at::Tensor> histogram_bin_ct_meta(const at::Tensor& self, int64_t bins,
                                                         std::optional<at::ArrayRef<double>>,
                                                         const std::optional<at::Tensor>&, bool) {
  return {at::empty({bins}, self.options()), at::empty({bins + 1}, self.options())};
}
std::tuple<at::Tensor, at::Tensor> histogram_bins_meta(const at::Tensor& self,
                                                       const at::Tensor& bins,
                                                       const std::optional<at::Tensor>&, bool) {
  return {at::empty({bins.numel() - 1}, self.options()), at::empty({bins.numel()}, self.options())};
}

// The fused LSTM cell: PyTorch's Python meta kernel reads `.device` of the
// biases, so it raises when they are absent (nn.LSTM(bias=False)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_meta(const at::Tensor& ig,
                                                              const at::Tensor& hg,
                                                              const at::Tensor& cx,
                                                              const std::optional<at::Tensor>& bi,
                                                              const std::optional<at::Tensor>& bh) {
  TORCH_CHECK(ig.dim() == 2 && ig.sizes() == hg.sizes(),
              "_thnn_fused_lstm_cell: input_gates and hidden_gates must be 2-D of one size, got ",
              ig.sizes(), " and ", hg.sizes());
  TORCH_CHECK(cx.dim() == 2 && cx.size(0) == ig.size(0) && cx.size(1) * 4 == ig.size(1),
              "_thnn_fused_lstm_cell: cx ", cx.sizes(), " does not match gates ", ig.sizes());
  const bool has_bias = bi && bi->defined();
  TORCH_CHECK(!has_bias ||
                  (bi->dim() == 1 && bi->size(0) == ig.size(1) && bh && bh->sizes() == bi->sizes()),
              "_thnn_fused_lstm_cell: biases must be 1-D of size ", ig.size(1));
  return {at::empty_like(cx), at::empty_like(cx), at::empty(ig.sizes(), ig.options())};
}

// The fused GRU cell (CUDA-only in PyTorch): hy like hx, a [B, 5H] workspace.
std::tuple<at::Tensor, at::Tensor> gru_cell_meta(const at::Tensor& ig, const at::Tensor& hg,
                                                 const at::Tensor& hx,
                                                 const std::optional<at::Tensor>& bi,
                                                 const std::optional<at::Tensor>& bh) {
  TORCH_CHECK(ig.dim() == 2 && ig.sizes() == hg.sizes(),
              "_thnn_fused_gru_cell: input_gates and hidden_gates must be 2-D of one size, got ",
              ig.sizes(), " and ", hg.sizes());
  TORCH_CHECK(hx.dim() == 2 && hx.size(0) == ig.size(0) && hx.size(1) * 3 == ig.size(1),
              "_thnn_fused_gru_cell: hx ", hx.sizes(), " does not match gates ", ig.sizes());
  const bool has_bias = bi && bi->defined();
  TORCH_CHECK(!has_bias ||
                  (bi->dim() == 1 && bi->size(0) == ig.size(1) && bh && bh->sizes() == bi->sizes()),
              "_thnn_fused_gru_cell: biases must be 1-D of size ", ig.size(1));
  return {at::empty_like(hx), at::empty({ig.size(0), hx.size(1) * 5}, ig.options())};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward_meta(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  TORCH_CHECK(workspace.dim() == 2 && grad_hy.dim() == 2 &&
                  workspace.size(1) == grad_hy.size(1) * 5 && workspace.size(0) == grad_hy.size(0),
              "_thnn_fused_gru_cell_backward: workspace ", workspace.sizes(),
              " does not match grad_hy ", grad_hy.sizes());
  const int64_t b = grad_hy.size(0), g = grad_hy.size(1) * 3;
  auto bias = [&] { return has_bias ? at::empty({g}, grad_hy.options()) : at::Tensor(); };
  return {at::empty({b, g}, grad_hy.options()), at::empty({b, g}, grad_hy.options()),
          at::empty_like(grad_hy), bias(), bias()};
}

// linalg_lstsq's outputs as LAPACK's drivers fill them: residuals only when
// m > n (and not gelsy), rank unless gels, singular values for gelsd/gelss.
std::tuple<at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&> lstsq_meta(
    const at::Tensor& a, const at::Tensor& b, std::optional<double>,
    std::optional<c10::string_view> driver_opt, at::Tensor& solution, at::Tensor& residuals,
    at::Tensor& rank, at::Tensor& sv) {
  TORCH_CHECK(a.dim() >= 2, "linalg.lstsq: input must have at least 2 dimensions.");
  std::string driver = driver_opt ? std::string(*driver_opt) : "gelsy";
  bool vec = b.dim() == a.dim() - 1;
  int64_t m = a.size(-2), n = a.size(-1), k = vec ? 1 : b.size(-1);
  auto batch =
      at::infer_size(a.sizes().slice(0, a.dim() - 2), b.sizes().slice(0, b.dim() - (vec ? 1 : 2)));
  auto with = [&](std::initializer_list<int64_t> tail) {
    std::vector<int64_t> s = batch;
    s.insert(s.end(), tail);
    return s;
  };
  solution.resize_(vec ? with({n}) : with({n, k}));
  residuals.resize_(m > n && driver != "gelsy" ? (vec ? with({}) : with({k}))
                                               : std::vector<int64_t>{0});
  rank.resize_(driver != "gels" ? with({}) : std::vector<int64_t>{0});
  sv.resize_(driver == "gelsd" || driver == "gelss" ? with({std::min(m, n)})
                                                    : std::vector<int64_t>{0});
  return {solution, residuals, rank, sv};
}

// Fused optimizer steps return nothing and only write their arguments; some
// overloads have no Meta kernel in PyTorch. Their lists must agree in length.
void fused_step_meta(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::optional<size_t> len;
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (!v.isTensorList() || v.toTensorList().empty()) continue;
    const size_t k = v.toTensorList().size();
    TORCH_CHECK(!len || *len == k, op.schema().name(),
                ": expected tensor lists of the same length, got ", *len, " and ", k);
    len = k;
  }
  torch::jit::drop(*stack, n);
}

// histogramdd's pieces over an input [..., D]: D edge vectors, and the counts.
std::vector<at::Tensor> histogramdd_edges_meta(const at::Tensor& self, at::IntArrayRef bins,
                                               std::optional<at::ArrayRef<double>>,
                                               const std::optional<at::Tensor>&, bool) {
  std::vector<at::Tensor> out;
  for (int64_t nb : bins) out.push_back(at::empty({nb + 1}, self.options()));
  return out;
}
at::Tensor histogramdd_cts_meta(const at::Tensor& self, at::IntArrayRef bins,
                                std::optional<at::ArrayRef<double>>,
                                const std::optional<at::Tensor>&, bool) {
  return at::empty(bins, self.options());
}
at::Tensor histogramdd_tensors_meta(const at::Tensor& self, at::TensorList bins,
                                    const std::optional<at::Tensor>&, bool) {
  std::vector<int64_t> shape;
  for (const at::Tensor& e : bins) shape.push_back(e.numel() - 1);
  return at::empty(shape, self.options());
}

// torchtpu::jax_call's outputs are the registered function's results.
std::vector<at::Tensor> jax_call_meta(at::TensorList args, int64_t key) {
  auto f = lower::find_external(key);
  TORCH_CHECK(f, "torchtpu::jax_call: no function registered under key ", key,
              " (define it with torchtpu.jax_op)");
  TORCH_CHECK(args.size() == f->args.size(), f->name, ": takes ", f->args.size(), " tensors, got ",
              args.size());
  std::vector<at::Tensor> outs;
  for (const auto& t : f->results)
    outs.push_back(at::empty(
        t.shape, at::TensorOptions().device(c10::kMeta).dtype(lower::to_scalar_type(t.dtype))));
  return outs;
}

// torchtpu::spmd_collective over the group `devices`: all_reduce keeps the
// shape, all_gather multiplies `dim` by the group size, reduce_scatter divides it.
at::Tensor spmd_collective_meta(const at::Tensor& x, c10::string_view kind, c10::string_view,
                                int64_t dim, at::IntArrayRef devices, int64_t) {
  std::vector<int64_t> shape = x.sizes().vec();
  const auto n = static_cast<int64_t>(devices.size());
  if (kind != "all_reduce") {
    TORCH_CHECK(dim >= 0 && dim < x.dim(), "torchtpu::spmd_collective: dim ", dim, " of ",
                x.sizes());
    if (kind == "all_gather") {
      shape[dim] *= n;
    } else {
      TORCH_CHECK(kind == "reduce_scatter" && shape[dim] % n == 0,
                  "torchtpu::spmd_collective: ", kind, " of ", x.sizes(), " over ", n, " ranks");
      shape[dim] /= n;
    }
  }
  return at::empty(shape, x.options());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def("jax_call(Tensor[] args, int key) -> Tensor[]");
  m.def(
      "spmd_collective(Tensor x, str kind, str reduce, int dim, int[] devices, int group) -> "
      "Tensor");
}
TORCH_LIBRARY_IMPL(torchtpu, Meta, m) {
  m.impl("jax_call", TORCH_FN(jax_call_meta));
  m.impl("spmd_collective", TORCH_FN(spmd_collective_meta));
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  for (const char* name : {"_fused_adam_", "_fused_adamw_", "_fused_sgd_", "_fused_adagrad_"}) {
    for (const char* overload : {"", "tensor_lr"}) {
      auto h = c10::Dispatcher::singleton().findSchema({std::string("aten::") + name, overload});
      const std::string op = std::string(name) + (*overload ? "." : "") + overload;
      if (h && !h->hasKernelForDispatchKey(c10::DispatchKey::Meta))
        m.impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&fused_step_meta>());
    }
  }
  m.impl("linalg_lstsq.out", TORCH_FN(lstsq_meta));
  m.impl("_cummax_helper", TORCH_FN(cum_helper_meta));
  m.impl("_cummin_helper", TORCH_FN(cum_helper_meta));
  m.impl("_logcumsumexp", TORCH_FN(logcumsumexp_meta));
  m.impl("geqrf", TORCH_FN(geqrf_meta));
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell_meta));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell_meta));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward_meta));
  m.impl("histogram.bin_ct", TORCH_FN(histogram_bin_ct_meta));
  m.impl("histogram.bins_tensor", TORCH_FN(histogram_bins_meta));
  m.impl("_histogramdd_bin_edges", TORCH_FN(histogramdd_edges_meta));
  m.impl("_histogramdd_from_bin_cts", TORCH_FN(histogramdd_cts_meta));
  m.impl("_histogramdd_from_bin_tensors", TORCH_FN(histogramdd_tensors_meta));
  m.impl("fractional_max_pool3d_backward", TORCH_FN(fractional_max_pool3d_backward_meta));
  m.impl("multi_margin_loss_backward", TORCH_FN(multi_margin_backward_meta));
  m.impl("multilabel_margin_loss_backward", TORCH_FN(multilabel_margin_backward_meta));
}

}  // namespace torchtpu::aten
