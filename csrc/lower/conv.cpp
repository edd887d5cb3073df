// Convolution (1-3 spatial dims, grouped, transposed) and its backward op:
// stablehlo.convolution (pooling is in pool.cpp).

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lower/helpers.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;
using Pads = std::vector<std::pair<int64_t, int64_t>>;

// A per-spatial-dim int list; torch passes one value for all dims at times.
Shape per_dim(const std::vector<int64_t>& v, size_t n, int64_t fill) {
  if (v.empty()) return Shape(n, fill);
  if (v.size() == 1) return Shape(n, v[0]);
  if (v.size() != n) throw hlo::BuildError("[lower] expected " + std::to_string(n) + " values");
  return v;
}

Shape spatial(const Value& v) { return Shape(v.shape().begin() + 2, v.shape().end()); }

std::vector<int64_t> all_but(int64_t rank, int64_t skip) {
  std::vector<int64_t> d;
  for (int64_t i = 0; i < rank; ++i)
    if (i != skip) d.push_back(i);
  return d;
}

// Moves dim 1 (features) to dim 0 and back: [N, C, ...] <-> [C, N, ...].
Value swap01(Builder& b, Value x) {
  std::vector<int64_t> perm{1, 0};
  for (int64_t i = 2; i < x.rank(); ++i) perm.push_back(i);
  return b.transpose(x, perm);
}

// [G*A, B, k...] -> [G*B, A, k...] spatially reversed: the kernel of the
// adjoint (transposed) convolution, per group.
Value flip_kernel(Builder& b, Value w, int64_t groups) {
  const Shape& s = w.shape();
  int64_t a = s[0] / groups, bb = s[1];
  Shape grouped{groups, a, bb};
  grouped.insert(grouped.end(), s.begin() + 2, s.end());
  std::vector<int64_t> perm{0, 2, 1}, rev;
  for (int64_t i = 3; i < static_cast<int64_t>(grouped.size()); ++i) perm.push_back(i);
  Value t = b.transpose(b.reshape(w, grouped), perm);
  Shape out{groups * bb, a};
  out.insert(out.end(), s.begin() + 2, s.end());
  for (int64_t i = 2; i < w.rank(); ++i) rev.push_back(i);
  return b.reverse(b.reshape(t, out), rev);
}

struct ConvArgs {
  Shape stride, pad, dil;
  int64_t groups;
};

// Transposed convolution of x with a torch transposed-conv weight
// [C_in, C_out/groups, k...], producing `out_size` spatially: the input is
// dilated by the stride and the kernel flipped; output_padding (or any other
// size slack) lands on the high side.
Value conv_transposed(Builder& b, Value x, Value w, const ConvArgs& a, const Shape& out_size) {
  Shape in = spatial(x), k = spatial(w);
  Pads pads;
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t span = a.dil[i] * (k[i] - 1);
    int64_t lo = span - a.pad[i];
    pads.emplace_back(lo, out_size[i] - 1 - (in[i] - 1) * a.stride[i] - lo + span);
  }
  return b.convolution(x, flip_kernel(b, w, a.groups), {}, pads, a.stride, a.dil, a.groups, 1,
                       x.dtype());
}

// Regular convolution sized to exactly `out_size` (high padding absorbs slack).
Value conv_sized(Builder& b, Value x, Value w, const ConvArgs& a, const Shape& out_size) {
  Shape in = spatial(x), k = spatial(w);
  Pads pads;
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t span = a.dil[i] * (k[i] - 1) + 1;
    pads.emplace_back(a.pad[i], (out_size[i] - 1) * a.stride[i] + span - in[i] - a.pad[i]);
  }
  return b.convolution(x, w, a.stride, pads, {}, a.dil, a.groups, 1, x.dtype());
}

// d(conv(x, w))/dw as a convolution of x with dy that contracts the batch:
// x's channels become the batch (split into groups by batch_group_count) and
// dy's channels the output features. Yields [O, C/groups, k...].
Value conv_grad_weight(Builder& b, Value x, Value dy, const ConvArgs& a, const Shape& k) {
  Shape in = spatial(x), out = spatial(dy);
  Pads pads;
  for (size_t i = 0; i < in.size(); ++i)
    pads.emplace_back(a.pad[i],
                      (k[i] - 1) * a.dil[i] + (out[i] - 1) * a.stride[i] + 1 - in[i] - a.pad[i]);
  Value gw =
      b.convolution(swap01(b, x), swap01(b, dy), a.dil, pads, {}, a.stride, 1, a.groups, x.dtype());
  return swap01(b, gw);
}

// Depthwise convolutions (groups == channels, weight [C * m, 1, k...]: m
// filters per channel) run as a sum over the kernel taps of strided input
// slices times per-channel weights, on the input with each channel repeated
// m times. XLA:CPU runs grouped convolutions as generic loops (MobileNet's
// 3x3 ones took 10-14x torch's kernel); the tap sums fuse into elementwise
// loops, and so do both gradients.
constexpr int64_t kMaxTaps = 49;

bool depthwise(const Value& x, const Value& w, const ConvArgs& a) {
  const Shape& ws = w.shape();
  int64_t taps = 1;
  for (size_t i = 2; i < ws.size(); ++i) taps *= ws[i];
  return x.rank() >= 3 && a.groups > 1 && a.groups == x.shape()[1] && ws[0] % a.groups == 0 &&
         ws[1] == 1 && taps <= kMaxTaps;
}

// [N, C, S...] with each channel repeated m times: [N, C * m, S...].
Value repeat_channels(Builder& b, Value x, int64_t m) {
  if (m == 1) return x;
  const Shape& s = x.shape();
  Shape wide{s[0], s[1], m}, to{s[0], s[1] * m};
  std::vector<int64_t> dims{0, 1};
  for (size_t i = 2; i < s.size(); ++i) {
    wide.push_back(s[i]);
    to.push_back(s[i]);
    dims.push_back(int64_t(i) + 1);
  }
  return b.reshape(b.broadcast_in_dim(x, wide, dims), to);
}

// Every tap's kernel offsets, row-major over the kernel dims.
std::vector<Shape> kernel_taps(const Shape& k) {
  std::vector<Shape> taps{Shape{}};
  for (int64_t size : k) {
    std::vector<Shape> next;
    for (const Shape& t : taps)
      for (int64_t j = 0; j < size; ++j) {
        next.push_back(t);
        next.back().push_back(j);
      }
    taps = std::move(next);
  }
  return taps;
}

// The input extent one tap's window of `out` outputs covers at `stride`.
int64_t tap_extent(int64_t out, int64_t stride) { return out == 0 ? 0 : (out - 1) * stride + 1; }

// Padded input length per spatial dim that every tap's window of `out` reads.
Shape window_span(const Shape& out, const Shape& k, const ConvArgs& a) {
  Shape need;
  for (size_t i = 0; i < out.size(); ++i)
    need.push_back(out[i] == 0 ? 0 : tap_extent(out[i], a.stride[i]) + (k[i] - 1) * a.dil[i]);
  return need;
}

// x zero-padded (or cropped: negative high padding) to the low pad then `len`.
Value pad_to(Builder& b, Value x, const ConvArgs& a, const Shape& len) {
  Shape lo{0, 0}, hi{0, 0}, interior(x.rank(), 0);
  const Shape in = spatial(x);
  for (size_t i = 0; i < in.size(); ++i) {
    lo.push_back(a.pad[i]);
    hi.push_back(len[i] - in[i] - a.pad[i]);
  }
  return b.pad(x, b.constant(0, x.dtype()), lo, hi, interior);
}

// Tap `t`'s strided window of the padded input: [N, C, out...].
Value tap_window(Builder& b, Value xp, const Shape& t, const ConvArgs& a, const Shape& out) {
  Shape start{0, 0}, limit{xp.shape()[0], xp.shape()[1]}, strides{1, 1};
  for (size_t i = 0; i < t.size(); ++i) {
    start.push_back(t[i] * a.dil[i]);
    limit.push_back(start.back() + tap_extent(out[i], a.stride[i]));
    strides.push_back(a.stride[i]);
  }
  return b.slice(xp, start, limit, strides);
}

// Tap `t`'s weights as [1, C, 1...] (broadcast over batch and space).
Value tap_weight(Builder& b, Value w, const Shape& t) {
  Shape start{0, 0}, limit{w.shape()[0], 1}, strides(w.rank(), 1), to{1, w.shape()[0]};
  for (int64_t j : t) {
    start.push_back(j);
    limit.push_back(j + 1);
    to.push_back(1);
  }
  return b.reshape(b.slice(w, start, limit, strides), to);
}

// The input as the taps read it: channels repeated to `channels`, padded to
// the span of the windows of `out` (the forward's and grad_weight's input).
Value tap_input(Builder& b, Value x, int64_t channels, const ConvArgs& a, const Shape& out,
                const Shape& k) {
  x = repeat_channels(b, x, channels / x.shape()[1]);
  return pad_to(b, x, a, window_span(out, k, a));
}

Value depthwise_conv(Builder& b, Value x, Value w, const ConvArgs& a, const Shape& out) {
  const Shape k = spatial(w);
  Value xp = tap_input(b, x, w.shape()[0], a, out, k);
  std::optional<Ex> y;
  for (const Shape& t : kernel_taps(k)) {
    Ex term = Ex(b, tap_window(b, xp, t, a, out)) * Ex(b, tap_weight(b, w, t));
    y = y ? *y + term : term;
  }
  return *y;
}

// The adjoint: each tap's gy * w lands back on its window (interior padding
// undoes the stride), summed in padded coordinates, then the padding dropped
// and a channel's m repeats summed. `x`: the input's shape [N, C, in...].
Value depthwise_grad_input(Builder& b, Value gy, Value w, const ConvArgs& a, const Shape& x) {
  const Shape in(x.begin() + 2, x.end());
  const Shape out = spatial(gy), k = spatial(w), need = window_span(out, k, a);
  Shape len;
  for (size_t i = 0; i < in.size(); ++i) len.push_back(std::max(need[i], a.pad[i] + in[i]));
  std::optional<Ex> sum;
  for (const Shape& t : kernel_taps(k)) {
    Shape lo{0, 0}, hi{0, 0}, interior{0, 0};
    for (size_t i = 0; i < t.size(); ++i) {
      const int64_t first = t[i] * a.dil[i];
      lo.push_back(first);
      hi.push_back(len[i] - first - tap_extent(out[i], a.stride[i]));
      interior.push_back(out[i] == 0 ? 0 : a.stride[i] - 1);
    }
    Value term = Ex(b, gy) * Ex(b, tap_weight(b, w, t));
    Ex placed(b, b.pad(term, b.constant(0, gy.dtype()), lo, hi, interior));
    sum = sum ? *sum + placed : placed;
  }
  Shape start{0, 0}, limit{gy.shape()[0], gy.shape()[1]}, strides(gy.rank(), 1);
  for (size_t i = 0; i < in.size(); ++i) {
    start.push_back(a.pad[i]);
    limit.push_back(a.pad[i] + in[i]);
  }
  Value g = b.slice(*sum, start, limit, strides);
  const int64_t m = w.shape()[0] / x[1];
  if (m == 1) return g;
  Shape split{x[0], x[1], m};
  split.insert(split.end(), in.begin(), in.end());
  return reduce_sum(b, b.reshape(g, split), {2}, false);
}

// Per tap, the sum over batch and space of gy times the tap's window: [C, 1, k...].
// All taps' sums are variadic reduces (reduce_sums): a reduce per tap was two
// XLA:CPU kernels each and most of a MobileNet backward step's compile time.
Value depthwise_grad_weight(Builder& b, Value x, Value gy, const ConvArgs& a, const Shape& k) {
  const Shape out = spatial(gy);
  Value xp = tap_input(b, x, gy.shape()[1], a, out, k);
  std::vector<Value> prods;
  for (const Shape& t : kernel_taps(k))
    prods.push_back(Ex(b, tap_window(b, xp, t, a, out)) * Ex(b, gy));
  std::vector<Value> per_tap;
  for (Value s : reduce_sums(b, prods, all_but(gy.rank(), 1)))
    per_tap.push_back(b.reshape(s, {gy.shape()[1], 1}));
  Shape to{gy.shape()[1], 1};
  to.insert(to.end(), k.begin(), k.end());
  return b.reshape(b.concatenate(per_tap, 1), to);
}

ConvArgs conv_args(Ctx& c, int first, size_t n) {
  return {per_dim(c.ints(first), n, 1), per_dim(c.ints(first + 1), n, 0),
          per_dim(c.ints(first + 2), n, 1), c.i64(first + 5)};
}

TPU_LOWERING(conv_convolution) {
  // (input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
  reg("convolution", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(0), t), w = b.convert(c.in(1), t);
    ConvArgs a = conv_args(c, 3, static_cast<size_t>(x.rank() - 2));
    Shape out_size(c.out(0).shape.begin() + 2, c.out(0).shape.end());
    Value y = c.flag(6)            ? conv_transposed(b, x, w, a, out_size)
              : depthwise(x, w, a) ? depthwise_conv(b, x, w, a, out_size)
                                   : conv_sized(b, x, w, a, out_size);
    if (!c.is_none(2)) {
      Shape bs(y.rank(), 1);
      bs[1] = y.shape()[1];
      y = Ex(b, y) + Ex(b, b.reshape(b.convert(c.in(2), t), bs));
    }
    return {y};
  });
  // (grad_output, input, weight, bias_sizes?, stride, padding, dilation,
  //  transposed, output_padding, groups, output_mask[3])
  reg("convolution_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value gy = b.convert(c.in(0), t), x = b.convert(c.in(1), t), w = b.convert(c.in(2), t);
    ConvArgs a = conv_args(c, 4, static_cast<size_t>(x.rank() - 2));
    auto mask = c.arg(10).toBoolList();
    bool transposed = c.flag(7);
    const bool dw = !transposed && depthwise(x, w, a);
    V out;
    if (!mask.get(0)) {
      out.push_back(b.splat(0, c.out(0)));
    } else if (dw) {
      out.push_back(depthwise_grad_input(b, gy, w, a, x.shape()));
    } else if (!transposed) {
      out.push_back(conv_transposed(b, gy, w, a, spatial(x)));
    } else {
      // The adjoint of a transposed convolution is the regular one.
      out.push_back(conv_sized(b, gy, w, a, spatial(x)));
    }
    if (!mask.get(1))
      out.push_back(b.splat(0, c.out(1)));
    else if (dw)
      out.push_back(depthwise_grad_weight(b, x, gy, a, spatial(w)));
    else if (!transposed)
      out.push_back(conv_grad_weight(b, x, gy, a, spatial(w)));
    else
      out.push_back(conv_grad_weight(b, gy, x, a, spatial(w)));
    out.push_back(mask.get(2) ? reduce_sum(b, gy, all_but(gy.rank(), 1), false)
                              : b.splat(0, c.out(2)));
    return out;
  });
}

}  // namespace

}  // namespace torchtpu::lower
