// Meta kernels PyTorch does not register for a few ops that reach the tpu
// backend; the executor needs an op's output metadata before lowering it.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace torchtpu::aten {
namespace {

// Writes into preallocated values/indices shaped like self: nothing to compute.
void cum_helper_meta(const at::Tensor& self, at::Tensor& values, at::Tensor& indices, int64_t) {
  values.resize_(self.sizes());
  indices.resize_(self.sizes());
}
at::Tensor logcumsumexp_meta(const at::Tensor& self, int64_t) { return at::empty_like(self); }

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("_cummax_helper", TORCH_FN(cum_helper_meta));
  m.impl("_cummin_helper", TORCH_FN(cum_helper_meta));
  m.impl("_logcumsumexp", TORCH_FN(logcumsumexp_meta));
}

}  // namespace torchtpu::aten
