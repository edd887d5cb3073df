// grid_sampler_2d and its backward (bilinear and nearest; zeros, border and
// reflection padding): grid coordinates become source positions, taps are
// gathered from each [H*W] plane and, backward, scattered back into it.
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
  std::vector<Ex> pos;       // flat position in the plane, I64 [N, P]
  std::vector<Ex> weight;    // [N, P]
  std::vector<Ex> dwx, dwy;  // weight derivatives by source x and y
  std::vector<Ex> valid;     // in-bounds
};
Taps taps(const Ex& ix, const Ex& iy, int64_t h, int64_t w, int64_t mode) {
  Taps t;
  auto add = [&](const Ex& xi, const Ex& yi, const Ex& wt, const Ex& dx, const Ex& dy) {
    Ex ok = xi.cmp(Cmp::GE, xi.k(0))
                .bin("and", xi.cmp(Cmp::LE, xi.k(static_cast<double>(w - 1))))
                .bin("and", yi.cmp(Cmp::GE, yi.k(0)))
                .bin("and", yi.cmp(Cmp::LE, yi.k(static_cast<double>(h - 1))));
    Ex cx = minimum(maximum(xi, xi.k(0)), xi.k(static_cast<double>(w - 1)));
    Ex cy = minimum(maximum(yi, yi.k(0)), yi.k(static_cast<double>(h - 1)));
    t.pos.push_back((cy * static_cast<double>(w) + cx).to(DType::I64));
    t.weight.push_back(wt);
    t.dwx.push_back(dx);
    t.dwy.push_back(dy);
    t.valid.push_back(ok);
  };
  if (mode == 1) {
    Ex zero = ix.k(0);
    add(ix.un("round_nearest_even"), iy.un("round_nearest_even"), ix.k(1), zero, zero);
    return t;
  }
  Ex x0 = ix.un("floor"), y0 = iy.un("floor");
  Ex x1 = x0 + 1.0, y1 = y0 + 1.0;
  Ex e = x1 - ix, wv = ix - x0, n = y1 - iy, s = iy - y0;  // distances to the sides
  add(x0, y0, e * n, -n, -e);
  add(x1, y0, wv * n, n, -wv);
  add(x0, y1, e * s, -s, e);
  add(x1, y1, wv * s, s, wv);
  return t;
}

// Per-(n, c) planes [N, C, H*W] gathered at positions [N, P] -> [N, C, P].
Ex gather_planes(Builder& b, const Ex& planes, const Ex& pos) {
  const Shape& s = planes.v.shape();
  int64_t p = pos.v.shape()[1];
  Shape ps{s[0], s[1], p};
  Value idx = b.broadcast_in_dim(pos.v, ps, {0, 2});
  return Ex(b, b.take_along(planes.v, idx, 2));
}

struct Prepared {
  Ex planes, ix, iy, dx, dy;
  int64_t n, c, h, w, ho, wo;
};
Prepared prepare(Ctx& c, int in_arg, int grid_arg, int pad_arg, int align_arg, DType t) {
  Builder& b = c.b;
  Value x = b.convert(c.in(in_arg), t), g = b.convert(c.in(grid_arg), t);
  Prepared p{Ex(b, x),     Ex(b, x),     Ex(b, x),     Ex(b, x),     Ex(b, x),    x.shape()[0],
             x.shape()[1], x.shape()[2], x.shape()[3], g.shape()[1], g.shape()[2]};
  p.planes = Ex(b, b.reshape(x, {p.n, p.c, p.h * p.w}));
  int64_t np = p.ho * p.wo;
  Ex gx(b, b.reshape(b.slice(g, {0, 0, 0, 0}, {p.n, p.ho, p.wo, 1}, {}), {p.n, np}));
  Ex gy(b, b.reshape(b.slice(g, {0, 0, 0, 1}, {p.n, p.ho, p.wo, 2}, {}), {p.n, np}));
  auto [ix, dx] = source_coord(gx, p.w, c.i64(pad_arg), c.flag(align_arg));
  auto [iy, dy] = source_coord(gy, p.h, c.i64(pad_arg), c.flag(align_arg));
  p.ix = ix;
  p.iy = iy;
  p.dx = dx;
  p.dy = dy;
  return p;
}
Ex bc(Builder& b, const Ex& v, int64_t n, int64_t ch, int64_t np) {  // [N, P] -> [N, C, P]
  return Ex(b, b.broadcast_in_dim(v.v, {n, ch, np}, {0, 2}));
}

TPU_LOWERING(grid_sample) {
  // (input, grid, interpolation_mode, padding_mode, align_corners)
  reg("grid_sampler_2d", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    int64_t mode = c.i64(2);
    if (mode == 2) throw hlo::BuildError("[lower] grid_sampler_2d: bicubic is not supported yet");
    if (c.out(0).numel() == 0 || c.in(0).type.numel() == 0) return {b.splat(0, c.out(0))};
    Prepared p = prepare(c, 0, 1, 3, 4, t);
    int64_t np = p.ho * p.wo;
    Taps tp = taps(p.ix, p.iy, p.h, p.w, mode);
    Ex out(b, b.splat(0, Type{t, {p.n, p.c, np}}));
    for (size_t k = 0; k < tp.pos.size(); ++k) {
      Ex v = gather_planes(b, p.planes, tp.pos[k]);
      Ex wk = where(tp.valid[k], tp.weight[k], tp.weight[k].k(0));
      out = out + v * bc(b, wk, p.n, p.c, np);
    }
    return {b.reshape(out.v, c.out(0).shape)};
  });
  // (grad_output, input, grid, interpolation_mode, padding_mode, align_corners,
  //  output_mask) -> (grad_input, grad_grid)
  reg("grid_sampler_2d_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    int64_t mode = c.i64(3);
    if (mode == 2)
      throw hlo::BuildError("[lower] grid_sampler_2d_backward: bicubic is not supported yet");
    if (c.in(0).type.numel() == 0 || c.in(1).type.numel() == 0)
      return {b.splat(0, c.out(0)), b.splat(0, c.out(1))};
    Prepared p = prepare(c, 1, 2, 4, 5, t);
    int64_t np = p.ho * p.wo;
    Ex g(b, b.reshape(b.convert(c.in(0), t), {p.n, p.c, np}));
    Taps tp = taps(p.ix, p.iy, p.h, p.w, mode);
    Ex gin(b, b.splat(0, Type{t, {p.n * p.c * p.h * p.w}}));
    Ex gsx(b, b.splat(0, Type{t, {p.n, np}})), gsy = gsx;
    Type plane_t{DType::I64, {p.n, p.c, np}};
    Ex base = (Ex(b, b.iota(plane_t, 0)) * static_cast<double>(p.c) + Ex(b, b.iota(plane_t, 1))) *
              static_cast<double>(p.h * p.w);
    for (size_t k = 0; k < tp.pos.size(); ++k) {
      Ex ok = tp.valid[k];
      Ex wk = where(ok, tp.weight[k], tp.weight[k].k(0));
      Ex contrib = g * bc(b, wk, p.n, p.c, np);
      Ex pos = base + bc(b, tp.pos[k], p.n, p.c, np);
      gin = Ex(b, b.scatter_flat(gin.v, b.reshape(pos.v, {p.n * p.c * np}),
                                 b.reshape(contrib.v, {p.n * p.c * np}), true));
      if (mode == 0) {
        Ex v = gather_planes(b, p.planes, tp.pos[k]);
        Ex gv(b, reduce_sum(b, (g * v).v, {1}, false));  // [N, P]
        gsx = gsx + where(ok, gv * tp.dwx[k], gv.k(0));
        gsy = gsy + where(ok, gv * tp.dwy[k], gv.k(0));
      }
    }
    gsx = gsx * p.dx;
    gsy = gsy * p.dy;
    Value gg = b.concatenate(
        {b.reshape(gsx.v, {p.n, p.ho, p.wo, 1}), b.reshape(gsy.v, {p.n, p.ho, p.wo, 1})}, 3);
    return {b.reshape(gin.v, c.out(0).shape), gg};
  });
}

}  // namespace
}  // namespace torchtpu::lower
