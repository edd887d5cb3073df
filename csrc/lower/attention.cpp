// Fused scaled dot-product attention (aten/attention.cpp routes
// scaled_dot_product_attention here): query [B, H, T, E], key [B, H, S, E],
// value [B, H, S, Ev]. Scores and softmax are computed in float32; the two
// products take their operands in the inputs' dtype and accumulate in float32.
// The forward returns the log-sum-exp of each row's scores, from which the
// backward recomputes the probabilities instead of saving them.
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

// Batched product over dims 0 and 1, contracting lhs dim `lc` with rhs dim `rc`.
Value bdot(Builder& b, Value x, int64_t lc, Value y, int64_t rc) {
  return b.dot_general(x, y, {0, 1}, {0, 1}, {lc}, {rc}, DType::F32);
}

// Scaled scores [B, H, T, S] in float32, with the bias added and the causal
// mask (top-left aligned, as PyTorch's math path) applied. Keys past a
// bucketed call's real length are masked too.
Ex scores(Ctx& c, int q, int k, int bias, bool causal, double scale) {
  Builder& b = c.b;
  Ex s(b, bdot(b, c.in(q), 3, c.in(k), 3));
  s = s * scale;
  if (!c.is_none(bias)) s = s + in_as(c, bias, DType::F32);
  const Shape& sh = s.v.shape();
  if (causal) {
    Shape ts{sh[2], sh[3]};
    Ex keep = iota_along(b, ts, 1).cmp(Cmp::LE, iota_along(b, ts, 0));
    s = where(keep, s, s.k(-INFINITY));
  }
  if (std::optional<Value> n = c.runtime_size(k, 2)) {
    Ex keep = iota_along(b, {sh[3]}, 0).cmp(Cmp::LT, Ex(b, *n));
    s = where(keep, s, s.k(-INFINITY));
  }
  return s;
}

Value reduce_last(Builder& b, Value x, Reducer r) {
  return b.reshape(b.reduce(x, reduce_init(b, r, x.dtype()), {3}, r),
                   reduced_shape(x.shape(), {3}, true));
}

// p in the dtype the products take (the inputs').
Value low(Builder& b, const Ex& p, DType t) { return b.convert(p.v, t); }

// XLA:GPU's cuDNN flash attention (the custom calls JAX emits), layout BNTH:
// query [B, N, T, H], key and value [B, N, S, H]. The forward also gives the
// softmax statistics [B, N, T] (float32) that its backward takes.
std::string dims_json(const char* name, int64_t lc, int64_t rc) {
  return std::string("\"") + name + "\":{\"lhs_contracting_dimensions\":[\"" + std::to_string(lc) +
         "\"],\"rhs_contracting_dimensions\":[\"" + std::to_string(rc) +
         "\"],\"lhs_batch_dimensions\":[\"0\",\"1\"],\"rhs_batch_dimensions\":[\"0\",\"1\"]}";
}
std::string cudnn_config(const Shape& q, int64_t s, DType t, double scale, bool causal,
                         bool backward) {
  char scale_text[32];
  std::snprintf(scale_text, sizeof scale_text, "%.17g", scale);
  std::string dims = "\"" + std::to_string(q[0]) + "\",\"" + std::to_string(q[1]) + "\",\"" +
                     std::to_string(q[2]) + "\",\"" + std::to_string(s) + "\"";
  std::string c =
      "{\"operation_queue_id\":\"0\",\"cudnn_fmha_backend_config\":{"
      "\"algorithm\":{\"algo_id\":\"0\",\"math_type\":\"TENSOR_OP_MATH\",\"tuning_knobs\":"
      "{\"17\":\"1\",\"24\":\"0\"},\"is_cudnn_frontend\":true,\"workspace_size\":\"0\"},"
      "\"fmha_scale\":" +
      std::string(scale_text) + ",\"intermediate_tensor_shape\":{\"element_type\":\"" +
      (t == DType::BF16 ? "BF16" : "F16") + "\",\"dimensions\":[" + dims +
      "],\"tuple_shapes\":[],\"layout\":{\"dim_level_types\":[],\"dim_unique\":[],"
      "\"dim_ordered\":[],\"minor_to_major\":[\"3\",\"2\",\"1\",\"0\"],\"tiles\":[],"
      "\"element_size_in_bits\":\"0\",\"memory_space\":\"0\",\"index_primitive_type\":"
      "\"PRIMITIVE_TYPE_INVALID\",\"pointer_primitive_type\":\"PRIMITIVE_TYPE_INVALID\","
      "\"dynamic_shape_metadata_prefix_bytes\":\"0\"},\"is_dynamic_dimension\":[false,false,"
      "false,false]},\"is_flash_attention\":true,\"mask_type\":\"" +
      std::string(causal ? "CAUSAL" : "NO_MASK") + "\",";
  if (backward) {
    c += dims_json("bmm1_grad_gemm1_dot_dimension_numbers", 2, 2) + "," +
         dims_json("bmm1_grad_gemm2_dot_dimension_numbers", 3, 2) + "," +
         dims_json("bmm2_grad_gemm1_dot_dimension_numbers", 2, 2) + "," +
         dims_json("bmm2_grad_gemm2_dot_dimension_numbers", 3, 3);
  } else {
    c += dims_json("bmm1_dot_dimension_numbers", 3, 3) + "," +
         dims_json("bmm2_dot_dimension_numbers", 3, 2);
  }
  return c +
         ",\"dropout_rate\":0,\"seed\":42,\"sliding_window_length\":0,\"max_seg_per_batch\":1,"
         "\"is_paged_attention\":false}}";
}
const std::vector<int64_t> kRowMajor4{3, 2, 1, 0}, kRowMajor3{2, 1, 0}, kWorkspace{0};
const Type workspace{DType::U8, {0}};

}  // namespace

TPU_LOWERING(attention) {
  // (query, key, value, bias?, is_causal, scale, out_order, cudnn) -> (out, logsumexp
  // [B, H, T] (cuDNN's softmax statistics with `cudnn`), Philox seed and offset: zeros,
  // no dropout);
  // results are laid out in the physical dim order given (aten/attention.cpp).
  reg("torchtpu::attention", [](Ctx& c) -> V {
    Builder& b = c.b;
    const DType t = c.in(0).dtype();
    Value zero = b.constant_int(0, DType::I64);
    if (c.flag(7)) {
      const Shape q = c.in(0).shape();
      auto r = b.custom_call("__cudnn$fmhaSoftmax", {c.in(0), c.in(1), c.in(2)},
                             {Type{t, q}, Type{DType::F32, {q[0], q[1], q[2]}}, workspace},
                             cudnn_config(q, c.in(1).shape()[2], t, c.f64(5), c.flag(4), false),
                             {kRowMajor4, kRowMajor3, kWorkspace});
      return {b.transpose(r[0], c.ints(6)), r[1], zero, zero};
    }
    Ex s = scores(c, 0, 1, 3, c.flag(4), c.f64(5));
    Ex m(b, reduce_last(b, s.v, Reducer::Max));
    // Rows with every score masked (-inf) give zeros, as the math path's
    // _safe_softmax does, and a log-sum-exp of -inf.
    Ex m0 = where(m.cmp(Cmp::EQ, m.k(-INFINITY)), m.k(0), m);
    Ex e = (s - m0).un("exponential");
    Ex l(b, reduce_last(b, e.v, Reducer::Add));
    Ex inv = where(l.cmp(Cmp::EQ, l.k(0)), l.k(0), 1.0 / l);
    Ex out(b, bdot(b, low(b, e * inv, t), 3, c.in(2), 2));
    Ex lse = m0 + l.un("log");
    return {b.transpose(out.v, c.ints(6)), b.reshape(lse.v, c.out(1).shape), zero, zero};
  });
  // (grad_out, query, key, value, bias?, out, logsumexp, is_causal, scale, q_order,
  //  k_order, v_order, cudnn) -> (dq, dk, dv)
  reg("torchtpu::attention_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    const DType t = c.in(1).dtype();
    const double scale = c.f64(8);
    if (c.flag(12)) {
      const Shape q = c.in(1).shape(), k = c.in(2).shape();
      auto r = b.custom_call(
          "__cudnn$fmhaSoftmaxBackward",
          {c.in(1), c.in(2), c.in(3), c.in(6), b.convert(c.in(0), t), b.convert(c.in(5), t)},
          {Type{t, q}, Type{t, k}, Type{t, c.in(3).shape()}, workspace},
          cudnn_config(q, k[2], t, scale, c.flag(7), true),
          {kRowMajor4, kRowMajor4, kRowMajor4, kWorkspace});
      return {b.transpose(r[0], c.ints(9)), b.transpose(r[1], c.ints(10)),
              b.transpose(r[2], c.ints(11))};
    }
    Ex s = scores(c, 1, 2, 4, c.flag(7), scale);
    const Shape& sh = s.v.shape();
    Ex lse(b, b.reshape(in_as(c, 6, DType::F32).v, {sh[0], sh[1], sh[2], 1}));
    Ex e = where(lse.cmp(Cmp::EQ, lse.k(-INFINITY)), s.k(0), (s - lse).un("exponential"));
    // Renormalized: the scores here may differ from the forward's in their last
    // bits (another program's dot), and dS's row sum, which must be 0, would
    // carry that difference times rowsum(P * dP) (large for peaked rows).
    Ex l(b, reduce_last(b, e.v, Reducer::Add));
    Ex p = e * where(l.cmp(Cmp::EQ, l.k(0)), l.k(0), 1.0 / l);
    Value g = b.convert(c.in(0), t);
    Value dv = bdot(b, low(b, p, t), 2, g, 2);
    Ex dp(b, bdot(b, g, 3, c.in(3), 3));
    // Softmax backward: dS = P * (dP - rowsum(P * dP)), then the scale.
    Ex ds = p * (dp - Ex(b, reduce_last(b, (p * dp).v, Reducer::Add))) * scale;
    Value dsl = low(b, ds, t);
    Value dq = bdot(b, dsl, 3, c.in(2), 2);
    Value dk = bdot(b, dsl, 2, c.in(1), 2);
    return {b.transpose(dq, c.ints(9)), b.transpose(dk, c.ints(10)), b.transpose(dv, c.ints(11))};
  });
}

}  // namespace torchtpu::lower
