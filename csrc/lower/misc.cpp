// Assorted ops: channel_shuffle, renorm, weight norm, cummax/cummin, nanmedian, unfold's
// backward, im2col, rrelu, histc and a few aliases of existing rules.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

Value at_least_1d(Builder& b, Value x) { return x.rank() == 0 ? b.reshape(x, {1}) : x; }
// Runs the rule registered under `name` (looked up at call time, so the
// registration order of files does not matter).
Rule alias(const std::string& name) {
  return [name](Ctx& c) -> V { return (*find_rule(name))(c); };
}

// Running max/min along dim with the index of the element that set it: the
// last one among equals and the last NaN once a NaN appeared (torch's CPU
// cummax/cummin). For position i: arg-extreme over j <= i, scanned from i
// down so that ties and NaNs pick the largest j.
std::pair<Value, Value> cum_extreme(Builder& b, Value x, int64_t dim, bool is_max) {
  int64_t r = x.rank(), n = x.shape()[dim];
  // [..., i, j, ...] with j reversed: element (i, j) holds x[n - 1 - j].
  Shape big = x.shape();
  big.insert(big.begin() + dim, n);
  std::vector<int64_t> dims;
  for (int64_t k = 0; k < r; ++k) dims.push_back(k < dim ? k : k + 1);
  Value xr = b.broadcast_in_dim(b.reverse(x, {dim}), big, dims);
  Type it{DType::I64, big};
  Ex i(b, b.iota(it, dim)), j(b, b.iota(it, dim + 1));
  Ex src = (j.k(static_cast<double>(n - 1)) - j);
  Ex valid = src.cmp(Cmp::LE, i);
  double fill = is_max ? -INFINITY : INFINITY;
  Value init = is_float(x.dtype()) ? b.splat(fill, Type{x.dtype(), big})
                                   : b.splat(is_max ? -9.0e18 : 9.0e18, Type{x.dtype(), big});
  if (x.dtype() == DType::Bool) init = b.splat(is_max ? 0 : 1, Type{x.dtype(), big});
  Value masked = where(valid, Ex(b, xr), Ex(b, init));
  auto [m, a] = b.reduce_arg(masked, dim + 1, is_max);
  Ex idx = Ex(b, a).k(static_cast<double>(n - 1)) - Ex(b, a);
  return {m, idx};
}

// p-norm distances between the rows of x1 [..., P, M] and x2 [..., R, M]
// (p = 0 counts differences, p = inf takes the largest), [..., P, R].
Ex pairwise_dist(const Ex& x1, const Ex& x2, double p) {
  Builder& b = *x1.b;
  int64_t r = x1.v.rank();
  Shape s1 = x1.v.shape(), s2 = x2.v.shape();
  s1.insert(s1.end() - 1, 1);  // [..., P, 1, M]
  s2.insert(s2.end() - 2, 1);  // [..., 1, R, M]
  Ex d = Ex(b, b.reshape(x1.v, s1)) - Ex(b, b.reshape(x2.v, s2));
  Ex a = d.un("abs");
  auto sum_m = [&](const Ex& v) { return Ex(b, reduce_sum(b, v.v, {r}, false)); };
  if (p == 0) return sum_m(a.cmp(Cmp::NE, a.k(0)).to(a.v.dtype()));
  if (p == 1) return sum_m(a);
  if (p == 2) return sum_m(d * d).un("sqrt");
  if (std::isinf(p)) return Ex(b, b.reduce(a.v, b.constant(0, a.v.dtype()), {r}, Reducer::Max));
  Ex sp = sum_m(a.bin("power", a.k(p)));
  return sp.bin("power", sp.k(1.0 / p));
}
// cdist's x [..., N, M] with its batch dims broadcast to the output's (the output is
// [batch..., P, R] or grad_x1 [batch..., P, M]); the two inputs' batch ranks may differ.
Ex batch_broadcast(Ctx& c, const Ex& x) {
  Shape s = c.out(0).shape;
  s[s.size() - 2] = x.v.shape()[x.v.rank() - 2];
  s.back() = x.v.shape().back();
  return Ex(c.b, broadcast_to(c.b, x.v, s));
}
// d dist(x1_i, x2_j) / d x1_i summed against grad [..., P, R]: [..., P, M].
Ex pairwise_dist_grad(const Ex& g, const Ex& x1, const Ex& x2, const Ex& dist, double p) {
  Builder& b = *x1.b;
  int64_t r = x1.v.rank();
  Shape s1 = x1.v.shape(), s2 = x2.v.shape(), sd = dist.v.shape();
  s1.insert(s1.end() - 1, 1);
  s2.insert(s2.end() - 2, 1);
  sd.push_back(1);
  Ex d = Ex(b, b.reshape(x1.v, s1)) - Ex(b, b.reshape(x2.v, s2));  // [..., P, R, M]
  Ex dd(b, b.reshape(dist.v, sd)), gg(b, b.reshape(g.v, sd));
  Ex sg = where(d.cmp(Cmp::GT, d.k(0)), d.k(1), where(d.cmp(Cmp::LT, d.k(0)), d.k(-1), d.k(0)));
  Ex a = d.un("abs"), zero = dd.cmp(Cmp::EQ, dd.k(0));
  Ex term = d.k(0);
  if (p == 0) {
    term = d.k(0);
  } else if (p == 1) {
    term = sg;
  } else if (p == 2) {
    term = where(zero, d.k(0), d / dd);
  } else if (std::isinf(p)) {
    term = sg * a.cmp(Cmp::EQ, dd).to(d.v.dtype());
  } else {
    term = sg * a.bin("power", a.k(p - 1)) / dd.bin("power", dd.k(p - 1));
    Ex drop = p < 1 ? zero.bin("or", a.cmp(Cmp::EQ, a.k(0))) : zero;
    term = where(drop, d.k(0), term);
  }
  return Ex(b, reduce_sum(b, (term * gg).v, {r - 1}, false));
}
// Upper-triangle (i < j) mask of an n x n matrix and each entry's position in
// the row-major list of pairs.
std::pair<Ex, Ex> pair_positions(Builder& b, int64_t n) {
  Type it{DType::I64, {n, n}};
  Ex i(b, b.iota(it, 0)), j(b, b.iota(it, 1));
  Ex up = j.cmp(Cmp::GT, i);
  // Pairs before row i: i*n - i*(i+1)/2; then j - i - 1 within the row.
  Ex pos = i * static_cast<double>(n) - i * (i + 1.0) / 2.0 + j - i - 1.0;
  return {up, pos};
}

// torch.histogram over flat x with bin edges [nb + 1] (the last bin closed on
// the right): optional per-element weights, optionally as a density.
Ex histogram_counts(Builder& b, const Ex& x, const Ex& edges, const Ex* weight, bool density) {
  int64_t n = x.v.shape()[0], nb = edges.v.shape()[0] - 1;
  DType t = x.v.dtype();
  Ex e0(b, b.reshape(b.slice(edges.v, {0}, {1}, {}), {})),
      el(b, b.reshape(b.slice(edges.v, {nb}, {nb + 1}, {}), {}));
  Ex below(b, b.broadcast_in_dim(edges.v, {n, nb + 1}, {1}));
  Ex xb(b, b.broadcast_in_dim(x.v, {n, nb + 1}, {0}));
  Ex cnt(b, reduce_sum(b, below.cmp(Cmp::LE, xb).to(DType::I64).v, {1}, false));
  Ex pos = cnt - 1.0;
  pos = where(x.cmp(Cmp::EQ, el), pos.k(static_cast<double>(nb - 1)), pos);
  Ex inside = x.cmp(Cmp::GE, e0).bin("and", x.cmp(Cmp::LE, el));
  Ex idx = where(inside, pos, pos.k(static_cast<double>(nb)));
  Value w = weight ? weight->v : b.splat(1, Type{t, {n}});
  Ex h(b, b.scatter_flat(b.splat(0, Type{t, {nb}}), idx.v, w, true));
  if (!density) return h;
  Ex widths(b, b.slice(edges.v, {1}, {nb + 1}, {}));
  widths = widths - Ex(b, b.slice(edges.v, {0}, {nb}, {}));
  Ex total(b, b.reduce(h.v, b.constant(0, t), {0}, Reducer::Add));
  return h / (total * widths);
}

TPU_LOWERING(misc_ops) {
  // (self, groups): [N, g, C/g, ...] -> [N, C/g, g, ...].
  for (const char* n : {"channel_shuffle", "native_channel_shuffle"}) {
    reg(n, [](Ctx& c) -> V {
      Value x = c.in(0);
      int64_t g = c.i64(1), ch = x.shape()[1];
      Shape s = x.shape();
      s[1] = ch / g;
      s.insert(s.begin() + 1, g);
      std::vector<int64_t> perm{0, 2, 1};
      for (int64_t k = 3; k < static_cast<int64_t>(s.size()); ++k) perm.push_back(k);
      return {c.b.reshape(c.b.transpose(c.b.reshape(x, s), perm), x.shape())};
    });
  }
  // (self, p, dim, maxnorm): slices along dim with p-norm above maxnorm are
  // scaled down to it.
  reg("renorm", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t);
    int64_t dim = wrap_dim(c.i64(2), x.v.rank());
    std::vector<int64_t> dims;
    for (int64_t k = 0; k < x.v.rank(); ++k)
      if (k != dim) dims.push_back(k);
    Ex p(c.b, c.scalar(1, t)), maxnorm(c.b, c.scalar(3, t));
    Ex sum(c.b, reduce_sum(c.b, x.un("abs").bin("power", p).v, dims, true));
    Ex amax(c.b, c.b.reduce(x.un("abs").v, c.b.constant(0, t), dims, Reducer::Max));
    amax = Ex(c.b, c.b.reshape(amax.v, sum.v.shape()));
    Ex norm = where(p.cmp(Cmp::EQ, p.k(INFINITY)), amax, sum.bin("power", 1.0 / p));
    Ex factor = where(norm.cmp(Cmp::GT, maxnorm), maxnorm / (norm + 1e-7), norm.k(1));
    return {x * factor};
  });
  // Weight norm w = v * g / ||v||, the norm taken over every dim but `dim`
  // (norms has g's shape). nn.utils.weight_norm on tpu reaches these.
  auto except_dim = [](int64_t rank, int64_t dim) {
    std::vector<int64_t> dims;
    for (int64_t k = 0; k < rank; ++k)
      if (k != wrap_dim(dim, rank)) dims.push_back(k);
    return dims;
  };
  reg("_weight_norm_interface", [except_dim](Ctx& c) -> V {
    DType t = math_dtype(c, 1);
    Ex v = in_as(c, 0, t), g = in_as(c, 1, t);
    auto dims = except_dim(v.v.rank(), c.i64(2));
    Ex norms = Ex(c.b, reduce_sum(c.b, (v * v).v, dims, true)).un("sqrt");
    return {v * (g / norms), norms};
  });
  // (grad_w, v, g, norms, dim) -> (grad_v, grad_g)
  reg("_weight_norm_interface_backward", [except_dim](Ctx& c) -> V {
    DType t = math_dtype(c, 1);
    Ex gw = in_as(c, 0, t), v = in_as(c, 1, t), g = in_as(c, 2, t), norms = in_as(c, 3, t);
    auto dims = except_dim(v.v.rank(), c.i64(4));
    Ex dot(c.b, reduce_sum(c.b, (gw * v).v, dims, true));
    Ex grad_v = (g / norms) * (gw - v * (dot / (norms * norms)));
    return {grad_v, dot / norms};
  });
  // _cummax_helper(self, values(a!), indices(b!), dim) -> ()
  for (auto [name, mx] : {std::pair{"_cummax_helper", true}, std::pair{"_cummin_helper", false}}) {
    bool is_max = mx;
    reg(name, [is_max](Ctx& c) -> V {
      Value x = at_least_1d(c.b, c.in(0));
      auto [m, i] = cum_extreme(c.b, x, wrap_dim(c.i64(3), x.rank()), is_max);
      c.update(1, m);
      c.update(2, i);
      return {};
    });
  }
  // nanmedian(): the lower middle of the non-NaN values (NaN if none).
  reg("nanmedian", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    int64_t n = x.type.numel();
    Ex s(b, b.sort({b.reshape(x, {n})}, 0, false)[0]);
    Ex cnt(b, b.reduce(s.cmp(Cmp::EQ, s).to(DType::I64).v, b.constant_int(0, DType::I64), {0},
                       Reducer::Add));
    Ex k = maximum(cnt - 1.0, cnt.k(0)) / 2.0;
    return {b.reshape(b.gather_flat(s, b.reshape(k.v, {1})), {})};
  });
  // nanmedian.dim(self, dim, keepdim) -> (values, indices)
  reg("nanmedian.dim", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0));
    int64_t dim = wrap_dim(c.i64(1), x.rank());
    auto s = b.sort({x, b.iota(Type{DType::I64, x.shape()}, dim)}, dim, false);
    Ex sv(b, s[0]);
    Ex cnt(b, reduce_sum(b, sv.cmp(Cmp::EQ, sv).to(DType::I64).v, {dim}, true));
    Ex k = maximum(cnt - 1.0, cnt.k(0)) / 2.0;
    return {b.take_along(s[0], k, dim), b.take_along(s[1], k, dim)};
  });
  // unfold_backward(grad_in, input_sizes, dim, size, step): window element k
  // of window w came from input position w * step + k.
  reg("unfold_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Value g = b.convert(c.in(0), t);
    const Shape& in = c.out(0).shape;
    int64_t r = static_cast<int64_t>(in.size()), dim = wrap_dim(c.i64(2), std::max<int64_t>(r, 1));
    int64_t size = c.i64(3), step = c.i64(4);
    if (r == 0) return {b.reshape(g, {})};
    int64_t windows = g.shape()[dim], n = in[dim];
    Ex out(b, b.splat(0, Type{t, in}));
    for (int64_t k = 0; k < size && windows > 0; ++k) {
      Shape lo(g.rank(), 0), hi = g.shape();
      lo[g.rank() - 1] = k;
      hi[g.rank() - 1] = k + 1;
      Value gk = b.reshape(b.slice(g, lo, hi, {}), Shape(g.shape().begin(), g.shape().end() - 1));
      Shape plo(r, 0), phi(r, 0), pin(r, 0);
      plo[dim] = k;
      pin[dim] = step - 1;
      phi[dim] = n - (k + (windows - 1) * step + 1);
      out = out + Ex(b, b.pad(gk, b.constant(0, t), plo, phi, pin));
    }
    return {out};
  });
  // im2col(self, kernel_size, dilation, padding, stride): [N, C*kh*kw, L]
  // with L the output positions, one strided slice of the padded input per
  // kernel offset.
  reg("im2col", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    bool batched = x.rank() == 4;
    if (!batched)
      x = b.reshape(x, [&] {
        Shape s = x.shape();
        s.insert(s.begin(), 1);
        return s;
      }());
    auto k = c.ints(1), d = c.ints(2), p = c.ints(3), st = c.ints(4);
    int64_t n = x.shape()[0], ch = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
    int64_t oh = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) / st[0] + 1;
    int64_t ow = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) / st[1] + 1;
    Value xp =
        b.pad(x, b.constant(0, x.dtype()), {0, 0, p[0], p[1]}, {0, 0, p[0], p[1]}, {0, 0, 0, 0});
    std::vector<Value> cols;
    for (int64_t i = 0; i < k[0]; ++i)
      for (int64_t j = 0; j < k[1]; ++j) {
        Shape lo{0, 0, i * d[0], j * d[1]};
        Shape hi{n, ch, i * d[0] + (oh - 1) * st[0] + 1, j * d[1] + (ow - 1) * st[1] + 1};
        cols.push_back(b.reshape(b.slice(xp, lo, hi, {1, 1, st[0], st[1]}), {n, ch, 1, oh * ow}));
      }
    Value out =
        cols.empty() ? b.splat(0, Type{x.dtype(), {n, ch, 0, oh * ow}}) : b.concatenate(cols, 2);
    return {b.reshape(out, c.out(0).shape)};
  });
  // col2im(self, output_size, kernel_size, dilation, padding, stride): the
  // adjoint of im2col, each kernel offset's block added back where it came from.
  reg("col2im", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Value x = b.convert(c.in(0), t);
    if (x.rank() == 2) x = b.reshape(x, {1, x.shape()[0], x.shape()[1]});
    auto o = c.ints(1), k = c.ints(2), d = c.ints(3), p = c.ints(4), st = c.ints(5);
    int64_t n = x.shape()[0], ch = x.shape()[1] / (k[0] * k[1]);
    int64_t hp = o[0] + 2 * p[0], wp = o[1] + 2 * p[1];
    int64_t oh = (hp - d[0] * (k[0] - 1) - 1) / st[0] + 1,
            ow = (wp - d[1] * (k[1] - 1) - 1) / st[1] + 1;
    Value blocks = b.reshape(x, {n, ch, k[0], k[1], oh, ow});
    Ex acc(b, b.splat(0, Type{t, {n, ch, hp, wp}}));
    for (int64_t i = 0; i < k[0] && oh > 0 && ow > 0; ++i)
      for (int64_t j = 0; j < k[1]; ++j) {
        Value blk =
            b.reshape(b.slice(blocks, {0, 0, i, j, 0, 0}, {n, ch, i + 1, j + 1, oh, ow}, {}),
                      {n, ch, oh, ow});
        Shape lo{0, 0, i * d[0], j * d[1]};
        Shape hi{0, 0, hp - (i * d[0] + (oh - 1) * st[0] + 1),
                 wp - (j * d[1] + (ow - 1) * st[1] + 1)};
        acc = acc + Ex(b, b.pad(blk, b.constant(0, t), lo, hi, {0, 0, st[0] - 1, st[1] - 1}));
      }
    return {b.slice(acc.v, {0, 0, p[0], p[1]}, {n, ch, p[0] + o[0], p[1] + o[1]}, {})};
  });
  // rrelu_with_noise(self, noise(b!), lower, upper, training, generator?):
  // training draws a slope in [lower, upper) per negative element (recorded
  // in noise); eval uses the mean slope.
  reg("rrelu_with_noise", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t);
    Ex lo(b, c.scalar(2, t)), hi(b, c.scalar(3, t));
    Ex neg = x.cmp(Cmp::LT, x.k(0));
    if (!c.flag(4)) return {where(neg, x * ((lo + hi) / 2.0), x)};
    int64_t n = x.v.type.numel();
    Value bits = b.rng_bit_generator(c.rng_state(n), Type{DType::U32, x.v.shape()}).second;
    bits = b.binary("shift_right_logical", bits, b.splat(8, bits.type));
    Ex u = Ex(b, b.convert(b.convert(bits, DType::F32), t)) * std::ldexp(1.0, -24);
    Ex slope = where(neg, lo + (hi - lo) * u, x.k(1));
    c.update(1, slope);
    return {x * slope};
  });
  // (grad_output, self, noise, lower, upper, training, self_is_result)
  reg("rrelu_with_noise_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = in_as(c, 0, t), x = in_as(c, 1, t);
    Ex lo(c.b, c.scalar(3, t)), hi(c.b, c.scalar(4, t));
    if (c.flag(5)) return {g * in_as(c, 2, t)};
    return {where(x.cmp(Cmp::LE, x.k(0)), g * ((lo + hi) / 2.0), g)};
  });
  // histc(self, bins, min, max): equal-width bins over [min, max] (the data's
  // range when both are 0); values outside are ignored, max falls in the last.
  reg("histc", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Ex x(b, b.reshape(b.convert(c.in(0), t), {c.in(0).type.numel()}));
    int64_t bins = c.i64(1);
    Ex lo(b, c.scalar(2, t)), hi(b, c.scalar(3, t));
    if (x.v.shape()[0] > 0) {
      Ex dmin(b, b.reduce(x.v, b.constant(INFINITY, t), {0}, Reducer::Min));
      Ex dmax(b, b.reduce(x.v, b.constant(-INFINITY, t), {0}, Reducer::Max));
      Ex same = lo.cmp(Cmp::EQ, hi);
      lo = where(same, dmin, lo);
      hi = where(same, dmax, hi);
    }
    Ex same = lo.cmp(Cmp::EQ, hi);
    lo = where(same, lo - 1.0, lo);
    hi = where(same, hi + 1.0, hi);
    Ex pos = ((x - lo) * static_cast<double>(bins) / (hi - lo)).un("floor");
    pos = where(x.cmp(Cmp::EQ, hi), pos.k(static_cast<double>(bins - 1)), pos);
    Ex inside = x.cmp(Cmp::GE, lo).bin("and", x.cmp(Cmp::LE, hi));
    Ex idx = where(inside, pos, pos.k(static_cast<double>(bins))).to(DType::I64);
    Value ones = b.splat(1, Type{t, x.v.shape()});
    return {b.scatter_flat(b.splat(0, Type{t, {bins}}), idx, ones, true)};
  });
  // (x1, x2, p, compute_mode)
  reg("_cdist_forward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x1 = batch_broadcast(c, in_as(c, 0, t)), x2 = batch_broadcast(c, in_as(c, 1, t));
    return {pairwise_dist(x1, x2, c.f64(2))};
  });
  // (grad, x1, x2, p, cdist) -> grad_x1
  reg("_cdist_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x1 = batch_broadcast(c, in_as(c, 1, t)), x2 = batch_broadcast(c, in_as(c, 2, t));
    return {pairwise_dist_grad(in_as(c, 0, t), x1, x2, in_as(c, 4, t), c.f64(3))};
  });
  // (self [N, M], p): distances of the pairs i < j in row-major order.
  reg("_pdist_forward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t);
    int64_t n = x.v.shape()[0], k = c.out(0).numel();
    if (k == 0) return {b.splat(0, c.out(0))};
    Ex d = pairwise_dist(x, x, c.f64(1));
    auto [up, pos] = pair_positions(b, n);
    Ex target = where(up, pos, pos.k(static_cast<double>(k)));
    Value flat_t = b.reshape(target.v, {n * n}), flat_d = b.reshape(d.v, {n * n});
    return {b.scatter_flat(b.splat(0, Type{t, {k}}), flat_t, flat_d, false)};
  });
  // (grad, self, p, pdist): a pair's gradient reaches both of its rows.
  reg("_pdist_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Ex x = in_as(c, 1, t);
    int64_t n = x.v.shape()[0];
    if (c.in(0).type.numel() == 0 || n < 2) return {b.splat(0, c.out(0))};
    auto [up, pos] = pair_positions(b, n);
    Ex p0 = where(up, pos, pos.k(0));
    auto full = [&](const Ex& v) {
      Ex m(b, b.reshape(b.gather_flat(v, b.reshape(p0.v, {n * n})), {n, n}));
      m = where(up, m, m.k(0));
      return m + Ex(b, b.transpose(m.v, {1, 0}));
    };
    Ex g = full(in_as(c, 0, t)), d = full(in_as(c, 3, t));
    return {pairwise_dist_grad(g, x, x, d, c.f64(2))};
  });
  // isin(elements, test_elements, *, assume_unique, invert), tensor or scalar sides.
  for (const char* n : {"isin.Tensor_Tensor", "isin.Tensor_Scalar", "isin.Scalar_Tensor"}) {
    reg(n, [](Ctx& c) -> V {
      Builder& b = c.b;
      auto as_val = [&](int i) {
        return c.arg(i).isTensor() ? c.in(i) : c.scalar(i, c.in(i == 0 ? 1 : 0).dtype());
      };
      Value e = as_val(0), tv = as_val(1);
      DType t = promote(e.dtype(), tv.dtype());
      int64_t nt = tv.type.numel();
      Shape es = e.shape();
      es.push_back(1);
      Ex lhs(b, b.reshape(b.convert(e, t), es));
      Ex rhs(b, b.reshape(b.convert(tv, t), {nt}));
      Ex hit = lhs.cmp(Cmp::EQ, rhs);
      Value any = b.reduce(hit.v, b.constant(0, DType::Bool), {static_cast<int64_t>(es.size()) - 1},
                           Reducer::Or);
      return {c.flag(3) ? b.unary("not", any) : any};
    });
  }
  // mode(self, dim, keepdim) -> (values, indices): the value of the longest
  // run of equals after sorting (the smallest on ties), with the original
  // index of its last element in the stable sort.
  reg("mode", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0));
    int64_t r = x.rank(), dim = wrap_dim(c.i64(1), r), n = x.shape()[dim];
    auto s = b.sort({x, b.iota(Type{DType::I64, x.shape()}, dim)}, dim, false);
    Ex sv(b, s[0]);
    // count[i] = how many sorted entries equal entry i ([.., i, j, ..] pairs).
    Shape big = x.shape();
    big.insert(big.begin() + dim + 1, n);
    std::vector<int64_t> di, dj;
    for (int64_t k = 0; k < r; ++k) {
      di.push_back(k <= dim ? k : k + 1);
      dj.push_back(k < dim ? k : k + 1);
    }
    Ex si(b, b.broadcast_in_dim(sv.v, big, di)), sj(b, b.broadcast_in_dim(sv.v, big, dj));
    Ex cnt(b, reduce_sum(b, si.cmp(Cmp::EQ, sj).to(DType::I64).v, {dim + 1}, false));
    // Only a run's last entry scores.
    Ex pos(b, b.iota(Type{DType::I64, x.shape()}, dim));
    Shape lo(r, 0), hi = x.shape();
    lo[dim] = 1;
    Ex next(b, b.concatenate({b.slice(sv.v, lo, hi, {}), b.slice(sv.v, Shape(r, 0),
                                                                 [&] {
                                                                   Shape h = x.shape();
                                                                   h[dim] = 1;
                                                                   return h;
                                                                 }(),
                                                                 {})},
                             dim));
    Ex last = pos.cmp(Cmp::EQ, pos.k(static_cast<double>(n - 1))).bin("or", sv.cmp(Cmp::NE, next));
    Ex score = where(last, cnt, cnt.k(0));
    Value at = b.reduce_arg(score.v, dim, true).second;
    Shape ks = x.shape();
    ks[dim] = 1;
    Value k = b.reshape(at, ks);
    return {b.take_along(s[0], k, dim), b.take_along(s[1], k, dim)};
  });
  // linalg_matrix_exp: Taylor series (degree 18, f64) of A / 2^s with
  // ||A / 2^s||_inf <= 1/2, then s squarings (per matrix, in a while loop).
  reg("linalg_matrix_exp", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Ex a(b, b.convert(c.in(0), DType::F64));
    const Shape& s = a.v.shape();
    int64_t r = a.v.rank();
    if (a.v.type.numel() == 0) return {b.splat(0, c.out(0))};
    Ex rows(b, b.iota(Type{DType::I64, s}, r - 2)), cols(b, b.iota(Type{DType::I64, s}, r - 1));
    Ex eye = where(rows.cmp(Cmp::EQ, cols), a.k(1), a.k(0));
    Ex rowsum(b, reduce_sum(b, a.un("abs").v, {r - 1}, true));
    Ex nrm(b, b.reduce(rowsum.v, b.constant(0, DType::F64), {r - 2}, Reducer::Max));
    Shape ns = nrm.v.shape();
    ns.push_back(1);
    nrm = Ex(b, b.reshape(nrm.v, ns));  // [..., 1, 1]
    Ex sq = maximum((nrm.un("log") * (1.0 / std::log(2.0))).un("ceil") + 1.0, nrm.k(0));
    sq = minimum(sq, sq.k(1100));
    Ex x = a / sq.k(2).bin("power", sq);
    Ex e = eye;
    for (int k = 18; k >= 1; --k)
      e = eye + Ex(b, matmul(b, x.v, e.v, DType::F64)) / static_cast<double>(k);
    Ex smax(b,
            b.reduce(sq.v, b.constant(0, DType::F64), reduce_dims({}, sq.v.rank()), Reducer::Max));
    std::vector<Value> out = b.while_loop(
        {b.constant(0, DType::F64), e.v},
        [&](const V& st) { return Ex(b, st[0]).cmp(Cmp::LT, smax).v; },
        [&](const V& st) {
          Ex j(b, st[0]), m(b, st[1]);
          Ex m2(b, matmul(b, m.v, m.v, DType::F64));
          return V{(j + 1.0).v, where(j.cmp(Cmp::LT, sq), m2, m).v};
        });
    return {b.convert(out[1], t)};
  });
  // histogram.bin_ct(self, bins, *, range?, weight?, density) / histogram.bins_tensor(
  // self, bins, *, weight?, density) -> (hist, bin_edges)
  for (const char* name : {"histogram.bin_ct", "histogram.bins_tensor"}) {
    bool given = std::string(name) == "histogram.bins_tensor";
    reg(name, [given](Ctx& c) -> V {
      Builder& b = c.b;
      DType t = math_dtype(c);
      Ex x(b, b.reshape(b.convert(c.in(0), t), {c.in(0).type.numel()}));
      int w_arg = given ? 2 : 3, d_arg = given ? 3 : 4;
      Ex edges = x;
      if (given) {
        edges = Ex(b, b.reshape(b.convert(c.in(1), t), {c.in(1).type.numel()}));
      } else {
        int64_t nb = c.i64(1);
        Ex lo(b, b.constant(0, t)), hi = lo;
        if (!c.is_none(2)) {
          auto r = c.arg(2).toDoubleVector();
          lo = Ex(b, b.constant(r[0], t));
          hi = Ex(b, b.constant(r[1], t));
        } else if (x.v.shape()[0] > 0) {
          lo = Ex(b, b.reduce(x.v, b.constant(INFINITY, t), {0}, Reducer::Min));
          hi = Ex(b, b.reduce(x.v, b.constant(-INFINITY, t), {0}, Reducer::Max));
        } else {
          hi = Ex(b, b.constant(1, t));  // an empty input's bins span [0, 1]
        }
        Ex same = lo.cmp(Cmp::EQ, hi);
        lo = where(same, lo - 0.5, lo);
        hi = where(same, hi + 0.5, hi);
        // linspace(lo, hi, nb + 1) as torch computes it (from both ends).
        Ex i(b, b.iota(Type{t, {nb + 1}}, 0));
        Ex step = (hi - lo) / static_cast<double>(nb);
        Ex half = i.cmp(Cmp::LT, i.k(static_cast<double>((nb + 1) / 2)));
        edges = where(half, lo + step * i, hi - step * (static_cast<double>(nb) - i));
      }
      Ex wv = x;
      bool has_w = !c.is_none(w_arg);
      if (has_w) wv = Ex(b, b.reshape(b.convert(c.in(w_arg), t), {x.v.shape()[0]}));
      return {histogram_counts(b, x, edges, has_w ? &wv : nullptr, c.flag(d_arg)), edges};
    });
  }
  reg("_efficientzerotensor", [](Ctx& c) -> V { return {c.b.splat(0, c.out(0))}; });
  reg("_embedding_bag_forward_only", alias("_embedding_bag"));
}

}  // namespace
}  // namespace torchtpu::lower
