// Fused scaled dot-product attention (aten/attention.cpp routes
// scaled_dot_product_attention here): query [B, H, T, E], key [B, H, S, E],
// value [B, H, S, Ev]. Scores and softmax are computed in float32; the two
// products take their operands in the inputs' dtype and accumulate in float32.
// The forward returns the log-sum-exp of each row's scores, from which the
// backward recomputes the probabilities instead of saving them.
#include <cmath>
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
// mask (top-left aligned, as PyTorch's math path) applied.
Ex scores(Ctx& c, int q, int k, int bias, bool causal, double scale) {
  Builder& b = c.b;
  Ex s(b, bdot(b, c.in(q), 3, c.in(k), 3));
  s = s * scale;
  if (!c.is_none(bias)) s = s + in_as(c, bias, DType::F32);
  if (causal) {
    const Shape& sh = s.v.shape();
    Shape ts{sh[2], sh[3]};
    Ex keep = iota_along(b, ts, 1).cmp(Cmp::LE, iota_along(b, ts, 0));
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

}  // namespace

TPU_LOWERING(attention) {
  // (query, key, value, bias?, is_causal, scale, out_order) -> (out, logsumexp [B, H, T],
  // Philox seed and offset: zeros, no dropout);
  // results are laid out in the physical dim order given (aten/attention.cpp).
  reg("torchtpu::attention", [](Ctx& c) -> V {
    Builder& b = c.b;
    const DType t = c.in(0).dtype();
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
    Value zero = b.constant_int(0, DType::I64);
    return {b.transpose(out.v, c.ints(6)), b.reshape(lse.v, c.out(1).shape), zero, zero};
  });
  // (grad_out, query, key, value, bias?, out, logsumexp, is_causal, scale, q_order,
  //  k_order, v_order) -> (dq, dk, dv)
  reg("torchtpu::attention_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    const DType t = c.in(1).dtype();
    const double scale = c.f64(8);
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
