// Pairwise distances: cdist (p-norm distances between the rows of two batched
// matrices) and pdist (between the rows of one matrix), with their backward ops.
#include <cmath>
#include <utility>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

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

TPU_LOWERING(distance) {
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
}

}  // namespace
}  // namespace torchtpu::lower
