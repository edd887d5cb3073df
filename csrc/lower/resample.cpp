// Resampling ops: reflection/replication padding and nearest/linear/cubic
// upsampling, with their backward ops. Index-based ops (padding, nearest)
// gather along each spatial dim and scatter-add back; interpolating ops
// contract each spatial dim with an [out, in] weight matrix, whose transpose
// gives the backward.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lower/helpers.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using V = std::vector<Value>;
// A spatial dim and its per-output source index (i64 [out]) or weight matrix.
using Axis = std::pair<int64_t, Value>;

std::optional<double> opt_f64(Ctx& c, int i) {
  if (c.arg(i).isNone()) return std::nullopt;
  return c.f64(i);
}

// ---------------------------------------------------------------- gathers

Value gather_axes(Builder& b, Value x, const std::vector<Axis>& axes) {
  for (const auto& [d, idx] : axes) x = b.index_select(x, idx, d);
  return x;
}

// Transpose of gather_axes: scatter-adds gy back to `in_shape`.
Value scatter_axes(Builder& b, Value gy, const Shape& in_shape, const std::vector<Axis>& axes) {
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
    auto [d, idx] = *it;
    Shape s = gy.shape();
    s[d] = in_shape[d];
    Value bidx = b.broadcast_in_dim(idx, gy.shape(), {d});
    gy = b.scatter_along(b.splat(0, Type{gy.dtype(), s}), bidx, gy, d, true);
  }
  return gy;
}

// Source of each padded position along a dim of size n (pads may be negative).
Value pad_index(Builder& b, int64_t n, int64_t lo, int64_t hi, bool reflect) {
  Ex p = Ex(b, b.iota(Type{DType::I64, {n + lo + hi}}, 0)) - static_cast<double>(lo);
  if (reflect) {
    // Mirror around 0 and around n-1 (without repeating the edge).
    Ex q = p.un("abs");
    return (static_cast<double>(n - 1) - (static_cast<double>(n - 1) - q).un("abs")).v;
  }
  return minimum(maximum(p, p.k(0)), p.k(static_cast<double>(n - 1))).v;
}

// Padding list [lo_last, hi_last, lo_prev, hi_prev, ...] over the last k dims.
std::vector<Axis> pad_axes(Builder& b, const Shape& in, const std::vector<int64_t>& pad,
                           bool reflect) {
  int64_t k = static_cast<int64_t>(pad.size()) / 2, r = static_cast<int64_t>(in.size());
  std::vector<Axis> axes;
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = r - 1 - j;
    axes.emplace_back(d, pad_index(b, in[d], pad[2 * j], pad[2 * j + 1], reflect));
  }
  return axes;
}

// torch's compute_scales_value: 1/scale when given, else in/out (in `t`).
double scale_value(std::optional<double> scale, int64_t in, int64_t out, DType t) {
  if (scale && *scale > 0) {
    double s = 1.0 / *scale;
    return t == DType::F64 ? s : static_cast<float>(s);
  }
  if (t == DType::F64) return static_cast<double>(in) / static_cast<double>(out);
  return static_cast<float>(in) / static_cast<float>(out);
}

// torch's nearest_idx / nearest_exact_idx, computed in float32 as the CPU does.
Value nearest_index(Builder& b, int64_t out, int64_t in, std::optional<double> scale, bool exact) {
  Ex dst(b, b.iota(Type{DType::I64, {out}}, 0));
  if (!exact && out == in) return dst.v;
  if (!exact && out == 2 * in) return (dst / 2.0).v;
  Ex f = dst.to(DType::F32);
  if (exact) f = f + 0.5;
  Ex src = f * scale_value(scale, in, out, DType::F32);
  return minimum(src.un("floor").to(DType::I64), dst.k(static_cast<double>(in - 1))).v;
}

// Upsampling args: output sizes of the last k dims and per-dim scales at
// argument positions [first, first + k).
std::vector<Axis> nearest_axes(Ctx& c, const Shape& in, const Shape& out, int first, int64_t k,
                               bool exact) {
  int64_t r = static_cast<int64_t>(in.size());
  std::vector<Axis> axes;
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = r - k + j;
    axes.emplace_back(d, nearest_index(c.b, out[d], in[d], opt_f64(c, first + j), exact));
  }
  return axes;
}

// ---------------------------------------------------------------- weights

// [out, in] matrix with w_k at (o, idx_k[o]); taps hitting one column add up.
Value tap_matrix(Builder& b, int64_t out, int64_t in, const std::vector<std::pair<Ex, Ex>>& taps) {
  Ex pos(b, b.iota(Type{DType::I64, {out, in}}, 1));
  std::optional<Ex> m;
  for (const auto& [idx, w] : taps) {
    Ex i(b, b.broadcast_in_dim(idx, pos.v.shape(), {0}));
    Ex wb(b, b.broadcast_in_dim(w, pos.v.shape(), {0}));
    Ex term = where(pos.cmp(Cmp::EQ, i), wb, wb.k(0));
    m = m ? *m + term : term;
  }
  return m->v;
}

// Source coordinate of each output position [out] in `t` (torch's
// area_pixel_compute_scale / area_pixel_compute_source_index).
Ex source_coord(Builder& b, int64_t out, int64_t in, bool align, std::optional<double> scale,
                bool cubic, DType t) {
  double s = 0.0;
  if (!align) {
    s = scale_value(scale, in, out, t);
  } else if (out > 1) {
    s = t == DType::F64 ? static_cast<double>(in - 1) / static_cast<double>(out - 1)
                        : static_cast<float>(in - 1) / static_cast<float>(out - 1);
  }
  Ex dst = Ex(b, b.iota(Type{t, {out}}, 0));
  if (align) return dst * s;
  Ex src = (dst + 0.5) * s - 0.5;
  return cubic ? src : maximum(src, src.k(0));
}

// Linear interpolation weights; identity when sizes match (as torch).
Value linear_matrix(Builder& b, int64_t out, int64_t in, bool align, std::optional<double> scale,
                    DType t) {
  Ex dst(b, b.iota(Type{DType::I64, {out}}, 0));
  Ex one(b, b.splat(1, Type{t, {out}}));
  if (out == in) return tap_matrix(b, out, in, {{dst, one}});
  Ex real = source_coord(b, out, in, align, scale, false, t);
  // guard_index_and_lambda: index clamped to in-1, lambda to [0, 1].
  Ex i0 = minimum(real.un("floor").to(DType::I64), dst.k(static_cast<double>(in - 1)));
  Ex lambda = minimum(maximum(real - i0.to(t), one.k(0)), one);
  Ex i1 = i0 + where(i0.cmp(Cmp::LT, i0.k(static_cast<double>(in - 1))), i0.k(1), i0.k(0));
  return tap_matrix(b, out, in, {{i0, one - lambda}, {i1, lambda}});
}

// Bicubic weights (A = -0.75) over 4 taps with clamped indices.
Value cubic_matrix(Builder& b, int64_t out, int64_t in, bool align, std::optional<double> scale,
                   DType t) {
  const double a = -0.75;
  Ex dst(b, b.iota(Type{DType::I64, {out}}, 0));
  Ex real = source_coord(b, out, in, align, scale, true, t);
  Ex i0 = minimum(real.un("floor").to(DType::I64), dst.k(static_cast<double>(in - 1)));
  Ex x = minimum(maximum(real - i0.to(t), real.k(0)), real.k(1));
  auto cc1 = [&](Ex v) { return ((v * (a + 2) - (a + 3)) * v) * v + 1.0; };
  auto cc2 = [&](Ex v) { return ((v * a - 5 * a) * v + 8 * a) * v - 4 * a; };
  Ex x2 = 1.0 - x;
  Ex w[4] = {cc2(x + 1.0), cc1(x), cc1(x2), cc2(x2 + 1.0)};
  std::vector<std::pair<Ex, Ex>> taps;
  for (int k = 0; k < 4; ++k) {
    Ex idx = i0 + static_cast<double>(k - 1);
    idx = minimum(maximum(idx, idx.k(0)), idx.k(static_cast<double>(in - 1)));
    taps.emplace_back(idx, w[k]);
  }
  return tap_matrix(b, out, in, taps);
}

// Antialiased weights (torch's _compute_weights_aa, PIL style): a filter
// widened by the downscale factor, each row normalized to sum 1.
Value aa_matrix(Builder& b, int64_t out, int64_t in, bool align, std::optional<double> scale,
                bool cubic, DType t) {
  double s = 0.0;
  if (!align) {
    s = scale_value(scale, in, out, t);
  } else if (out > 1) {
    s = static_cast<float>(in - 1) / static_cast<float>(out - 1);
  }
  double interp = cubic ? 4.0 : 2.0;
  double support = s >= 1.0 ? interp * 0.5 * s : interp * 0.5;
  double inv = s >= 1.0 ? 1.0 / s : 1.0;
  Type mt{t, {out, in}};
  Ex o(b, b.iota(mt, 0)), i(b, b.iota(mt, 1));
  Ex center = (o + 0.5) * s;
  // Truncation of a value below 1 is 0 after the clamp, so floor is exact.
  Ex lo = maximum((center - support + 0.5).un("floor"), o.k(0));
  Ex hi = minimum((center + support + 0.5).un("floor"), o.k(static_cast<double>(in)));
  Ex inside(b, b.binary("and", i.cmp(Cmp::GE, lo), i.cmp(Cmp::LT, hi)));
  Ex x = ((i - center + 0.5) * inv).un("abs");
  Ex w = x.k(0);
  if (cubic) {
    const double a = -0.5;
    Ex w1 = ((x * (a + 2) - (a + 3)) * x) * x + 1.0;
    Ex w2 = ((x * a - 5 * a) * x + 8 * a) * x - 4 * a;
    w = where(x.cmp(Cmp::LT, x.k(1)), w1, where(x.cmp(Cmp::LT, x.k(2)), w2, x.k(0)));
  } else {
    w = maximum(1.0 - x, x.k(0));
  }
  w = where(inside, w, w.k(0));
  Ex total(b, b.broadcast_in_dim(reduce_sum(b, w, {1}, false), mt.shape, {0}));
  return where(total.cmp(Cmp::NE, total.k(0)), w / total, w).v;
}

// Interpolation args: align_corners at `align_arg`, scales after it.
std::vector<Axis> interp_axes(Ctx& c, const Shape& in, const Shape& out, int align_arg, int64_t k,
                              bool cubic, bool aa, DType t) {
  int64_t r = static_cast<int64_t>(in.size());
  bool align = c.flag(align_arg);
  std::vector<Axis> axes;
  for (int64_t j = 0; j < k; ++j) {
    int64_t d = r - k + j;
    auto s = opt_f64(c, align_arg + 1 + static_cast<int>(j));
    if (aa) {
      axes.emplace_back(d, aa_matrix(c.b, out[d], in[d], align, s, cubic, t));
      continue;
    }
    axes.emplace_back(d, cubic ? cubic_matrix(c.b, out[d], in[d], align, s, t)
                               : linear_matrix(c.b, out[d], in[d], align, s, t));
  }
  return axes;
}

// ---------------------------------------------------------------- rules

void reg_pad(const std::string& name, bool reflect,
             std::source_location loc = std::source_location::current()) {
  // (self, padding)
  reg_at(loc, name, [reflect](Ctx& c) -> V {
    Value x = c.in(0);
    return {gather_axes(c.b, x, pad_axes(c.b, x.shape(), c.ints(1), reflect))};
  });
  // (grad_output, self, padding)
  reg_at(loc, name + "_backward", [reflect](Ctx& c) -> V {
    Builder& b = c.b;
    const Shape& in = c.out(0).shape;
    Value gy = b.convert(c.in(0), compute_dtype(c.out(0).dtype));
    return {scatter_axes(b, gy, in, pad_axes(b, in, c.ints(2), reflect))};
  });
}

void reg_nearest(const std::string& name, int64_t k, bool exact,
                 std::source_location loc = std::source_location::current()) {
  // (self, output_size, scales...)
  reg_at(loc, name, [k, exact](Ctx& c) -> V {
    Value x = c.in(0);
    return {gather_axes(c.b, x, nearest_axes(c, x.shape(), c.out(0).shape, 2, k, exact))};
  });
  // (grad_output, output_size, input_size, scales...)
  reg_at(loc, name + "_backward", [k, exact](Ctx& c) -> V {
    Builder& b = c.b;
    const Shape& in = c.out(0).shape;
    Value gy = b.convert(c.in(0), compute_dtype(c.out(0).dtype));
    return {scatter_axes(b, gy, in, nearest_axes(c, in, gy.shape(), 3, k, exact))};
  });
}

void reg_interp(const std::string& name, int64_t k, bool cubic, bool aa = false,
                std::source_location loc = std::source_location::current()) {
  // (self, output_size, align_corners, scales...)
  reg_at(loc, name, [k, cubic, aa](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(0), t);
    for (const auto& [d, m] : interp_axes(c, x.shape(), c.out(0).shape, 2, k, cubic, aa, t))
      x = contract(b, x, d, m, 1);
    return {x};
  });
  // (grad_output, output_size, input_size, align_corners, scales...)
  reg_at(loc, name + "_backward", [k, cubic, aa](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value g = b.convert(c.in(0), t);
    for (const auto& [d, m] : interp_axes(c, c.out(0).shape, g.shape(), 3, k, cubic, aa, t))
      g = contract(b, g, d, m, 0);
    return {g};
  });
}

TPU_LOWERING(resample) {
  for (int64_t k = 1; k <= 3; ++k) {
    std::string dims = std::to_string(k) + "d";
    reg_pad("reflection_pad" + dims, true);
    reg_pad("replication_pad" + dims, false);
    reg_nearest("upsample_nearest" + dims, k, false);
    reg_nearest("_upsample_nearest_exact" + dims, k, true);
  }
  reg_interp("upsample_linear1d", 1, false);
  reg_interp("upsample_bilinear2d", 2, false);
  reg_interp("upsample_trilinear3d", 3, false);
  reg_interp("upsample_bicubic2d", 2, true);
  reg_interp("_upsample_bilinear2d_aa", 2, false, true);
  reg_interp("_upsample_bicubic2d_aa", 2, true, true);
}

}  // namespace
}  // namespace torchtpu::lower
