// Convolution (1-3 spatial dims, grouped, transposed) and its backward op:
// stablehlo.convolution (pooling is in pool.cpp).

#include <algorithm>
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
    Value y = c.flag(6) ? conv_transposed(b, x, w, a, out_size) : conv_sized(b, x, w, a, out_size);
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
    V out;
    if (!mask.get(0)) {
      out.push_back(b.splat(0, c.out(0)));
    } else if (!transposed) {
      out.push_back(conv_transposed(b, gy, w, a, spatial(x)));
    } else {
      // The adjoint of a transposed convolution is the regular one.
      out.push_back(conv_sized(b, gy, w, a, spatial(x)));
    }
    if (!mask.get(1))
      out.push_back(b.splat(0, c.out(1)));
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
