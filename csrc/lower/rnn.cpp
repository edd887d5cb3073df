// Fused RNN cells: the pointwise part of one LSTM/GRU step after the two gate
// matmuls, and its backward. On a non-CPU device PyTorch's LSTMCell/GRUCell
// (hence nn.LSTM, nn.GRU and their cells) call these; the workspace layouts
// follow PyTorch's CUDA kernels, since autograd hands them back to the backward.
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using V = std::vector<Value>;

// The k equal chunks of a [B, k*H] value along dim 1.
std::vector<Ex> chunks(Builder& b, Value x, int k) {
  const int64_t rows = x.shape()[0], h = x.shape()[1] / k;
  std::vector<Ex> out;
  for (int i = 0; i < k; ++i) out.emplace_back(b, b.slice(x, {0, i * h}, {rows, (i + 1) * h}, {}));
  return out;
}

Ex cat(Builder& b, const std::vector<Ex>& xs) {
  std::vector<Value> vs(xs.begin(), xs.end());
  return Ex(b, b.concatenate(vs, 1));
}

// Argument i as dtype t, or zeros like `like` when absent (an undefined grad).
Ex in_or_zeros(Ctx& c, int i, DType t, const Ex& like) {
  return c.is_none(i) ? like.k(0) : in_as(c, i, t);
}

// Gate pre-activations: input gates + hidden gates (+ both biases), split in k.
std::vector<Ex> gate_sums(Ctx& c, DType t, int k) {
  Ex g = in_as(c, 0, t) + in_as(c, 1, t);
  if (!c.is_none(3)) g = g + in_as(c, 3, t);
  if (!c.is_none(4)) g = g + in_as(c, 4, t);
  return chunks(c.b, g.v, k);
}

// A [k*H] bias argument as k chunks of shape [1, H].
std::vector<Ex> bias_chunks(Ctx& c, int i, DType t, int k) {
  Value v = in_as(c, i, t);
  return chunks(c.b, c.b.reshape(v, {1, v.shape()[0]}), k);
}

Ex sig(const Ex& x) { return x.un("logistic"); }
Ex tanh_(const Ex& x) { return x.un("tanh"); }

TPU_LOWERING(rnn_cells) {
  // (input_gates, hidden_gates, cx, b_ih?, b_hh?) -> (hy, cy, workspace), gates
  // in order i, f, g, o; workspace holds them activated.
  reg("_thnn_fused_lstm_cell", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    auto s = gate_sums(c, t, 4);
    Ex i = sig(s[0]), f = sig(s[1]), g = tanh_(s[2]), o = sig(s[3]);
    Ex cy = f * in_as(c, 2, t) + i * g;
    return {o * tanh_(cy), cy, cat(c.b, {i, f, g, o})};
  });
  // (grad_hy?, grad_cy?, cx, cy, workspace, has_bias) -> (grad_gates, grad_cx,
  // grad_bias?); grad_gates serves both gate inputs, grad_bias both biases.
  reg("_thnn_fused_lstm_cell_backward_impl", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex cx = in_as(c, 2, t), cy = in_as(c, 3, t);
    auto w = chunks(c.b, in_as(c, 4, t).v, 4);
    const Ex &i = w[0], &f = w[1], &g = w[2], &o = w[3];
    Ex ghy = in_or_zeros(c, 0, t, cx), gcy = in_or_zeros(c, 1, t, cx);
    Ex tc = tanh_(cy);
    Ex gc = ghy * o * (1.0 - tc * tc) + gcy;
    Ex gates = cat(c.b, {gc * g * (1.0 - i) * i, gc * cx * (1.0 - f) * f, gc * i * (1.0 - g * g),
                         ghy * tc * (1.0 - o) * o});
    Value bias = c.flag(5) ? reduce_sum(c.b, gates.v, {0}, false) : Value{};
    return {gates, gc * f, bias};
  });
  // (input_gates, hidden_gates, hx, b_ih?, b_hh?) -> (hy, workspace), gates in
  // order r, z, n; workspace = [r, z, n, hx, hidden n gate + its bias].
  reg("_thnn_fused_gru_cell", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    auto ig = chunks(c.b, in_as(c, 0, t).v, 3), hg = chunks(c.b, in_as(c, 1, t).v, 3);
    if (!c.is_none(3)) {
      auto bi = bias_chunks(c, 3, t, 3), bh = bias_chunks(c, 4, t, 3);
      for (int k = 0; k < 3; ++k) {
        ig[k] = ig[k] + bi[k];
        hg[k] = hg[k] + bh[k];
      }
    }
    Ex r = sig(ig[0] + hg[0]), z = sig(ig[1] + hg[1]);
    const Ex& hn = hg[2];
    Ex n = tanh_(ig[2] + r * hn);
    Ex hx = in_as(c, 2, t);
    return {n + z * (hx - n), cat(c.b, {r, z, n, hx, hn})};
  });
  // (grad_hy, workspace, has_bias) -> (grad_input_gates, grad_hidden_gates,
  // grad_hx, grad_input_bias?, grad_hidden_bias?).
  reg("_thnn_fused_gru_cell_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex go = in_as(c, 0, t);
    auto w = chunks(c.b, in_as(c, 1, t).v, 5);
    const Ex &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
    Ex gz = go * (hx - n) * (1.0 - z) * z;
    Ex gn = go * (1.0 - z) * (1.0 - n * n);
    Ex gr = gn * hn * (1.0 - r) * r;
    Ex gi = cat(c.b, {gr, gz, gn}), gh = cat(c.b, {gr, gz, gn * r});
    V out{gi, gh, go * z, Value{}, Value{}};
    if (c.flag(2)) {
      out[3] = reduce_sum(c.b, gi.v, {0}, false);
      out[4] = reduce_sum(c.b, gh.v, {0}, false);
    }
    return out;
  });
}

}  // namespace
}  // namespace torchtpu::lower
