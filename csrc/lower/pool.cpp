// Pooling over the last 2 or 3 dims (max with indices, average, adaptive
// average and max, max_unpool) and their backward ops: reduce_window for fixed
// windows, bin matrices and masked argmax for adaptive bins.
#include <algorithm>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "lower/helpers.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

Shape per_dim(const std::vector<int64_t>& v, size_t n, int64_t fill) {
  if (v.empty()) return Shape(n, fill);
  if (v.size() == 1) return Shape(n, v[0]);
  if (v.size() != n) throw hlo::BuildError("[lower] expected " + std::to_string(n) + " values");
  return v;
}

// Window geometry over the last nd dims of an input of rank r (leading dims
// get a window of 1). hi padding is what the meta kernel's output size needs.
struct Pool {
  int64_t nd;
  Shape window, stride, dil, lo, hi;
  Shape in, out;  // spatial sizes
};

Pool pool_geom(const Value& x, const Shape& out, int64_t nd, const std::vector<int64_t>& kernel,
               const std::vector<int64_t>& stride, const std::vector<int64_t>& pad,
               const std::vector<int64_t>& dil) {
  int64_t r = x.rank();
  Shape k = per_dim(kernel, nd, 1), st = stride.empty() ? k : per_dim(stride, nd, 1);
  Shape p = per_dim(pad, nd, 0), d = per_dim(dil, nd, 1);
  Pool g{nd, Shape(r, 1), Shape(r, 1), Shape(r, 1), Shape(r, 0), Shape(r, 0), {}, {}};
  for (int64_t i = 0; i < nd; ++i) {
    int64_t j = r - nd + i, in = x.shape()[j], o = out[j];
    g.in.push_back(in);
    g.out.push_back(o);
    g.window[j] = k[i];
    g.stride[j] = st[i];
    g.dil[j] = d[i];
    g.lo[j] = p[i];
    g.hi[j] = std::max<int64_t>(0, (o - 1) * st[i] + d[i] * (k[i] - 1) + 1 - in - p[i]);
  }
  return g;
}
Shape tail(const Shape& s, int64_t nd) { return Shape(s.end() - nd, s.end()); }

// Flat position within each spatial volume, as torch reports pooling indices.
Ex flat_position(Builder& b, const Shape& shape, int64_t nd) {
  Type it{DType::I64, shape};
  int64_t r = static_cast<int64_t>(shape.size());
  Ex idx(b, b.splat(0, it));
  for (int64_t j = r - nd; j < r; ++j)
    idx = idx * static_cast<double>(shape[j]) + Ex(b, b.iota(it, j));
  return idx;
}

// Divisor of each avg-pool window, shaped like the spatial output.
Value avg_divisor(Builder& b, const Pool& g, DType t, bool count_pad) {
  int64_t r = static_cast<int64_t>(g.window.size()), nd = g.nd;
  Shape win = tail(g.window, nd), st = tail(g.stride, nd), lo(nd, 0), hi(nd, 0), in = g.in;
  Value zero = b.constant(0, t);
  for (int64_t i = 0; i < nd; ++i) {
    int64_t j = r - nd + i;
    if (count_pad) {
      // Padding counts, overhang past it (ceil_mode) does not.
      in[i] += 2 * g.lo[j];
      hi[i] = std::max<int64_t>(0, g.hi[j] - g.lo[j]);
    } else {
      lo[i] = g.lo[j];
      hi[i] = g.hi[j];
    }
  }
  Value cnt = b.reduce_window(b.splat(1, Type{t, in}), zero, Reducer::Add, win, st, lo, hi);
  return b.slice(cnt, Shape(nd, 0), g.out, {});
}
Ex avg_scale(Ctx& c, const Pool& g, DType t, int divisor_arg, bool count_pad) {
  Builder& b = c.b;
  if (!c.is_none(divisor_arg)) return Ex(b, b.constant(static_cast<double>(c.i64(divisor_arg)), t));
  return Ex(b, avg_divisor(b, g, t, count_pad));
}

// Adaptive bins: bin i covers [floor(i*in/out), ceil((i+1)*in/out)); a
// [out, in] membership mask.
Ex bin_mask(Builder& b, int64_t out, int64_t in) {
  Type it{DType::I64, {out, in}};
  Ex i(b, b.iota(it, 0)), pos(b, b.iota(it, 1));
  Ex start = i * static_cast<double>(in) / static_cast<double>(out);
  Ex end = ((i + 1.0) * static_cast<double>(in) + static_cast<double>(out - 1)) /
           static_cast<double>(out);
  return Ex(b, b.binary("and", pos.cmp(Cmp::GE, start), pos.cmp(Cmp::LT, end)));
}
// The averaging matrix of those bins.
Value bin_matrix(Builder& b, int64_t out, int64_t in, DType t) {
  Ex m = bin_mask(b, out, in).to(t);
  Ex len(b, b.reduce(m.v, b.constant(0, t), {1}, Reducer::Add));
  return m / Ex(b, b.reshape(len.v, {out, 1}));
}

// Windowed max over the last nd dims, one dim at a time (max of maxes), with
// the flat index of the winner: ties keep the first in row-major order.
// `window(j, o, n)` gives the bool membership of input positions in output
// bins along dim j, [o, n] (mapped to dims {j, j+1}) or per plane [N, C, o, n].
using WindowFn = std::function<Value(int64_t j, int64_t o, int64_t n)>;
std::pair<Value, Value> window_max(Builder& b, Value x, const Shape& out, int64_t nd,
                                   const WindowFn& window) {
  int64_t r = x.rank();
  Value idx = flat_position(b, x.shape(), nd);
  for (int64_t j = r - 1; j >= r - nd; --j) {
    int64_t n = x.shape()[j], o = out[j];
    // [..., o, n, ...]: x along dim j, masked to each output bin.
    Shape big = x.shape();
    big.insert(big.begin() + j, o);
    std::vector<int64_t> dims;
    for (int64_t i = 0; i < r; ++i) dims.push_back(i < j ? i : i + 1);
    Value xb = b.broadcast_in_dim(x, big, dims), ib = b.broadcast_in_dim(idx, big, dims);
    Value wm = window(j, o, n);
    std::vector<int64_t> md = {j, j + 1};
    if (wm.rank() == 4) md = {0, 1, j, j + 1};
    Value mask = b.broadcast_in_dim(wm, big, md);
    Ex low(b, b.splat(-INFINITY, Type{x.dtype(), big}));
    Value masked = where(Ex(b, mask), Ex(b, xb), low);
    auto [m, a] = b.reduce_arg(masked, j + 1, true);
    // a is the position along dim j; carry the winner's flat index.
    Shape as = m.shape();
    as.insert(as.begin() + j + 1, 1);
    Value ai = b.reshape(a, as);
    idx = b.reshape(b.take_along(ib, ai, j + 1), m.shape());
    x = m;
  }
  return {x, idx};
}

// Gradient of a pooling with recorded flat indices: each gradient adds into
// its source position, one flat scatter over all planes.
Value scatter_by_index(Builder& b, Value gy, Value indices, const Shape& in_shape, int64_t nd,
                       DType t) {
  int64_t r = static_cast<int64_t>(in_shape.size()), vol = 1, per = 1;
  for (int64_t j = r - nd; j < r; ++j) {
    vol *= in_shape[j];
    per *= gy.shape()[j];
  }
  int64_t total = Type{t, in_shape}.numel();
  int64_t planes = vol == 0 ? 0 : total / vol;
  if (total == 0 || per == 0) return b.splat(0, Type{t, in_shape});
  Type pt{DType::I64, {planes, per}};
  Ex pos = Ex(b, b.iota(pt, 0)) * static_cast<double>(vol) +
           Ex(b, b.reshape(b.convert(indices, DType::I64), pt.shape));
  Value upd = b.reshape(b.convert(gy, t), pt.shape);
  Value gx = b.scatter_flat(b.splat(0, Type{t, {planes * vol}}), pos, upd, true);
  return b.reshape(gx, in_shape);
}

// Windowed max and torch's index of it from the window's K offsets: each
// offset's strided slice of the padded input has the output's shape, so the
// max is K - 1 elementwise steps and the index the first offset, in row-major
// order, whose real element equals it (the last NaN if it is NaN). XLA:CPU runs the
// variadic reduce_window with a comparator as a scalar loop: 3x3 stride-2
// pooling of [8, 64, 112, 112] took 50 ms that way, 20 ms this way. Windows of
// more than kMaxOffsets positions keep the reduce_window.
constexpr int64_t kMaxOffsets = 64;
std::pair<Value, Value> offsets_max(Builder& b, Value x, const Pool& g) {
  const int64_t r = x.rank(), nd = g.nd;
  const DType t = x.dtype();
  Value xp = b.pad(x, reduce_init(b, Reducer::Max, t), g.lo, g.hi, {});
  Shape out = x.shape();
  for (int64_t i = 0; i < nd; ++i) out[r - nd + i] = g.out[i];
  // Each offset's input coordinates, from the output grid (no padded index array).
  std::vector<Ex> grid;
  for (int64_t i = 0; i < nd; ++i) grid.emplace_back(b, b.iota(Type{DType::I64, out}, r - nd + i));
  std::vector<Ex> xs, ps, real;
  Shape k(static_cast<size_t>(nd), 0);
  for (bool more = true; more;) {
    Shape start(r, 0), limit = xp.shape(), step(r, 1);
    Ex pos = grid[0].k(0), ok = grid[0].cmp(Cmp::GE, grid[0].k(0));
    for (int64_t i = 0; i < nd; ++i) {
      const int64_t j = r - nd + i;
      start[j] = k[i] * g.dil[j];
      limit[j] = start[j] + (g.out[i] - 1) * g.stride[j] + 1;
      step[j] = g.stride[j];
      Ex c = grid[i] * static_cast<double>(g.stride[j]) + static_cast<double>(start[j] - g.lo[j]);
      ok = ok.bin("and", c.cmp(Cmp::GE, c.k(0))).bin("and", c.cmp(Cmp::LT, c.k(double(g.in[i]))));
      pos = pos * static_cast<double>(g.in[i]) + c;
    }
    xs.emplace_back(b, b.slice(xp, start, limit, step));
    ps.push_back(pos);
    real.push_back(ok);
    more = false;  // next offset, last dim fastest
    for (int64_t i = nd - 1; i >= 0 && !more; --i) {
      if (++k[i] < g.window[r - nd + i])
        more = true;
      else
        k[i] = 0;
    }
  }
  const bool fl = is_float(t);
  auto nan = [&](const Ex& v) { return v.cmp(Cmp::NE, v); };
  Ex m = xs[0];
  for (size_t i = 1; i < xs.size(); ++i) {
    Ex wins = xs[i].cmp(Cmp::GT, m);
    if (fl) wins = wins.bin("or", nan(xs[i]));
    m = where(wins, xs[i], m);
  }
  Ex idx = ps[0].k(-1);
  for (size_t i = xs.size(); i-- > 0;)
    idx = where(xs[i].cmp(Cmp::EQ, m).bin("and", real[i]), ps[i], idx);
  if (!fl) return {m.v, idx.v};
  // Among NaNs the last one wins, as in torch's CPU kernel.
  Ex last_nan = idx;
  for (size_t i = 0; i < xs.size(); ++i)
    last_nan = where(nan(xs[i]).bin("and", real[i]), ps[i], last_nan);
  return {m.v, where(nan(m), last_nan, idx).v};
}

void max_pool(const std::string& name, int64_t nd,
              std::source_location loc = std::source_location::current()) {
  // (self, kernel_size, stride, padding, dilation, ceil_mode) -> (out, indices)
  reg_at(loc, name, [nd](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    Pool g = pool_geom(x, c.out(0).shape, nd, c.ints(1), c.ints(2), c.ints(3), c.ints(4));
    int64_t offsets = 1;
    for (int64_t w : g.window) offsets *= w;
    if (offsets <= kMaxOffsets && Type{x.dtype(), c.out(0).shape}.numel() > 0) {
      auto [m, i] = offsets_max(b, x, g);
      return {m, i};
    }
    auto [m, i] = b.reduce_window_argmax(x, flat_position(b, x.shape(), nd), g.window, g.stride,
                                         g.dil, g.lo, g.hi);
    return {m, i};
  });
  // (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices)
  reg_at(loc, name + "_backward", [nd](Ctx& c) -> V {
    return {scatter_by_index(c.b, c.in(0), c.in(7), c.in(1).shape(), nd,
                             compute_dtype(c.out(0).dtype))};
  });
}

void avg_pool(const std::string& name, int64_t nd,
              std::source_location loc = std::source_location::current()) {
  // (self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override?)
  reg_at(loc, name, [nd](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(0), t);
    Pool g = pool_geom(x, c.out(0).shape, nd, c.ints(1), c.ints(2), c.ints(3), {});
    Ex sum(b, b.reduce_window(x, b.constant(0, t), Reducer::Add, g.window, g.stride, g.lo, g.hi));
    return {sum / avg_scale(c, g, t, 6, c.flag(5))};
  });
  // (grad_output, self, kernel_size, stride, padding, ceil_mode,
  //  count_include_pad, divisor_override?)
  reg_at(loc, name + "_backward", [nd](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = c.in(1);
    Ex gy(b, b.convert(c.in(0), t));
    Pool g = pool_geom(x, c.in(0).shape(), nd, c.ints(2), c.ints(3), c.ints(4), {});
    Value gd = gy / avg_scale(c, g, t, 7, c.flag(6));
    // Each input sums the windows covering it: spread the scaled gradient on
    // the stride grid, then a stride-1 window sum.
    int64_t r = x.rank();
    Shape lo(r, 0), hi(r, 0), interior(r, 0), ones(r, 1);
    for (int64_t i = 0; i < nd; ++i) {
      int64_t j = r - nd + i;
      lo[j] = g.window[j] - 1 - g.lo[j];
      hi[j] = g.in[i] - 1 + g.lo[j] - (g.out[i] - 1) * g.stride[j];
      interior[j] = g.stride[j] - 1;
    }
    Value z = b.constant(0, t);
    Value spread = b.pad(gd, z, lo, hi, interior);
    return {b.reduce_window(spread, z, Reducer::Add, g.window, ones, {}, {})};
  });
}

void adaptive_avg(const std::string& name, int64_t nd,
                  std::source_location loc = std::source_location::current()) {
  // (self, output_size): separable averaging matrices (equal bins included).
  reg_at(loc, name, [nd](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(0), t);
    int64_t r = x.rank();
    Shape win(r, 1);
    bool even = true;
    for (int64_t j = r - nd; j < r; ++j) {
      int64_t o = c.out(0).shape[j];
      even = even && o > 0 && x.shape()[j] % o == 0;
      win[j] = o > 0 ? x.shape()[j] / o : 1;
    }
    if (even) {  // equal, disjoint bins: one window sum
      double n = 1;
      for (int64_t w : win) n *= static_cast<double>(w);
      return {Ex(b, b.reduce_window(x, b.constant(0, t), Reducer::Add, win, win, {}, {})) / n};
    }
    for (int64_t j = r - 1; j >= r - nd; --j)
      x = contract(b, x, j, bin_matrix(b, c.out(0).shape[j], x.shape()[j], t), 1);
    return {x};
  });
  // (grad_output, self)
  reg_at(loc, name + "_backward", [nd](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value gy = b.convert(c.in(0), t);
    const Value& x = c.in(1);
    int64_t r = x.rank();
    for (int64_t j = r - 1; j >= r - nd; --j)
      gy = contract(b, gy, j, bin_matrix(b, gy.shape()[j], x.shape()[j], t), 0);
    return {gy};
  });
}

TPU_LOWERING(pooling) {
  max_pool("max_pool2d_with_indices", 2);
  max_pool("max_pool3d_with_indices", 3);
  avg_pool("avg_pool2d", 2);
  avg_pool("avg_pool3d", 3);
  adaptive_avg("_adaptive_avg_pool2d", 2);
  adaptive_avg("_adaptive_avg_pool3d", 3);
  for (int64_t nd : {2, 3}) {
    std::string n = "adaptive_max_pool" + std::to_string(nd) + "d";
    // (self, output_size) -> (out, indices)
    reg(n, [nd](Ctx& c) -> V {
      Value x = c.b.convert(c.in(0), compute_dtype(c.out(0).dtype));
      auto [m, i] = window_max(c.b, x, c.out(0).shape, nd, [&](int64_t, int64_t o, int64_t n) {
        return bin_mask(c.b, o, n).v;
      });
      return {m, i};
    });
    // (grad_output, self, indices)
    reg(n + "_backward", [nd](Ctx& c) -> V {
      return {scatter_by_index(c.b, c.in(0), c.in(2), c.in(1).shape(), nd,
                               compute_dtype(c.out(0).dtype))};
    });
  }
  // fractional_max_pool{2,3}d(self, kernel_size, output_size, random_samples):
  // per plane, window i along a dim starts at floor((i + u) * alpha) -
  // floor(u * alpha), alpha = (in - k) / (out - 1), the last at in - k; u is the
  // plane's sample for that dim (the last spatial dim takes sample 0 in 2-d).
  for (int64_t nd : {2, 3}) {
    std::string n = "fractional_max_pool" + std::to_string(nd) + "d";
    reg(n, [nd](Ctx& c) -> V {
      Builder& b = c.b;
      DType t = compute_dtype(c.out(0).dtype);
      Value x = b.convert(c.in(0), t);
      bool batched = x.rank() == nd + 2;
      Shape os = c.out(0).shape;
      if (!batched) {
        Shape s = x.shape();
        s.insert(s.begin(), 1);
        x = b.reshape(x, s);
        os.insert(os.begin(), 1);
      }
      auto k = c.ints(1);
      Value u = b.convert(c.in(3), t);  // [N, C, nd]
      int64_t r = x.rank(), planes_n = x.shape()[0], planes_c = x.shape()[1];
      auto [m, i] = window_max(b, x, os, nd, [&](int64_t j, int64_t o, int64_t len) {
        int64_t d = j - (r - nd), kk = k[d];
        int64_t sample = nd == 2 ? 1 - d : d;
        Value us = b.reshape(b.slice(u, {0, 0, sample}, {planes_n, planes_c, sample + 1}, {}),
                             {planes_n, planes_c, 1});
        Type it{DType::I64, {planes_n, planes_c, o, len}};
        Ex oi(b, b.iota(Type{t, it.shape}, 2)), pos(b, b.iota(it, 3));
        Ex ub(b, b.broadcast_in_dim(us, it.shape, {0, 1, 2}));
        double alpha = o > 1 ? static_cast<double>(len - kk) / static_cast<double>(o - 1) : 0;
        Ex start = ((oi + ub) * alpha).un("floor") - (ub * alpha).un("floor");
        start = where(oi.cmp(Cmp::EQ, oi.k(static_cast<double>(o - 1))),
                      oi.k(static_cast<double>(len - kk)), start);
        Ex st = start.to(DType::I64);
        return pos.cmp(Cmp::GE, st).bin("and", pos.cmp(Cmp::LT, st + static_cast<double>(kk))).v;
      });
      return {m, i};
    });
    // (grad_output, self, kernel_size, output_size, indices)
    reg(n + "_backward", [nd](Ctx& c) -> V {
      return {scatter_by_index(c.b, c.in(0), c.in(4), c.in(1).shape(), nd,
                               compute_dtype(c.out(0).dtype))};
    });
  }
  // max_unpool2d(self, indices, output_size) / max_unpool3d(self, indices,
  // output_size, stride, padding): values scattered to their flat positions.
  for (int64_t nd : {2, 3}) {
    reg("max_unpool" + std::to_string(nd) + "d", [nd](Ctx& c) -> V {
      Builder& b = c.b;
      const Type& o = c.out(0);
      Value x = c.in(0);
      int64_t r = o.rank(), vol = 1, per = 1;
      for (int64_t j = r - nd; j < r; ++j) {
        vol *= o.shape[j];
        per *= x.shape()[j];
      }
      int64_t planes = vol == 0 ? 0 : o.numel() / vol;
      if (o.numel() == 0 || per == 0) return {b.splat(0, o)};
      Type pt{DType::I64, {planes, per}};
      Ex pos = Ex(b, b.iota(pt, 0)) * static_cast<double>(vol) +
               Ex(b, b.reshape(b.convert(c.in(1), DType::I64), pt.shape));
      Value out = b.scatter_flat(b.splat(0, Type{o.dtype, {planes * vol}}), pos,
                                 b.reshape(b.convert(x, o.dtype), pt.shape), false);
      return {b.reshape(out, o.shape)};
    });
  }
}

}  // namespace
}  // namespace torchtpu::lower
