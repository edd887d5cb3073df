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

}  // namespace

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
  m.impl("histogram.bin_ct", TORCH_FN(histogram_bin_ct_meta));
  m.impl("histogram.bins_tensor", TORCH_FN(histogram_bins_meta));
  m.impl("fractional_max_pool3d_backward", TORCH_FN(fractional_max_pool3d_backward_meta));
  m.impl("multi_margin_loss_backward", TORCH_FN(multi_margin_backward_meta));
  m.impl("multilabel_margin_loss_backward", TORCH_FN(multilabel_margin_backward_meta));
}

}  // namespace torchtpu::aten
