// grid_sampler_2d/3d and their backward (bilinear/trilinear and nearest;
// zeros, border and reflection padding): grid coordinates become source
// positions, taps are gathered from each flattened plane and, backward,
// scattered back into it.
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using V = std::vector<Value>;

Ex is_neg_(const Ex& x) { return x.cmp(Cmp::LT, x.k(0)); }

// Source coordinate for normalized grid values g over `size` pixels, and its
// derivative with respect to g.
std::pair<Ex, Ex> source_coord(const Ex& g, int64_t size, int64_t padding, bool align) {
  double sz = static_cast<double>(size);
  double scale = align ? (sz - 1) / 2 : sz / 2;
  Ex x = align ? (g + 1.0) * scale : ((g + 1.0) * sz - 1.0) / 2.0;
  Ex d = g.k(scale);
  auto clip = [&](Ex& v, Ex& dv) {
    Ex inside = v.cmp(Cmp::GT, v.k(0)).bin("and", v.cmp(Cmp::LT, v.k(sz - 1)));
    dv = where(inside, dv, dv.k(0));
    v = minimum(maximum(v, v.k(0)), v.k(sz - 1));
  };
  if (padding == 1) {
    clip(x, d);
  } else if (padding == 2) {
    double lo = align ? 0 : -1, hi = align ? 2 * (sz - 1) : 2 * sz - 1;
    if (lo == hi) {
      x = x.k(0);
      d = d.k(0);
    } else {
      double mn = lo / 2, span = (hi - lo) / 2;
      Ex in = x - mn;
      d = where(is_neg_(in), -d, d);
      in = in.un("abs");
      Ex flips = (in / span).un("floor");
      Ex extra = in - flips * span;
      Ex odd = (flips * 0.5).un("floor").cmp(Cmp::NE, flips * 0.5);
      x = where(odd, span - extra + mn, extra + mn);
      d = where(odd, -d, d);
    }
    clip(x, d);
  }
  return {x, d};
}
struct Taps {
  std::vector<Ex> pos;              // flat position in the plane, I64 [N, P]
  std::vector<Ex> weight;           // [N, P]
  std::vector<std::vector<Ex>> dw;  // weight derivative by each source coordinate
  std::vector<Ex> valid;            // in-bounds
};
// Taps of source coordinates `at` in grid order (x over the last spatial dim,
// then y, then z) of a plane with those `sizes`: the nearest pixel, or the
// 2^d corners of the (bi/tri)linear cell.
Taps taps(const std::vector<Ex>& at, const std::vector<int64_t>& sizes, int64_t mode) {
  const size_t nd = at.size();
  Taps t;
  std::vector<Ex> base, frac;
  for (const Ex& a : at) {
    base.push_back(mode == 1 ? a.un("round_nearest_even") : a.un("floor"));
    frac.push_back(a - base.back());
  }
  const size_t corners = mode == 1 ? 1 : size_t{1} << nd;
  for (size_t corner = 0; corner < corners; ++corner) {
    Ex pos = base[0].k(0), ok = base[0].cmp(Cmp::EQ, base[0]);
    std::vector<Ex> w;  // per-dim weight: frac for the upper corner, 1 - frac below
    double stride = 1;
    for (size_t k = 0; k < nd; ++k) {
      bool up = (corner >> k) & 1;
      Ex i = up ? base[k] + 1.0 : base[k];
      double hi = static_cast<double>(sizes[k] - 1);
      ok = ok.bin("and", i.cmp(Cmp::GE, i.k(0))).bin("and", i.cmp(Cmp::LE, i.k(hi)));
      pos = pos + minimum(maximum(i, i.k(0)), i.k(hi)) * stride;
      stride *= static_cast<double>(sizes[k]);
      w.push_back(mode == 1 ? frac[k].k(1) : up ? frac[k] : 1.0 - frac[k]);
    }
    Ex weight = w[0];
    for (size_t k = 1; k < nd; ++k) weight = weight * w[k];
    std::vector<Ex> dw;
    for (size_t j = 0; j < nd; ++j) {
      Ex d = frac[0].k(mode == 1 ? 0 : ((corner >> j) & 1) ? 1 : -1);
      for (size_t k = 0; k < nd; ++k)
        if (k != j) d = d * w[k];
      dw.push_back(d);
    }
    t.pos.push_back(pos.to(DType::I64));
    t.weight.push_back(weight);
    t.dw.push_back(std::move(dw));
    t.valid.push_back(ok);
  }
  return t;
}

// Per-(n, c) planes [N, C, S] gathered at positions [N, P] -> [N, C, P].
Ex gather_planes(Builder& b, const Ex& planes, const Ex& pos) {
  const Shape& s = planes.v.shape();
  int64_t p = pos.v.shape()[1];
  Shape ps{s[0], s[1], p};
  Value idx = b.broadcast_in_dim(pos.v, ps, {0, 2});
  return Ex(b, b.take_along(planes.v, idx, 2));
}

// Input [N, C, spatial...] as planes [N, C, S]; grid [N, out spatial..., d] as
// source coordinates [N, P] per grid component, with their derivatives.
struct Prepared {
  Ex planes;
  std::vector<Ex> at, dat;     // grid order
  std::vector<int64_t> sizes;  // grid order
  Shape grid_shape;
  int64_t n, c, plane, np;
};
Prepared prepare(Ctx& c, int in_arg, int grid_arg, int pad_arg, int align_arg, DType t) {
  Builder& b = c.b;
  Value x = b.convert(c.in(in_arg), t), g = b.convert(c.in(grid_arg), t);
  const Shape &xs = x.shape(), &gs = g.shape();
  const int64_t nd = x.rank() - 2;
  Prepared p{Ex(b, x), {}, {}, {}, gs, xs[0], xs[1], 1, 1};
  for (int64_t k = 0; k < nd; ++k) {
    p.plane *= xs[2 + k];
    p.np *= gs[1 + k];
    p.sizes.push_back(xs[x.rank() - 1 - k]);
  }
  p.planes = Ex(b, b.reshape(x, {p.n, p.c, p.plane}));
  for (int64_t k = 0; k < nd; ++k) {
    Shape lo(gs.size(), 0), hi = gs;
    lo.back() = k;
    hi.back() = k + 1;
    Ex gk(b, b.reshape(b.slice(g, lo, hi, {}), {p.n, p.np}));
    auto [at, d] = source_coord(gk, p.sizes[k], c.i64(pad_arg), c.flag(align_arg));
    p.at.push_back(at);
    p.dat.push_back(d);
  }
  return p;
}
Ex bc(Builder& b, const Ex& v, int64_t n, int64_t ch, int64_t np) {  // [N, P] -> [N, C, P]
  return Ex(b, b.broadcast_in_dim(v.v, {n, ch, np}, {0, 2}));
}

// (input, grid, interpolation_mode, padding_mode, align_corners)
Rule sampler(const char* name) {
  return [name](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    int64_t mode = c.i64(2);
    if (mode == 2)
      throw hlo::BuildError(std::string("[lower] ") + name + ": bicubic is not supported yet");
    if (c.out(0).numel() == 0 || c.in(0).type.numel() == 0) return {b.splat(0, c.out(0))};
    Prepared p = prepare(c, 0, 1, 3, 4, t);
    Taps tp = taps(p.at, p.sizes, mode);
    Ex out(b, b.splat(0, Type{t, {p.n, p.c, p.np}}));
    for (size_t k = 0; k < tp.pos.size(); ++k) {
      Ex v = gather_planes(b, p.planes, tp.pos[k]);
      Ex wk = where(tp.valid[k], tp.weight[k], tp.weight[k].k(0));
      out = out + v * bc(b, wk, p.n, p.c, p.np);
    }
    return {b.reshape(out.v, c.out(0).shape)};
  };
}

// (grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
//  output_mask) -> (grad_input, grad_grid)
Rule sampler_backward(const char* name) {
  return [name](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    int64_t mode = c.i64(3);
    if (mode == 2)
      throw hlo::BuildError(std::string("[lower] ") + name + ": bicubic is not supported yet");
    if (c.in(0).type.numel() == 0 || c.in(1).type.numel() == 0)
      return {b.splat(0, c.out(0)), b.splat(0, c.out(1))};
    Prepared p = prepare(c, 1, 2, 4, 5, t);
    const size_t nd = p.at.size();
    Ex g(b, b.reshape(b.convert(c.in(0), t), {p.n, p.c, p.np}));
    Taps tp = taps(p.at, p.sizes, mode);
    Ex gin(b, b.splat(0, Type{t, {p.n * p.c * p.plane}}));
    std::vector<Ex> gs(nd, Ex(b, b.splat(0, Type{t, {p.n, p.np}})));
    Type plane_t{DType::I64, {p.n, p.c, p.np}};
    Ex base = (Ex(b, b.iota(plane_t, 0)) * static_cast<double>(p.c) + Ex(b, b.iota(plane_t, 1))) *
              static_cast<double>(p.plane);
    const int64_t flat = p.n * p.c * p.np;
    for (size_t k = 0; k < tp.pos.size(); ++k) {
      Ex ok = tp.valid[k];
      Ex wk = where(ok, tp.weight[k], tp.weight[k].k(0));
      Ex contrib = g * bc(b, wk, p.n, p.c, p.np);
      Ex pos = base + bc(b, tp.pos[k], p.n, p.c, p.np);
      gin = Ex(b,
               b.scatter_flat(gin.v, b.reshape(pos.v, {flat}), b.reshape(contrib.v, {flat}), true));
      if (mode == 0) {
        Ex v = gather_planes(b, p.planes, tp.pos[k]);
        Ex gv(b, reduce_sum(b, (g * v).v, {1}, false));  // [N, P]
        for (size_t j = 0; j < nd; ++j) gs[j] = gs[j] + where(ok, gv * tp.dw[k][j], gv.k(0));
      }
    }
    Shape one = p.grid_shape;
    one.back() = 1;
    std::vector<Value> parts;
    for (size_t j = 0; j < nd; ++j) parts.push_back(b.reshape((gs[j] * p.dat[j]).v, one));
    return {b.reshape(gin.v, c.out(0).shape), b.concatenate(parts, one.size() - 1)};
  };
}

TPU_LOWERING(grid_sample) {
  reg("grid_sampler_2d", sampler("grid_sampler_2d"));
  reg("grid_sampler_3d", sampler("grid_sampler_3d"));
  reg("grid_sampler_2d_backward", sampler_backward("grid_sampler_2d_backward"));
  reg("grid_sampler_3d_backward", sampler_backward("grid_sampler_3d_backward"));
}

}  // namespace
}  // namespace torchtpu::lower
