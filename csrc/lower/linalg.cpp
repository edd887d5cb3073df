// Linear algebra: triangular solves and Cholesky (StableHLO ops), partial-pivot
// LU in a while loop (LAPACK getrf semantics) and what builds on it: solve,
// inverse, determinants, lu_unpack/lu_solve; cross products; matrix_exp.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

Shape batch_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }
// x [..., r, c] with its batch dims broadcast to `batch`.
Ex to_batch(const Ex& x, const Shape& batch) {
  const Shape& s = x.v.shape();
  return Ex(*x.b, broadcast_to(*x.b, x.v, with_batch(batch, {s[s.size() - 2], s.back()})));
}
// Keeps the lower (or upper) triangle, k = 0 the diagonal included.
Ex triangle(const Ex& x, bool lower, int64_t k = 0) {
  const Shape& s = x.v.shape();
  Ex r = iota_along(*x.b, s, -2), c = iota_along(*x.b, s, -1);
  Ex keep = lower ? (c - r).cmp(Cmp::LE, r.k(static_cast<double>(k)))
                  : (c - r).cmp(Cmp::GE, r.k(static_cast<double>(k)));
  return where(keep, x, x.k(0));
}
Ex tri_solve(const Ex& a, const Ex& rhs, bool left, bool lower, bool unit, bool trans) {
  return Ex(*a.b, a.b->triangular_solve(a.v, rhs.v, left, lower, unit, trans));
}

Ex ones_where(const Ex& pred, DType t);
Ex eye(Builder& b, const Shape& batch, int64_t n, DType t) {
  Shape s = with_batch(batch, {n, n});
  return ones_where(iota_along(b, s, -2).cmp(Cmp::EQ, iota_along(b, s, -1)), t);
}

struct LU {
  Ex lu, pivots, info;  // pivots I32 [..., k] (1-based), info I32 [...]
};
// Partial-pivot LU of a [..., m, n], one column per loop step: pick the row
// with the largest |a[i, k]| (first on ties), swap, scale, rank-1 update.
LU lu_factor(const Ex& a) {
  Builder& b = *a.b;
  const Shape& s = a.v.shape();
  Shape batch = batch_of(s);
  int64_t m = s[s.size() - 2], n = s.back(), kk = std::min(m, n);
  Shape ps = with_batch(batch, {kk});
  Ex rows = iota_along(b, s, -2), cols = iota_along(b, s, -1);
  Ex rows1 = iota_along(b, with_batch(batch, {m, 1}), -2),
     cols1 = iota_along(b, with_batch(batch, {1, n}), -1);
  Ex pidx = iota_along(b, ps, -1);
  Value piv0 = b.splat(0, Type{DType::I32, ps}), info0 = b.splat(0, Type{DType::I32, batch});
  Value k0 = b.constant_int(0, DType::I64);
  std::vector<Value> out = b.while_loop(
      {k0, a.v, piv0, info0},
      [&](const V& st) {
        return Ex(b, st[0]).cmp(Cmp::LT, Ex(b, b.constant_int(kk, DType::I64))).v;
      },
      [&](const V& st) {
        Ex k(b, st[0]), x(b, st[1]), piv(b, st[2]), info(b, st[3]);
        Ex colk = sum_keep(where(cols.cmp(Cmp::EQ, k), x, x.k(0)), -1);  // [..., m, 1]
        Ex cand = where(rows1.cmp(Cmp::GE, k), colk.un("abs"), colk.k(-1));
        Ex p(b, b.reshape(b.reduce_arg(cand.v, cand.v.rank() - 2, true).second,
                          with_batch(batch, {1, 1})));
        Ex rowk = sum_keep(where(rows.cmp(Cmp::EQ, k), x, x.k(0)), -2);  // [..., 1, n]
        Ex rowp = sum_keep(where(rows.cmp(Cmp::EQ, p), x, x.k(0)), -2);
        Ex x1 = where(rows.cmp(Cmp::EQ, k), rowp, where(rows.cmp(Cmp::EQ, p), rowk, x));
        Ex pivot = sum_keep(where(cols1.cmp(Cmp::EQ, k), rowp, rowp.k(0)), -1);  // [..., 1, 1]
        Ex col = sum_keep(where(cols.cmp(Cmp::EQ, k), x1, x1.k(0)), -1);
        Ex zero = pivot.cmp(Cmp::EQ, pivot.k(0));
        Ex l = where(zero, col.k(0), col / pivot);
        Ex below = rows.cmp(Cmp::GT, k);
        Ex x2 = where(below.bin("and", cols.cmp(Cmp::GT, k)), x1 - l * rowp, x1);
        x2 = where(below.bin("and", cols.cmp(Cmp::EQ, k)), l, x2);
        Ex pb(b, b.reshape(p.v, with_batch(batch, {1})));
        Ex piv2 = where(pidx.cmp(Cmp::EQ, k), (pb + 1.0).to(DType::I32), piv);
        Ex zb(b, b.reshape(zero.v, batch));
        Ex first = zb.bin("and", info.cmp(Cmp::EQ, info.k(0)));
        Ex info2 = where(first, (k + 1.0).to(DType::I32), info);
        return V{(k + 1.0).v, x2.v, piv2.v, info2.v};
      });
  return {Ex(b, out[1]), Ex(b, out[2]), Ex(b, out[3])};
}

// x with a size-1 dim inserted at `pos` (negative counts from the end, -1 appends).
Ex unsq(const Ex& x, int64_t pos) {
  Shape s = x.v.shape();
  int64_t p = pos < 0 ? static_cast<int64_t>(s.size()) + 1 + pos : pos;
  s.insert(s.begin() + p, 1);
  return Ex(*x.b, x.b->reshape(x.v, s));
}
Ex ones_where(const Ex& pred, DType t) {
  Builder& b = *pred.b;
  Type ty{t, pred.v.shape()};
  return where(pred, Ex(b, b.splat(1, ty)), Ex(b, b.splat(0, ty)));
}

// perm[..., i] = the row of A that LAPACK's pivots (row swaps i <-> piv[i]-1,
// in order) move to row i.
Ex pivots_to_perm(const Ex& piv, int64_t m) {
  Builder& b = *piv.b;
  const Shape& s = piv.v.shape();
  Shape ps(s.begin(), s.end() - 1);
  ps.push_back(m);
  Ex pos = iota_along(b, ps, -1), perm = pos;
  Ex pv = piv.to(DType::I64) - 1.0;
  for (int64_t i = 0; i < s.back(); ++i) {
    Shape st(s.size(), 0), lim = s;
    st.back() = i;
    lim.back() = i + 1;
    Ex pi(b, b.slice(pv.v, st, lim, Shape(s.size(), 1)));  // [..., 1]
    Ex is_i = pos.cmp(Cmp::EQ, pos.k(static_cast<double>(i))), is_p = pos.cmp(Cmp::EQ, pi);
    Ex at_i = sum_keep(where(is_i, perm, perm.k(0)), -1),
       at_p = sum_keep(where(is_p, perm, perm.k(0)), -1);
    perm = where(is_i, at_p, where(is_p, at_i, perm));
  }
  return perm;
}
// Rows of x [..., m, c] gathered by perm [..., m]: out[i] = x[perm[i]].
Ex permute_rows(const Ex& x, const Ex& perm) {
  Builder& b = *x.b;
  int64_t m = x.v.shape()[x.v.rank() - 2];
  Shape ps(x.v.shape().begin(), x.v.shape().end() - 1);
  ps.push_back(m);  // [..., i, j]: 1 where j == perm[i]
  Ex pm = ones_where(iota_along(b, ps, -1).cmp(Cmp::EQ, unsq(perm, -1)), x.v.dtype());
  return Ex(b, matmul(b, pm.v, x.v, x.v.dtype()));
}
// Solves A X = B (or A^T X = B when `adjoint`) from A's LU factors; b [..., n, c].
Ex lu_solve_left(const Ex& lu, const Ex& piv, const Ex& rhs, bool adjoint) {
  int64_t n = lu.v.shape().back();
  Ex perm = pivots_to_perm(piv, n);
  if (!adjoint) {
    Ex y = tri_solve(lu, permute_rows(rhs, perm), true, true, true, false);
    return tri_solve(lu, y, true, false, false, false);
  }
  Ex y = tri_solve(lu, rhs, true, false, false, true);
  Ex z = tri_solve(lu, y, true, true, true, true);
  // P^T A = L U, so A^T = U^T L^T P^T and X = P z: X[perm[i]] = z[i].
  Builder& b = *lu.b;
  Shape ps(z.v.shape().begin(), z.v.shape().end() - 1);
  ps.push_back(n);  // [..., r, i]: 1 where perm[i] == r
  Ex pm = ones_where(iota_along(b, ps, -2).cmp(Cmp::EQ, unsq(perm, -2)), z.v.dtype());
  return Ex(b, matmul(b, pm.v, z.v, z.v.dtype()));
}
Ex lu_solve(const Ex& lu, const Ex& piv, const Ex& rhs, bool left, bool adjoint) {
  if (left) return lu_solve_left(lu, piv, rhs, adjoint);
  // X A = B  <=>  A^T X^T = B^T.
  return swap_last(lu_solve_left(lu, piv, swap_last(rhs), !adjoint));
}
// Number of actual row swaps is odd.
Ex odd_swaps(const Ex& piv) {
  Builder& b = *piv.b;
  Ex pos = iota_along(b, piv.v.shape(), -1);
  Ex moved = (piv.to(DType::I64) - 1.0).cmp(Cmp::NE, pos).to(DType::I64);
  Ex cnt(b, b.reduce(moved.v, b.constant_int(0, DType::I64), {moved.v.rank() - 1}, Reducer::Add));
  return cnt.bin("remainder", cnt.k(2)).cmp(Cmp::EQ, cnt.k(1));
}
Ex diag(const Ex& x) {
  Builder& b = *x.b;
  const Shape& s = x.v.shape();
  Ex d = where(iota_along(b, s, -2).cmp(Cmp::EQ, iota_along(b, s, -1)), x, x.k(0));
  Ex r(b, b.reduce(d.v, reduce_init(b, Reducer::Add, x.v.dtype()), {x.v.rank() - 1}, Reducer::Add));
  int64_t k = std::min(s[s.size() - 2], s.back());
  if (r.v.shape().back() == k) return r;
  Shape lim = r.v.shape();
  lim.back() = k;
  return Ex(b, b.slice(r.v, Shape(r.v.rank(), 0), lim, Shape(r.v.rank(), 1)));
}

// B as a matrix: torch treats B [..., n] as a batch of vectors when A is [..., n, n].
bool vector_rhs(const Value& a, const Value& rhs) {
  if (rhs.rank() == 1) return true;
  return rhs.rank() == a.rank() - 1 && Shape(rhs.shape().begin(), rhs.shape().end()) ==
                                           Shape(a.shape().begin(), a.shape().end() - 1);
}

TPU_LOWERING(linalg_triangular) {
  // (A, B, *, upper, left, unitriangular)
  reg("linalg_solve_triangular", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex a = in_as(c, 0, t), rhs = in_as(c, 1, t);
    Shape batch = batch_of(c.out(0).shape);
    return {tri_solve(to_batch(a, batch), to_batch(rhs, batch), c.flag(3), !c.flag(2), c.flag(4),
                      false)};
  });
  // (b, A, upper, transpose, unitriangular) -> (solution, A clone)
  reg("triangular_solve", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex rhs = in_as(c, 0, t), a = in_as(c, 1, t);
    Shape batch = batch_of(c.out(0).shape);
    Ex ab = to_batch(a, batch);
    return {tri_solve(ab, to_batch(rhs, batch), true, !c.flag(2), c.flag(4), c.flag(3)), ab};
  });
  reg("cholesky", [](Ctx& c) -> V {
    Ex a = in_as(c, 0, math_dtype(c));
    bool upper = c.flag(1);
    Ex l(c.b, c.b.cholesky(a.v, true));
    l = triangle(l, true);
    return {upper ? swap_last(l) : l};
  });
  // (A, *, upper, check_errors) -> (L, info); info = first non-positive pivot (1-based).
  reg("linalg_cholesky_ex", [](Ctx& c) -> V {
    Ex a = in_as(c, 0, math_dtype(c));
    Ex l = triangle(Ex(c.b, c.b.cholesky(a.v, true)), true);
    Ex d = diag(l);
    Ex bad = d.cmp(Cmp::GT, d.k(0)).un("not");  // NaN counts as failed
    int64_t n = d.v.shape().back();
    Ex pos = iota_along(c.b, d.v.shape(), -1) + 1.0;
    Ex first(c.b,
             c.b.reduce(where(bad, pos, pos.k(static_cast<double>(n + 1))).v,
                        c.b.constant_int(INT64_MAX, DType::I64), {d.v.rank() - 1}, Reducer::Min));
    Ex info = where(first.cmp(Cmp::GT, first.k(static_cast<double>(n))), first.k(0), first);
    return {c.flag(1) ? swap_last(l) : l, info};
  });
  // (B, L, upper): A = L L^T (or U^T U).
  reg("_cholesky_solve_helper", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex rhs = in_as(c, 0, t), f = in_as(c, 1, t);
    bool upper = c.flag(2);
    Ex y = tri_solve(f, rhs, true, !upper, false, upper);
    return {tri_solve(f, y, true, !upper, false, !upper)};
  });
  reg("cholesky_inverse", [](Ctx& c) -> V {
    Ex f = in_as(c, 0, math_dtype(c));
    bool upper = c.flag(1);
    const Shape& s = f.v.shape();
    Ex i = eye(c.b, batch_of(s), s.back(), f.v.dtype());
    Ex y = tri_solve(f, i, true, !upper, false, upper);
    return {tri_solve(f, y, true, !upper, false, !upper)};
  });
}

// torch's det/slogdet factor A^T instead of A when A is contiguous and real
// (LAPACK wants column-major input); the LU they return, and the backward
// formulas reading it, follow that choice.
bool factor_transposed(Ctx& c, int i) {
  const at::Tensor& a = c.arg(i).toTensor();
  return a.is_contiguous() && !a.is_complex();
}

TPU_LOWERING(linalg_lu) {
  // (A, *, pivot, check_errors) -> (LU, pivots, info)
  reg("linalg_lu_factor_ex", [](Ctx& c) -> V {
    LU f = lu_factor(in_as(c, 0, math_dtype(c)));
    return {f.lu, f.pivots, f.info};
  });
  // (LU, pivots, unpack_data, unpack_pivots) -> (P, L, U)
  auto unpack = [](Ctx& c, const Ex& lu, const Ex& piv) -> V {
    const Shape& s = lu.v.shape();
    int64_t m = s[s.size() - 2], n = s.back(), k = std::min(m, n);
    Shape batch = batch_of(s);
    Ex l = triangle(lu, true, -1), u = triangle(lu, false);
    l = Ex(c.b, c.b.slice(l.v, Shape(s.size(), 0), with_batch(batch, {m, k}), Shape(s.size(), 1)));
    u = Ex(c.b, c.b.slice(u.v, Shape(s.size(), 0), with_batch(batch, {k, n}), Shape(s.size(), 1)));
    Shape ls = l.v.shape();
    l = where(iota_along(c.b, ls, -2).cmp(Cmp::EQ, iota_along(c.b, ls, -1)), l.k(1), l);
    Ex perm = pivots_to_perm(piv, m);
    Shape ps = with_batch(batch, {m, m});
    // P[perm[i], i] = 1
    Ex pr(c.b, c.b.reshape(perm.v, with_batch(batch, {1, m})));
    Ex p = ones_where(iota_along(c.b, ps, -2).cmp(Cmp::EQ, pr), lu.v.dtype());
    return {p, l, u};
  };
  reg("lu_unpack", [unpack](Ctx& c) -> V {
    V r = unpack(c, in_as(c, 0, math_dtype(c)), Ex(c.b, c.in(1)));
    for (int k = 0; k < 3; ++k)
      if (c.out(k).numel() == 0 && Type{r[k].dtype(), r[k].shape()}.numel() != 0)
        r[k] = c.b.splat(0, c.out(k));
    return r;
  });
  reg("linalg_lu", [unpack](Ctx& c) -> V {
    LU f = lu_factor(in_as(c, 0, math_dtype(c)));
    return unpack(c, f.lu, f.pivots);
  });
  // (LU, pivots, B, *, left, adjoint)
  reg("linalg_lu_solve", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Shape batch = batch_of(c.out(0).shape);
    Ex lu = to_batch(in_as(c, 0, t), batch), rhs = to_batch(in_as(c, 2, t), batch);
    Shape pb = batch;
    pb.push_back(c.in(1).shape().back());
    Ex piv(c.b, broadcast_to(c.b, c.in(1), pb));
    return {lu_solve(lu, piv, rhs, c.flag(3), c.flag(4))};
  });
  // (A, B, *, left, check_errors) -> (result, LU, pivots, info)
  reg("_linalg_solve_ex", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex a = in_as(c, 0, t), rhs = in_as(c, 1, t);
    bool left = c.flag(2);
    bool vec = vector_rhs(a.v, rhs.v);
    if (vec) rhs = unsq(rhs, -1);
    Shape batch = broadcast_shapes(batch_of(a.v.shape()), batch_of(rhs.v.shape()));
    Ex ab = to_batch(a, batch);
    LU f = lu_factor(ab);
    Ex x = lu_solve(f.lu, f.pivots, to_batch(rhs, batch), left, false);
    return {x, f.lu, f.pivots, f.info};
  });
  reg("linalg_inv_ex", [](Ctx& c) -> V {
    Ex a = in_as(c, 0, math_dtype(c));
    const Shape& s = a.v.shape();
    LU f = lu_factor(a);
    Ex x = lu_solve(f.lu, f.pivots, eye(c.b, batch_of(s), s.back(), a.v.dtype()), true, false);
    return {x, f.info};
  });
  reg("_linalg_det", [](Ctx& c) -> V {
    Ex a = in_as(c, 0, math_dtype(c));
    LU f = lu_factor(factor_transposed(c, 0) ? swap_last(a) : a);
    Ex d = diag(f.lu);
    Ex det(c.b, c.b.reduce(d.v, c.b.constant(1, d.v.dtype()), {d.v.rank() - 1}, Reducer::Mul));
    return {where(odd_swaps(f.pivots), -det, det), f.lu, f.pivots};
  });
  // (A) -> (sign, logabsdet, LU, pivots)
  reg("_linalg_slogdet", [](Ctx& c) -> V {
    Ex a = in_as(c, 0, math_dtype(c));
    LU f = lu_factor(factor_transposed(c, 0) ? swap_last(a) : a);
    Ex d = diag(f.lu);
    int64_t last = d.v.rank() - 1;
    Ex logabs(c.b, c.b.reduce(d.un("abs").un("log").v, c.b.constant(0, d.v.dtype()), {last},
                              Reducer::Add));
    Ex negs = is_float(d.v.dtype()) ? d.cmp(Cmp::LT, d.k(0)).to(DType::I64) : d;
    Ex cnt(c.b, c.b.reduce(negs.v, c.b.constant_int(0, DType::I64), {last}, Reducer::Add));
    Ex odd = cnt.bin("remainder", cnt.k(2)).cmp(Cmp::EQ, cnt.k(1)).bin("xor", odd_swaps(f.pivots));
    Ex zero(c.b, c.b.reduce(d.cmp(Cmp::EQ, d.k(0)).v, c.b.constant(0, DType::Bool), {last},
                            Reducer::Or));
    Ex sign = where(odd, logabs.k(-1), logabs.k(1));
    sign = where(zero, sign.k(0), sign);
    return {sign, logabs, f.lu, f.pivots};
  });
}

TPU_LOWERING(linalg_cross) {
  // (self, other, *, dim): components picked by slicing the size-3 dim.
  reg("linalg_cross", [](Ctx& c) -> V {
    DType t = c.out(0).dtype;
    const Shape& s = c.out(0).shape;
    Ex x(c.b, broadcast_to(c.b, c.b.convert(c.in(0), t), s));
    Ex y(c.b, broadcast_to(c.b, c.b.convert(c.in(1), t), s));
    int64_t d = wrap_dim(c.i64(2), static_cast<int64_t>(s.size()));
    auto comp = [&](const Ex& v, int64_t i) {
      Shape st(s.size(), 0), lim = s;
      st[d] = i;
      lim[d] = i + 1;
      return Ex(c.b, c.b.slice(v.v, st, lim, Shape(s.size(), 1)));
    };
    Ex x0 = comp(x, 0), x1 = comp(x, 1), x2 = comp(x, 2);
    Ex y0 = comp(y, 0), y1 = comp(y, 1), y2 = comp(y, 2);
    return {
        c.b.concatenate({(x1 * y2 - x2 * y1).v, (x2 * y0 - x0 * y2).v, (x0 * y1 - x1 * y0).v}, d)};
  });
}

// matrix_exp follows the CPU kernel step for step so that float32 results
// carry the same rounding (its error grows with ||A|| through the squarings,
// well past the comparison tolerance for OpInfo's [-9, 9] matrices): the
// optimized Taylor polynomials of degree 1, 2, 4, 8, 12 or 18 picked per matrix
// by its 1-norm (Bader, Blanes and Casas 2019), scaling and squaring above the
// degree-18 bound, all in the input's dtype.
struct Mexp {
  bool f32;  // the CPU's float32 constants (else float64)
  // True at run time (the norm is not NaN), unknown to the compiler. Products
  // are multiplied by a 1 it selects, and coefficients come through it, so
  // that XLA:CPU can neither contract a product and the add after it into an
  // FMA (one rounding fewer than the CPU's multiply-then-add) nor reassociate
  // a constant factor to the end. Real dtypes only.
  std::optional<Ex> live;

  double rd(double v) const { return f32 ? static_cast<double>(static_cast<float>(v)) : v; }
  Ex mul(const Ex& x, const Ex& y) const { return live ? (x * y) * konst(x, 1) : x * y; }
  Ex konst(const Ex& like, double c) const {
    return live ? where(*live, like.k(c), like.k(-c)) : like.k(c);
  }

  // Products in the CPU's order: for n <= 7 its kernel sums k = 0..n-1 one
  // term at a time (measured bitwise equal); larger n go to dot.
  Ex mm(const Ex& x, const Ex& y) const {
    Builder& b = *x.b;
    const Shape& s = x.v.shape();
    int64_t r = x.v.rank(), n = s.back();
    if (n > 7) return Ex(b, matmul(b, x.v, y.v, x.v.dtype()));
    Ex acc = x;
    for (int64_t k = 0; k < n; ++k) {
      Shape st(r, 0), xl = s, yl = s;
      st[r - 1] = k;
      xl[r - 1] = k + 1;
      Value xc = b.slice(x.v, st, xl, Shape(r, 1));
      st[r - 1] = 0;
      st[r - 2] = k;
      yl[r - 2] = k + 1;
      Value yr = b.slice(y.v, st, yl, Shape(r, 1));
      Ex t = mul(Ex(b, broadcast_to(b, xc, s)), Ex(b, broadcast_to(b, yr, s)));
      acc = k == 0 ? t : acc + t;
    }
    return acc;
  }
  // sum_j c[j] * m[j], left to right from zero (the CPU's linear combination).
  Ex comb(const std::vector<Ex>& m, const std::vector<double>& c) const {
    Ex acc = m[0].k(0);
    for (size_t j = 0; j < c.size(); ++j) acc = acc + mul(m[j], konst(m[j], rd(c[j])));
    return acc;
  }

  Ex t4(const std::vector<Ex>& p) const {  // p = {I, A, A^2}
    Ex q = mm(p[2], comb(p, {1 / 2.0, 1 / 6.0, 1 / 24.0}));
    return comb({p[0], p[1], p[2], q}, {1, 1, 0, 1});
  }
  Ex t8(const std::vector<Ex>& p) const {
    double r177 = rd(0.1330413469565007072504e+2), x3 = rd(2. / 3.);
    double x1 = x3 * ((1. + r177) / 88.), x2 = x3 * ((1. + r177) / 352.);
    double x4 = (-271. + 29. * r177) / (315. * x3), x5 = (-11. + 11. * r177) / (1260. * x3);
    double x6 = (-99. + 11. * r177) / (5040. * x3), x7 = (89. - r177) / (5040. * x3);
    double y2 = (857. - 58. * r177) / 630.;
    Ex a4 = mm(p[2], comb({p[1], p[2]}, {x1, x2}));
    Ex a8 = mm(comb({p[2], a4}, {x3, 1}), comb({p[0], p[1], p[2], a4}, {x4, x5, x6, x7}));
    return comb({p[0], p[1], p[2], a4, a8}, {1, 1, y2, 0, 1});
  }
  Ex t12(const std::vector<Ex>& p) const {  // p = {I, A, A^2, A^3}
    const double c[4][4] = {
        {9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740},
        {5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
         0.01108844528519167989},
        {0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
         0.00610700528898058230},
        {-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
         -0.00675951846863086359}};
    std::vector<Ex> q;
    for (const auto& row : c) q.push_back(comb(p, {row, row + 4}));
    Ex q2 = q[2] + mm(q[3], q[3]);
    return q[0] + mm(q[1] + q2, q2);
  }
  Ex t18(const std::vector<Ex>& p) const {  // p = {I, A, A^2, A^3, A^6}
    const double c[5][5] = {
        {0., -1.00365581030144618291e-01, -8.02924648241156932449e-03, -8.92138498045729985177e-04,
         0.},
        {0., 3.97849749499645077844e-01, 1.36783778460411720168e+00, 4.98289622525382669416e-01,
         -6.37898194594723280150e-04},
        {-1.09676396052962061844e+01, 1.68015813878906206114e+00, 5.71779846478865511061e-02,
         -6.98210122488052056106e-03, 3.34975017086070470649e-05},
        {-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
         2.95552570429315521194e-02, -1.39180257516060693404e-05},
        {0., 0., -9.23364619367118555360e-02, -1.69364939002081722752e-02,
         -1.40086798182036094347e-05}};
    std::vector<Ex> q;
    for (const auto& row : c) q.push_back(comb(p, {row, row + 5}));
    Ex q3 = q[3] + mm(q[0], q[4]);
    return q[1] + mm(q[2] + q3, q3);
  }
};

// 2^s for integral s >= 0 (f64 [..]), exactly, as a value of real dtype t.
Ex exp2_int(const Ex& s, DType t) {
  Builder& b = *s.b;
  bool f32 = t == DType::F32;
  Ex e = minimum(s, s.k(f32 ? 127 : 1023)) + (f32 ? 127.0 : 1023.0);
  DType it = f32 ? DType::I32 : DType::I64;
  Ex bits(b, b.convert(e.v, it));
  bits = bits.bin("shift_left", bits.k(f32 ? 23 : 52));
  return Ex(b, b.bitcast_convert(bits.v, t));
}

TPU_LOWERING(linalg_matrix_exp) {
  reg("linalg_matrix_exp", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType out = c.out(0).dtype;
    DType t = compute_dtype(out);  // half types compute in float32
    DType rt = real_part_dtype(t);
    if (c.in(0).type.numel() == 0) return {b.splat(0, c.out(0))};
    Ex a(b, b.convert(c.in(0), t));
    const Shape& s = a.v.shape();
    int64_t r = a.v.rank();
    Mexp m{rt == DType::F32, std::nullopt};
    const double th32[6] = {1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
                            5.800524627688768e-01, 1.461661507209034e+00, 3.010066362817634e+00};
    const double th64[6] = {2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
                            4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e+00};
    const double* th = m.f32 ? th32 : th64;
    // 1-norm (largest column sum), [..., 1, 1].
    Ex col(b, reduce_sum(b, a.un("abs").v, {r - 2}, true));
    Ex nrm(b, b.reduce(col.v, b.constant(-INFINITY, rt), {r - 1}, Reducer::Max));
    Shape ns = batch_of(s);
    ns.insert(ns.end(), {1, 1});
    nrm = Ex(b, b.reshape(nrm.v, ns));
    Ex rows(b, b.iota(Type{DType::I64, s}, r - 2)), cols(b, b.iota(Type{DType::I64, s}, r - 1));
    Ex eye = where(rows.cmp(Cmp::EQ, cols), a.k(1), a.k(0));
    if (!is_complex(t)) m.live = nrm.cmp(Cmp::EQ, nrm);
    // Low degrees on A itself.
    Ex a2 = m.mm(a, a), a3 = m.mm(a, a2);
    std::vector<Ex> low;
    low.push_back(m.comb({eye, a}, {1, 1}));
    low.push_back(m.comb({eye, a, m.mul(a2, m.konst(a2, 0.5))}, {1, 1, 1}));
    low.push_back(m.t4({eye, a, a2}));
    low.push_back(m.t8({eye, a, a2}));
    low.push_back(m.t12({eye, a, a2, a3}));
    // Degree 18 on A / 2^s, then s squarings per matrix.
    // ceil(log2(.)) in f64, exact at powers of two (of the f32 ratio too).
    Ex sq(b, b.convert((nrm / m.rd(th[5])).v, DType::F64));
    sq = sq.un("log") * (1.0 / std::log(2.0)) - (m.f32 ? 1e-9 : 1e-12);
    sq = maximum(sq.un("ceil"), sq.k(0));
    sq = where(sq.cmp(Cmp::EQ, sq), sq, sq.k(0));  // NaN norm: no squaring
    Ex x = a / Ex(b, b.convert(exp2_int(sq, rt).v, t));
    Ex x2 = m.mm(x, x), x3 = m.mm(x, x2);
    Ex e = m.t18({eye, x, x2, x3, m.mm(x3, x3)});
    Ex smax(b,
            b.reduce(sq.v, b.constant(0, DType::F64), reduce_dims({}, sq.v.rank()), Reducer::Max));
    std::vector<Value> loop = b.while_loop(
        {b.constant(0, DType::F64), e.v},
        [&](const V& st) { return Ex(b, st[0]).cmp(Cmp::LT, smax).v; },
        [&](const V& st) {
          Ex j(b, st[0]), mm(b, st[1]);
          return V{(j + 1.0).v, where(j.cmp(Cmp::LT, sq), m.mm(mm, mm), mm).v};
        });
    Ex res(b, loop[1]);
    Ex ge = nrm.cmp(Cmp::GE, nrm.k(m.rd(th[4])));
    for (int i = 4; i >= 0; --i) {
      Ex in = nrm.cmp(Cmp::LE, nrm.k(m.rd(th[i])));
      if (i > 0) in = in.bin("and", nrm.cmp(Cmp::GT, nrm.k(m.rd(th[i - 1]))));
      res = where(in.bin("and", ge.un("not")), low[i], res);
    }
    return {b.convert(res.v, out)};
  });
}

}  // namespace
}  // namespace torchtpu::lower
