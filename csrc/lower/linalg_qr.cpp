// QR by Householder reflections in LAPACK's form (geqrf: R above the
// diagonal, reflector vectors below it with an implicit leading 1, and tau;
// R's diagonal gets -sign(alpha) * norm as LAPACK's larfg does), one column
// per while-loop step; householder_product (orgqr), ormqr and linalg_qr on top.
#include <algorithm>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using V = std::vector<Value>;

Shape with_tail(Shape s, int64_t a, int64_t b) {
  s[s.size() - 2] = a;
  s[s.size() - 1] = b;
  return s;
}
Ex slice_last2(const Ex& x, int64_t rows, int64_t cols) {
  Shape lim = with_tail(x.v.shape(), rows, cols);
  return Ex(*x.b, x.b->slice(x.v, Shape(lim.size(), 0), lim, Shape(lim.size(), 1)));
}
Value i64(Builder& b, int64_t v) { return b.constant_int(v, DType::I64); }

// Reflector j of a geqrf result as a column [..., m, 1]: 1 at j, a[i, j] below.
Ex reflector(const Ex& a, const Ex& j) {
  Builder& b = *a.b;
  const Shape& s = a.v.shape();
  Ex cols = iota_along(b, s, -1);
  Ex col = sum_keep(where(cols.cmp(Cmp::EQ, j), a, a.k(0)), -1);
  Ex rows1 = iota_along(b, col.v.shape(), -2);
  return where(rows1.cmp(Cmp::EQ, j), col.k(1), where(rows1.cmp(Cmp::GT, j), col, col.k(0)));
}

std::pair<Ex, Ex> geqrf(const Ex& a0) {
  Builder& b = *a0.b;
  const Shape& s = a0.v.shape();
  int64_t m = s[s.size() - 2], n = s.back(), k = std::min(m, n);
  Shape ts(s.begin(), s.end() - 1);
  ts.back() = k;
  Value tau0 = b.splat(0, Type{a0.v.dtype(), ts});
  if (k == 0) return {a0, Ex(b, tau0)};
  Ex rows = iota_along(b, s, -2), cols = iota_along(b, s, -1), tpos = iota_along(b, ts, -1);
  std::vector<Value> out = b.while_loop(
      {i64(b, 0), a0.v, tau0},
      [&](const V& st) { return Ex(b, st[0]).cmp(Cmp::LT, Ex(b, i64(b, k))).v; },
      [&](const V& st) {
        Ex j(b, st[0]), a(b, st[1]), tau(b, st[2]);
        Ex col = sum_keep(where(cols.cmp(Cmp::EQ, j), a, a.k(0)), -1);  // [..., m, 1]
        Ex rows1 = iota_along(b, col.v.shape(), -2);
        Ex below = rows1.cmp(Cmp::GT, j);
        Ex alpha = sum_keep(where(rows1.cmp(Cmp::EQ, j), col, col.k(0)), -2);  // [..., 1, 1]
        Ex xb = where(below, col, col.k(0));
        Ex xnorm2 = sum_keep(xb * xb, -2);
        Ex norm = (alpha * alpha + xnorm2).un("sqrt");
        Ex trivial = xnorm2.cmp(Cmp::EQ, xnorm2.k(0));
        Ex beta = where(trivial, alpha, where(alpha.cmp(Cmp::GE, alpha.k(0)), -norm, norm));
        Ex t = where(trivial, beta.k(0), (beta - alpha) / beta);
        Ex scale = where(trivial, beta.k(0), 1.0 / (alpha - beta));
        Ex v = where(rows1.cmp(Cmp::EQ, j), col.k(1), xb * scale);
        // H = I - t v v^T on the columns right of j.
        Ex w = sum_keep(v * a, -2);  // [..., 1, n]
        Ex a2 = where(cols.cmp(Cmp::GT, j), a - t * v * w, a);
        Ex at_j = cols.cmp(Cmp::EQ, j);
        a2 = where(at_j.bin("and", rows.cmp(Cmp::EQ, j)), beta, a2);
        a2 = where(at_j.bin("and", rows.cmp(Cmp::GT, j)), v, a2);
        Ex tb(b, b.reshape(t.v, Shape(ts.begin(), ts.end() - 1)));
        Shape tsb = tb.v.shape();
        tsb.push_back(1);
        Ex tau2 = where(tpos.cmp(Cmp::EQ, j), Ex(b, b.reshape(tb.v, tsb)), tau);
        return V{(j + 1.0).v, a2.v, tau2.v};
      });
  return {Ex(b, out[1]), Ex(b, out[2])};
}

// H_0 H_1 ... H_{k-1} as a full [..., m, m] matrix.
Ex householder_q(const Ex& a, const Ex& tau) {
  Builder& b = *a.b;
  const Shape& s = a.v.shape();
  int64_t m = s[s.size() - 2], k = tau.v.shape().back();
  Shape qs = with_tail(s, m, m);
  Ex q = where(iota_along(b, qs, -2).cmp(Cmp::EQ, iota_along(b, qs, -1)),
               Ex(b, b.splat(1, Type{a.v.dtype(), qs})), Ex(b, b.splat(0, Type{a.v.dtype(), qs})));
  if (k == 0) return q;
  Ex tpos = iota_along(b, tau.v.shape(), -1);
  std::vector<Value> out = b.while_loop(
      {i64(b, 0), q.v}, [&](const V& st) { return Ex(b, st[0]).cmp(Cmp::LT, Ex(b, i64(b, k))).v; },
      [&](const V& st) {
        Ex j(b, st[0]), qq(b, st[1]);
        Ex v = reflector(a, j);
        Ex t = sum_keep(where(tpos.cmp(Cmp::EQ, j), tau, tau.k(0)), -1);  // [..., 1]
        Shape t2 = t.v.shape();
        t2.push_back(1);
        t = Ex(b, b.reshape(t.v, t2));
        Ex qv(b, matmul(b, qq.v, v.v, qq.v.dtype()));  // [..., m, 1]
        return V{(j + 1.0).v, (qq - t * qv * swap_last(v)).v};
      });
  return Ex(b, out[1]);
}

Ex triu(const Ex& x) {
  Builder& b = *x.b;
  const Shape& s = x.v.shape();
  return where(iota_along(b, s, -1).cmp(Cmp::GE, iota_along(b, s, -2)), x, x.k(0));
}

// Least squares for full-rank A [..., m, n] (LAPACK gels): QR of A when
// m >= n, the minimum-norm solution through the QR of A^T otherwise.
// Returns the solution [..., n, k] and the residual sums of squares [..., k].
std::pair<Ex, Ex> lstsq(const Ex& a, const Ex& rhs) {
  Builder& b = *a.b;
  const Shape& s = a.v.shape();
  int64_t m = s[s.size() - 2], n = s.back();
  if (m >= n) {
    auto [f, tau] = geqrf(a);
    Ex qtb = Ex(b, matmul(b, swap_last(householder_q(f, tau)).v, rhs.v, a.v.dtype()));
    Ex top = slice_last2(qtb, n, rhs.v.shape().back());
    Ex x(b, b.triangular_solve(slice_last2(f, n, n).v, top.v, true, false, false, false));
    Shape lo(qtb.v.rank(), 0);
    lo[lo.size() - 2] = n;
    Ex rest(b, b.slice(qtb.v, lo, qtb.v.shape(), Shape(lo.size(), 1)));
    Ex res(b, reduce_sum(b, (rest * rest).v, {rest.v.rank() - 2}, false));
    return {x, res};
  }
  auto [f, tau] = geqrf(swap_last(a));  // A^T = Q R, A = R^T Q^T
  Ex y(b, b.triangular_solve(slice_last2(f, m, m).v, rhs.v, true, false, false, true));
  Ex q = slice_last2(householder_q(f, tau), n, m);
  return {Ex(b, matmul(b, q.v, y.v, a.v.dtype())), Ex(b, b.splat(0, Type{a.v.dtype(), {0}}))};
}

TPU_LOWERING(linalg_qr) {
  // (A, B, rcond?, *, driver?) -> (solution, residuals, rank, singular_values)
  reg("linalg_lstsq", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex a(c.b, c.b.convert(c.in(0), t)), rhs(c.b, c.b.convert(c.in(1), t));
    bool vec = rhs.v.rank() == a.v.rank() - 1;
    if (vec) {
      Shape s = rhs.v.shape();
      s.push_back(1);
      rhs = Ex(c.b, c.b.reshape(rhs.v, s));
    }
    Shape batch = broadcast_shapes(Shape(a.v.shape().begin(), a.v.shape().end() - 2),
                                   Shape(rhs.v.shape().begin(), rhs.v.shape().end() - 2));
    auto full = [&](const Ex& x) {
      Shape s = batch;
      s.push_back(x.v.shape()[x.v.rank() - 2]);
      s.push_back(x.v.shape().back());
      return Ex(c.b, broadcast_to(c.b, x.v, s));
    };
    if (a.v.type.numel() == 0 || rhs.v.type.numel() == 0)
      return {c.b.splat(0, c.out(0)), c.b.splat(0, c.out(1)), c.b.splat(0, c.out(2)),
              c.b.splat(0, c.out(3))};
    auto [x, res] = lstsq(full(a), full(rhs));
    Value r = c.out(1).numel() == res.v.type.numel() ? res.v : c.b.splat(0, c.out(1));
    Value rank = c.b.splat(0, c.out(2));
    if (c.out(2).numel() > 0) {
      // Numerical rank from R's diagonal: |r_ii| > rcond * max |r_ii|.
      const Shape& s = a.v.shape();
      int64_t m = s[s.size() - 2], n = s.back();
      Ex f = geqrf(m >= n ? a : swap_last(a)).first;
      const Shape& fs = f.v.shape();
      Ex d(c.b, reduce_sum(
                    c.b,
                    where(iota_along(c.b, fs, -2).cmp(Cmp::EQ, iota_along(c.b, fs, -1)), f, f.k(0))
                        .un("abs")
                        .v,
                    {f.v.rank() - 2}, false));
      int64_t last = d.v.rank() - 1;
      Ex dmax(c.b, c.b.reduce(d.v, c.b.constant(0, t), {last}, hlo::Reducer::Max));
      double rc =
          c.is_none(2) ? 1.1920928955078125e-07 * static_cast<double>(std::max(m, n)) : c.f64(2);
      Shape ds = dmax.v.shape();
      ds.push_back(1);
      Ex above = d.cmp(Cmp::GT, Ex(c.b, c.b.reshape(dmax.v, ds)) * rc);
      rank = c.b.reduce(above.to(DType::I64).v, c.b.constant_int(0, DType::I64), {last},
                        hlo::Reducer::Add);
    }
    Value sv = c.out(3).numel() > 0 ? singular_values(full(a)).v : c.b.splat(0, c.out(3));
    return {x, r, rank, sv};
  });
  reg("geqrf", [](Ctx& c) -> V {
    auto [a, tau] = geqrf(Ex(c.b, c.b.convert(c.in(0), compute_dtype(c.out(0).dtype))));
    return {a, tau};
  });
  // (input, tau): the first n columns of the reflectors' product.
  reg("linalg_householder_product", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex a(c.b, c.b.convert(c.in(0), t)), tau(c.b, c.b.convert(c.in(1), t));
    const Shape& s = a.v.shape();
    return {slice_last2(householder_q(a, tau), s[s.size() - 2], s.back())};
  });
  // (input, tau, other, left, transpose): op(Q) other or other op(Q).
  reg("ormqr", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex a(c.b, c.b.convert(c.in(0), t)), tau(c.b, c.b.convert(c.in(1), t));
    Ex other(c.b, c.b.convert(c.in(2), t));
    Ex q = householder_q(a, tau);
    if (c.flag(4)) q = swap_last(q);
    Value r = c.flag(3) ? matmul(c.b, q.v, other.v, t) : matmul(c.b, other.v, q.v, t);
    return {r};
  });
  // (A, mode) -> (Q, R); mode reduced | complete | r.
  reg("linalg_qr", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex a0(c.b, c.b.convert(c.in(0), t));
    const Shape& s = a0.v.shape();
    int64_t m = s[s.size() - 2], n = s.back(), k = std::min(m, n);
    std::string mode = c.arg(1).toStringRef();
    if (a0.v.type.numel() == 0) return {c.b.splat(0, c.out(0)), c.b.splat(0, c.out(1))};
    auto [a, tau] = geqrf(a0);
    bool complete = mode == "complete";
    Ex r = slice_last2(triu(a), complete ? m : k, n);
    if (mode == "r") return {c.b.splat(0, c.out(0)), r};
    return {slice_last2(householder_q(a, tau), m, complete ? m : k), r};
  });
}

}  // namespace
}  // namespace torchtpu::lower
