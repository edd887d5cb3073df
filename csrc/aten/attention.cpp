// scaled_dot_product_attention as one op. PyTorch asks a PrivateUse1 backend
// which SDPA kernel to use (`_fused_sdp_choice_stub`); where ours fits, the
// answer is the overrideable fused kernel, whose forward and backward call
// torchtpu::attention and torchtpu::attention_backward (lower/attention.cpp):
// one program each instead of the math path's matmul, mask and softmax ops,
// and a backward that recomputes the probabilities from the saved
// log-sum-exp rather than keeping them. Elsewhere the math path runs as before.
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "aten/runtime.h"

namespace torchtpu::aten {
namespace {

using Tensor = at::Tensor;

bool enabled() {
  static const bool on = env_default_on("TORCHTPU_FUSED_ATTENTION");
  return on;
}

bool symbolic(const Tensor& t) {
  for (const c10::SymInt& s : t.sym_sizes())
    if (s.is_heap_allocated()) return true;
  return false;
}

// Sizes that keep changing (a prompt length per call) would compile one
// backward program per size; the math path's ops run bucketed there
// (aten/bucketed.h). So a structure that needs gradients takes the fused
// kernel for its first few sizes only.
bool sizes_settled(const Tensor& q, const Tensor& k, const Tensor& v,
                   const std::optional<Tensor>& mask, bool is_causal) {
  constexpr size_t kMaxSizes = 4;
  using Key = std::tuple<int, int, int, int64_t, int64_t, bool, int64_t>;
  static std::mutex mu;
  static std::map<Key, std::set<std::vector<int64_t>>> seen;
  Key key{static_cast<int>(q.scalar_type()),
          static_cast<int>(k.scalar_type()),
          static_cast<int>(v.scalar_type()),
          q.size(-1),
          v.size(-1),
          is_causal,
          mask ? mask->dim() : -1};
  std::vector<int64_t> sizes = q.sizes().vec();
  sizes.push_back(k.size(-2));
  std::lock_guard<std::mutex> lock(mu);
  auto& s = seen[key];
  if (s.count(sizes)) return true;
  if (s.size() >= kMaxSizes) return false;
  s.insert(sizes);
  return true;
}

bool fits(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
          double dropout_p, bool is_causal) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  if (q.is_nested() || symbolic(q) || symbolic(k) || symbolic(v)) return false;
  // Dropout keeps the math path's random stream; a learned bias needs its
  // gradient, which the fused backward does not give.
  if (dropout_p > 0 || (mask && mask->defined() && (mask->requires_grad() || symbolic(*mask))))
    return false;
  const auto t = q.scalar_type();
  if (!at::isFloatingType(t) || t == at::kDouble || k.scalar_type() != t || v.scalar_type() != t)
    return false;
  // One head count (grouped-query attention takes the math path's repeat).
  for (int d : {0, 1})
    if (k.size(d) != q.size(d) || v.size(d) != q.size(d)) return false;
  if (q.size(-1) != k.size(-1) || k.size(2) != v.size(2)) return false;
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return false;
  // Without gradients the op runs bucketed where its lengths keep changing (a
  // decoding step's growing key length); its backward is not bucketed.
  const bool grad =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  return !grad || sizes_settled(q, k, v, mask, is_causal);
}

int64_t choose(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
               double dropout_p, bool is_causal, std::optional<double>, bool) {
  auto& ctx = at::globalContext();
  if (enabled() && ctx.userEnabledOverrideableSDP() && fits(q, k, v, mask, dropout_p, is_causal))
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  return static_cast<int64_t>(ctx.userEnabledMathSDP() ? at::SDPBackend::math
                                                       : at::SDPBackend::error);
}

double scale_of(const Tensor& q, std::optional<double> scale) {
  return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

// On XLA:GPU the ops call cuDNN's flash attention (custom calls), where it
// applies: half types, one head dim of at most 128 and a multiple of 8, no
// bias, a causal mask only over as many keys as queries. The forward and the
// backward decide alike, since the backward takes the forward's statistics.
// Opt-in until it has run on a GPU: TORCHTPU_CUDNN_ATTENTION=1 emits the calls
// on XLA:GPU, =2 on any platform (to see the program; only XLA:GPU runs it).
bool cudnn(const Tensor& q, const Tensor& k, const Tensor& v, bool has_bias, bool is_causal) {
  static const int mode = env_int("TORCHTPU_CUDNN_ATTENTION", 0);
  if (mode <= 0 || (mode == 1 && client().platform_name() != "cuda")) return false;
  const auto t = q.scalar_type();
  const int64_t e = q.size(-1);
  return (t == at::kBFloat16 || t == at::kHalf) && v.size(-1) == e && e % 8 == 0 && e <= 128 &&
         !has_bias && (!is_causal || q.size(2) == k.size(2));
}

// PyTorch's meta kernels give the outputs their input's dim order (q's for the
// output, q's, k's and v's for the gradients), and compiled graphs view them
// accordingly: [B, T, H, E] projections seen as [B, H, T, E]. Our ops return
// their results in that physical order, so the views below are free.
std::vector<int64_t> order_of(const Tensor& t) {
  std::vector<int64_t> order{0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return order;
}
Tensor in_logical_order(const Tensor& physical, const std::vector<int64_t>& order) {
  std::vector<int64_t> inv(order.size());
  for (size_t i = 0; i < order.size(); ++i) inv[order[i]] = static_cast<int64_t>(i);
  return physical.permute(inv);
}
std::vector<int64_t> physical_sizes(c10::IntArrayRef sizes, at::IntArrayRef order) {
  std::vector<int64_t> out;
  for (int64_t d : order) out.push_back(sizes[d]);
  return out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor>
fused_forward(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& bias,
              double dropout_p, bool is_causal, bool return_debug_mask,
              std::optional<double> scale) {
  TORCH_CHECK(dropout_p == 0 && !return_debug_mask,
              "[tpu] _scaled_dot_product_fused_attention_overrideable: dropout and the debug "
              "mask are not supported (scaled_dot_product_attention takes the math path for "
              "them)");
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchtpu::attention", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&,
                           const std::optional<Tensor>&, bool, double, at::IntArrayRef, bool)>();
  const auto order = order_of(q);
  // seed and offset: the schema's Philox state, zeros without dropout. They come
  // from the op's program: compiled graphs are replayed only when they return
  // tensors their program made.
  const bool has_bias = bias && bias->defined();
  auto [out, lse, seed, offset] = op.call(q, k, v, bias, is_causal, scale_of(q, scale), order,
                                          cudnn(q, k, v, has_bias, is_causal));
  return {in_logical_order(out, order), lse,  Tensor(), Tensor(), c10::SymInt(q.size(2)),
          c10::SymInt(k.size(2)),       seed, offset,   Tensor()};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_backward(
    const Tensor& grad, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
    std::array<bool, 4> mask, const Tensor& out, const Tensor& lse, const Tensor&, const Tensor&,
    c10::SymInt, c10::SymInt, double dropout_p, bool is_causal, const Tensor&, const Tensor&,
    std::optional<double> scale) {
  TORCH_CHECK(!mask[3] || !bias.defined(),
              "[tpu] _scaled_dot_product_fused_attention_overrideable_backward: the attention "
              "bias gradient is not supported");
  TORCH_CHECK(dropout_p == 0, "[tpu] fused attention backward: dropout is not supported");
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torchtpu::attention_backward", "")
                       .typed<std::tuple<Tensor, Tensor, Tensor>(
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const std::optional<Tensor>&, const Tensor&, const Tensor&, bool, double,
                           at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool)>();
  std::optional<Tensor> b = bias.defined() ? std::optional<Tensor>(bias) : std::nullopt;
  const auto qo = order_of(q), ko = order_of(k), vo = order_of(v);
  auto [dq, dk, dv] = op.call(grad, q, k, v, b, out, lse, is_causal, scale_of(q, scale), qo, ko, vo,
                              cudnn(q, k, v, bias.defined(), is_causal));
  auto keep = [](bool want, const Tensor& t, const std::vector<int64_t>& o) {
    return want ? in_logical_order(t, o) : Tensor();
  };
  return {keep(mask[0], dq, qo), keep(mask[1], dk, ko), keep(mask[2], dv, vo), Tensor()};
}

// Output metadata for the executor (PyTorch has no meta kernels for our ops).
std::tuple<Tensor, Tensor, Tensor, Tensor> attention_meta(const Tensor& q, const Tensor& k,
                                                          const Tensor& v,
                                                          const std::optional<Tensor>&, bool,
                                                          double, at::IntArrayRef order, bool) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
              "torchtpu::attention: query, key and value must be 4-d, got ", q.sizes(), ", ",
              k.sizes(), " and ", v.sizes());
  auto out = q.sizes().vec();
  out.back() = v.size(-1);
  return {at::empty(physical_sizes(out, order), q.options()),
          at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat)),
          at::empty({}, q.options().dtype(at::kLong)), at::empty({}, q.options().dtype(at::kLong))};
}
std::tuple<Tensor, Tensor, Tensor> attention_backward_meta(
    const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>&,
    const Tensor&, const Tensor&, bool, double, at::IntArrayRef qo, at::IntArrayRef ko,
    at::IntArrayRef vo, bool) {
  return {at::empty(physical_sizes(q.sizes(), qo), q.options()),
          at::empty(physical_sizes(k.sizes(), ko), k.options()),
          at::empty(physical_sizes(v.sizes(), vo), v.options())};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def(
      "attention(Tensor query, Tensor key, Tensor value, Tensor? bias, bool is_causal, "
      "float scale, int[] out_order, bool cudnn) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
      "Tensor? bias, Tensor out, Tensor logsumexp, bool is_causal, float scale, "
      "int[] q_order, int[] k_order, int[] v_order, bool cudnn) -> (Tensor, Tensor, Tensor)");
}
TORCH_LIBRARY_IMPL(torchtpu, Meta, m) {
  m.impl("attention", TORCH_FN(attention_meta));
  m.impl("attention_backward", TORCH_FN(attention_backward_meta));
}
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(fused_forward));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(fused_backward));
}

}  // namespace torchtpu::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchtpu::aten::choose)
}  // namespace at::native
