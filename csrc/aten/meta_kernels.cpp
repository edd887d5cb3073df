// Meta kernels PyTorch does not register for a few ops that reach the tpu
// backend; the executor needs an op's output metadata before lowering it.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>

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

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_cummax_helper", TORCH_FN(cum_helper_meta));
  m.impl("_cummin_helper", TORCH_FN(cum_helper_meta));
  m.impl("_logcumsumexp", TORCH_FN(logcumsumexp_meta));
  m.impl("geqrf", TORCH_FN(geqrf_meta));
}

}  // namespace torchtpu::aten
