// Ops whose output size depends on tensor values. Each syncs once for the
// size (one .item()) and then runs lowered ops of that static size
// (nonzero_static, index_select, sort, ...), so nothing leaves the device.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <type_traits>

#include "aten/events.h"
#include "aten/host_ops.h"

namespace torchtpu::aten {
namespace {

// The one host read of these ops (a Fused Eager cut named data_dependent).
template <typename T>
T host_value(const at::Tensor& t) {
  SyncReason why("data_dependent");
  T v = t.item<T>();
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) note_value_size(v);
  return v;
}

int64_t count_nonzero_host(const at::Tensor& t) { return host_value<int64_t>((t != 0).sum()); }

at::Tensor tpu_nonzero(const at::Tensor& self) {
  ValueSizedScope scope;
  return at::nonzero_static(self, count_nonzero_host(self), -1);
}
at::Tensor& nonzero_out(const at::Tensor& self, at::Tensor& out) {
  at::Tensor r = tpu_nonzero(self);
  out.resize_(r.sizes());
  return out.copy_(r);
}

// Flat positions of the true elements of a bool tensor.
at::Tensor true_positions(const at::Tensor& mask) {
  at::Tensor flat = mask.reshape({-1});
  return at::nonzero_static(flat, count_nonzero_host(flat), -1).view({-1});
}

at::Tensor tpu_masked_select(const at::Tensor& self, const at::Tensor& mask) {
  ValueSizedScope scope;
  TORCH_CHECK(mask.scalar_type() == at::kBool, "masked_select: expected BoolTensor for mask, got ",
              mask.scalar_type());
  auto shape = at::infer_size(self.sizes(), mask.sizes());
  at::Tensor pos = true_positions(mask.expand(shape));
  if (pos.numel() == 0) return at::empty({0}, self.options());
  return self.expand(shape).reshape({-1}).index_select(0, pos);
}
at::Tensor& masked_select_out(const at::Tensor& self, const at::Tensor& mask, at::Tensor& out) {
  at::Tensor r = tpu_masked_select(self, mask);
  out.resize_(r.sizes());
  return out.copy_(r);
}

bool tpu_equal(const at::Tensor& self, const at::Tensor& other) {
  if (!self.sizes().equals(other.sizes())) return false;
  if (self.numel() == 0) return true;
  return host_value<bool>(at::eq(self, other).all());
}

// repeats [n] -> index i repeated repeats[i] times.
at::Tensor tpu_repeat_interleave(const at::Tensor& repeats, std::optional<int64_t> output_size) {
  TORCH_CHECK(repeats.dim() == 1, "repeat_interleave: repeats must be 1-d, got ", repeats.dim(),
              "-d");
  ValueSizedScope scope;
  int64_t total = output_size ? *output_size : host_value<int64_t>(repeats.sum());
  at::Tensor ends = repeats.cumsum(0);
  at::Tensor pos = at::arange(total, repeats.options().dtype(at::kLong));
  return at::searchsorted(ends, pos, /*out_int32=*/false, /*right=*/true).to(repeats.scalar_type());
}

// Runs of equal values in flat `v`: (values, group id of each element, counts).
std::tuple<at::Tensor, at::Tensor, at::Tensor> runs(const at::Tensor& v) {
  int64_t n = v.numel();
  at::Tensor first =
      at::cat({at::ones({1}, v.options().dtype(at::kBool)), v.slice(0, 1) != v.slice(0, 0, n - 1)});
  at::Tensor group = first.to(at::kLong).cumsum(0) - 1;
  at::Tensor starts = true_positions(first);
  at::Tensor ends = at::cat({starts.slice(0, 1), at::full({1}, n, starts.options())});
  return {v.index_select(0, starts), group, ends - starts};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique_impl(const at::Tensor& self, bool sort,
                                                           bool return_inverse,
                                                           bool return_counts) {
  ValueSizedScope scope;
  at::Tensor flat = self.reshape({-1});
  auto long_opts = self.options().dtype(at::kLong);
  if (flat.numel() == 0)
    return {flat.clone(), at::zeros(return_inverse ? self.sizes() : at::IntArrayRef{0}, long_opts),
            at::zeros({0}, long_opts)};
  at::Tensor order;
  if (sort) std::tie(flat, order) = at::sort(flat, /*stable=*/true, 0, false);
  auto [values, group, counts] = runs(flat);
  at::Tensor inverse = at::zeros({0}, long_opts);
  if (return_inverse) {
    inverse = sort ? at::empty_like(group).scatter_(0, order, group) : group;
    inverse = inverse.view(self.sizes());
  }
  return {values, inverse, return_counts ? counts : at::zeros({0}, long_opts)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> unique2(const at::Tensor& self, bool sorted,
                                                       bool return_inverse, bool return_counts) {
  return unique_impl(self, true, return_inverse, return_counts);
}
std::tuple<at::Tensor, at::Tensor> tpu_unique(const at::Tensor& self, bool sorted,
                                              bool return_inverse) {
  auto [v, inv, _] = unique_impl(self, true, return_inverse, false);
  return {v, inv};
}
std::tuple<at::Tensor, at::Tensor, at::Tensor> tpu_unique_consecutive(const at::Tensor& self,
                                                                      bool return_inverse,
                                                                      bool return_counts,
                                                                      std::optional<int64_t> dim) {
  TORCH_CHECK_NOT_IMPLEMENTED(!dim.has_value() || self.dim() <= 1,
                              "[tpu] unique_consecutive with dim= is not supported yet");
  return unique_impl(self, false, return_inverse, return_counts);
}

// Length max(self) + 1 (at least minlength): one read of the min and max, then
// a scatter-add of ones or the weights. Float32/64 weights keep their dtype,
// others count in float64, as on the CPU.
at::Tensor tpu_bincount(const at::Tensor& self, const std::optional<at::Tensor>& weights,
                        int64_t minlength) {
  TORCH_CHECK(self.dim() == 1 && at::isIntegralType(self.scalar_type(), /*includeBool=*/false),
              "bincount only supports 1-d non-negative integral inputs.");
  TORCH_CHECK(minlength >= 0, "minlength should be >= 0");
  const bool weighted = weights.has_value() && weights->defined();
  TORCH_CHECK(!weighted || (weights->dim() == 1 && weights->size(0) == self.size(0)),
              "weights should be 1-d and have the same length as input");
  int64_t n = minlength;
  if (self.numel() > 0) {
    at::Tensor range;
    {
      SyncReason why("data_dependent");
      range = at::stack({self.min(), self.max()}).cpu();
    }
    TORCH_CHECK(range[0].item<int64_t>() >= 0,
                "bincount only supports 1-d non-negative integral inputs.");
    n = std::max(n, range[1].item<int64_t>() + 1);
    note_value_size(n);
  }
  at::ScalarType dt = at::kLong;
  if (weighted) {
    dt = weights->scalar_type() == at::kFloat ? at::kFloat : at::kDouble;
  }
  ValueSizedScope scope;
  at::Tensor w = weighted ? weights->to(dt) : at::ones({self.numel()}, self.options().dtype(dt));
  return at::zeros({n}, self.options().dtype(dt)).index_add_(0, self, w);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("bincount", TORCH_FN(tpu_bincount));
  m.impl("nonzero", TORCH_FN(tpu_nonzero));
  m.impl("nonzero.out", TORCH_FN(nonzero_out));
  m.impl("masked_select", TORCH_FN(tpu_masked_select));
  m.impl("masked_select.out", TORCH_FN(masked_select_out));
  m.impl("equal", TORCH_FN(tpu_equal));
  m.impl("repeat_interleave.Tensor", TORCH_FN(tpu_repeat_interleave));
  m.impl("_unique2", TORCH_FN(unique2));
  m.impl("_unique", TORCH_FN(tpu_unique));
  m.impl("unique_consecutive", TORCH_FN(tpu_unique_consecutive));
}

}  // namespace torchtpu::aten
