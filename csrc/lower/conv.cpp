// Convolution (1-3 spatial dims, grouped, transposed) and 2-D pooling, with
// their backward ops: stablehlo.convolution and reduce_window.

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

// ---------------------------------------------------------------- pooling

// Window geometry over the last two dims of an input of rank r (leading dims
// get a window of 1). hi padding is what the meta kernel's output size needs.
struct Pool {
  Shape window, stride, dil, lo, hi;
  int64_t h, w, oh, ow;
};

Pool pool_geom(const Value& x, const Type& out, const std::vector<int64_t>& kernel,
               const std::vector<int64_t>& stride, const std::vector<int64_t>& pad,
               const std::vector<int64_t>& dil) {
  int64_t r = x.rank();
  Shape k = per_dim(kernel, 2, 1), st = stride.empty() ? k : per_dim(stride, 2, 1);
  Shape p = per_dim(pad, 2, 0), d = per_dim(dil, 2, 1);
  Pool g{Shape(r, 1),      Shape(r, 1),      Shape(r, 1),      Shape(r, 0),     Shape(r, 0),
         x.shape()[r - 2], x.shape()[r - 1], out.shape[r - 2], out.shape[r - 1]};
  int64_t in[2] = {g.h, g.w}, o[2] = {g.oh, g.ow};
  for (int i = 0; i < 2; ++i) {
    int64_t j = r - 2 + i;
    g.window[j] = k[i];
    g.stride[j] = st[i];
    g.dil[j] = d[i];
    g.lo[j] = p[i];
    g.hi[j] = std::max<int64_t>(0, (o[i] - 1) * st[i] + d[i] * (k[i] - 1) + 1 - in[i] - p[i]);
  }
  return g;
}

// Divisor of each avg-pool window, [oh, ow] (torch's avg_pool2d rules).
Value avg_divisor(Builder& b, const Pool& g, DType t, bool count_pad) {
  int64_t r = static_cast<int64_t>(g.window.size());
  Shape win{g.window[r - 2], g.window[r - 1]}, st{g.stride[r - 2], g.stride[r - 1]};
  Value zero = b.constant(0, t), cnt;
  if (count_pad) {
    // Padding counts, overhang past it (ceil_mode) does not.
    int64_t ph = g.lo[r - 2], pw = g.lo[r - 1];
    Value ones = b.splat(1, Type{t, {g.h + 2 * ph, g.w + 2 * pw}});
    cnt = b.reduce_window(
        ones, zero, Reducer::Add, win, st, {0, 0},
        {std::max<int64_t>(0, g.hi[r - 2] - ph), std::max<int64_t>(0, g.hi[r - 1] - pw)});
  } else {
    Value ones = b.splat(1, Type{t, {g.h, g.w}});
    cnt = b.reduce_window(ones, zero, Reducer::Add, win, st, {g.lo[r - 2], g.lo[r - 1]},
                          {g.hi[r - 2], g.hi[r - 1]});
  }
  return b.slice(cnt, {0, 0}, {g.oh, g.ow}, {});
}

// Per-window divisor broadcast against a value shaped like the pooled output.
Ex avg_scale(Ctx& c, const Pool& g, DType t, int divisor_arg, bool count_pad) {
  Builder& b = c.b;
  if (!c.is_none(divisor_arg)) return Ex(b, b.constant(static_cast<double>(c.i64(divisor_arg)), t));
  return Ex(b, avg_divisor(b, g, t, count_pad));
}

// Adaptive pooling bins as an averaging matrix [out, in]: bin i covers
// [floor(i*in/out), ceil((i+1)*in/out)).
Value bin_matrix(Builder& b, int64_t out, int64_t in, DType t) {
  Type it{DType::I64, {out, in}};
  Ex i(b, b.iota(it, 0)), pos(b, b.iota(it, 1));
  Ex start = i * static_cast<double>(in) / static_cast<double>(out);
  Ex end = ((i + 1.0) * static_cast<double>(in) + static_cast<double>(out - 1)) /
           static_cast<double>(out);
  Ex inside = Ex(b, b.binary("and", pos.cmp(Cmp::GE, start), pos.cmp(Cmp::LT, end)));
  Ex len = (end - start).to(t);
  return where(inside, len.k(1), len.k(0)) / len;
}

TPU_LOWERING(conv_pooling) {
  // (self, kernel_size, stride, padding, dilation, ceil_mode) -> (out, indices)
  reg("max_pool2d_with_indices", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    int64_t r = x.rank();
    Pool g = pool_geom(x, c.out(0), c.ints(1), c.ints(2), c.ints(3), c.ints(4));
    // Flat position within each H*W plane, as torch reports it.
    Type it{DType::I64, x.shape()};
    Ex idx = Ex(b, b.iota(it, r - 2)) * static_cast<double>(g.w) + Ex(b, b.iota(it, r - 1));
    auto [m, i] = b.reduce_window_argmax(x, idx, g.window, g.stride, g.dil, g.lo, g.hi);
    return {m, i};
  });
  // (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices)
  reg("max_pool2d_with_indices_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = c.in(1), gy = c.in(0);
    int64_t r = x.rank(), hw = x.shape()[r - 2] * x.shape()[r - 1];
    int64_t planes = hw == 0 ? 0 : x.type.numel() / hw;
    int64_t per = gy.shape()[r - 2] * gy.shape()[r - 1];
    // Each gradient adds into its argmax: one flat scatter over all planes.
    Type pt{DType::I64, {planes, per}};
    Ex pos = Ex(b, b.iota(pt, 0)) * static_cast<double>(hw) +
             Ex(b, b.reshape(b.convert(c.in(7), DType::I64), pt.shape));
    Value upd = b.reshape(b.convert(gy, t), pt.shape);
    Value gx = b.scatter_flat(b.splat(0, Type{t, {planes * hw}}), pos, upd, true);
    return {b.reshape(gx, x.shape())};
  });
  // (self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override?)
  reg("avg_pool2d", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(0), t);
    Pool g = pool_geom(x, c.out(0), c.ints(1), c.ints(2), c.ints(3), {});
    Ex sum(b, b.reduce_window(x, b.constant(0, t), Reducer::Add, g.window, g.stride, g.lo, g.hi));
    return {sum / avg_scale(c, g, t, 6, c.flag(5))};
  });
  // (grad_output, self, kernel_size, stride, padding, ceil_mode,
  //  count_include_pad, divisor_override?)
  reg("avg_pool2d_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = c.in(1);
    Ex gy(b, b.convert(c.in(0), t));
    Pool g = pool_geom(x, c.in(0).type, c.ints(2), c.ints(3), c.ints(4), {});
    Value gd = gy / avg_scale(c, g, t, 7, c.flag(6));
    // Each input sums the windows covering it: spread the scaled gradient on
    // the stride grid, then a stride-1 window sum.
    int64_t r = x.rank();
    Shape lo(r, 0), hi(r, 0), interior(r, 0), ones(r, 1);
    int64_t in[2] = {g.h, g.w}, out[2] = {g.oh, g.ow};
    for (int i = 0; i < 2; ++i) {
      int64_t j = r - 2 + i;
      lo[j] = g.window[j] - 1 - g.lo[j];
      hi[j] = in[i] - 1 + g.lo[j] - (out[i] - 1) * g.stride[j];
      interior[j] = g.stride[j] - 1;
    }
    Value z = b.constant(0, t);
    Value spread = b.pad(gd, z, lo, hi, interior);
    return {b.reduce_window(spread, z, Reducer::Add, g.window, ones, {}, {})};
  });
  // (self, output_size)
  reg("_adaptive_avg_pool2d", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(0), t);
    int64_t r = x.rank(), h = x.shape()[r - 2], w = x.shape()[r - 1];
    int64_t oh = c.out(0).shape[r - 2], ow = c.out(0).shape[r - 1];
    if (oh > 0 && ow > 0 && h % oh == 0 && w % ow == 0) {
      // Equal, disjoint bins: one window sum.
      Shape win(r, 1);
      win[r - 2] = h / oh;
      win[r - 1] = w / ow;
      Ex sum(b, b.reduce_window(x, b.constant(0, t), Reducer::Add, win, win, {}, {}));
      return {sum / static_cast<double>(win[r - 2] * win[r - 1])};
    }
    // Uneven (overlapping) bins: separable averaging matrices.
    Value y = contract(b, x, r - 1, bin_matrix(b, ow, w, t), 1);
    return {contract(b, y, r - 2, bin_matrix(b, oh, h, t), 1)};
  });
  // (grad_output, self)
  reg("_adaptive_avg_pool2d_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value gy = b.convert(c.in(0), t), x = c.in(1);
    int64_t r = x.rank(), h = x.shape()[r - 2], w = x.shape()[r - 1];
    int64_t oh = gy.shape()[r - 2], ow = gy.shape()[r - 1];
    if (oh > 0 && ow > 0 && h % oh == 0 && w % ow == 0) {
      int64_t kh = h / oh, kw = w / ow;
      Shape big(gy.shape().begin(), gy.shape().end() - 2);
      std::vector<int64_t> dims;
      for (int64_t i = 0; i < r - 2; ++i) dims.push_back(i);
      big.insert(big.end(), {oh, kh, ow, kw});
      dims.insert(dims.end(), {r - 2, r});
      Ex scaled = Ex(b, gy) / static_cast<double>(kh * kw);
      return {b.reshape(b.broadcast_in_dim(scaled, big, dims), x.shape())};
    }
    Value y = contract(b, gy, r - 1, bin_matrix(b, ow, w, t), 0);
    return {contract(b, y, r - 2, bin_matrix(b, oh, h, t), 0)};
  });
}

}  // namespace

}  // namespace torchtpu::lower
