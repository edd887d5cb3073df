// LDL^T factorization with Bunch-Kaufman pivoting in LAPACK's compact format
// (sytrf, lower triangle, the unblocked sytf2 order that LAPACK uses for
// n <= 64): L's multipliers below the diagonal, D's 1x1 and 2x2 blocks on it,
// 1-based pivots, negative for both columns of a 2x2 block. Interchanges
// apply only to the trailing matrix (earlier columns of L stay unpermuted),
// which is what ldl_solve's step-by-step application expects. Real and
// complex symmetric (sytrf); complex Hermitian (hetrf) is not lowered.
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

// Max of x over dim (negative), kept as size 1.
Ex kmax(const Ex& x, int64_t dim) {
  Builder& b = *x.b;
  int64_t d = x.v.rank() + dim;
  Shape s = x.v.shape();
  s[d] = 1;
  return Ex(b, b.reshape(b.reduce(x.v, b.constant(-INFINITY, x.v.dtype()), {d}, Reducer::Max), s));
}
Ex both(const Ex& x, const Ex& y) { return x.bin("and", y); }
Ex either(const Ex& x, const Ex& y) { return x.bin("or", y); }
// LAPACK's pivot size: |x|, or |re| + |im| for complex (cabs1).
Ex cabs1(const Ex& x) {
  if (!is_complex(x.v.dtype())) return x.un("abs");
  return x.un("real").un("abs") + x.un("imag").un("abs");
}

struct Ldl {
  Ex ld, piv, info;
};

Ldl ldl_factor(const Ex& a0) {
  Builder& b = *a0.b;
  const Shape& s = a0.v.shape();
  int64_t r = a0.v.rank(), n = s.back();
  Shape batch(s.begin(), s.end() - 2);
  Shape b11 = with_batch(batch, {1, 1}), bn1 = with_batch(batch, {n, 1}),
        b1n = with_batch(batch, {1, n});
  Ex R = iota_along(b, s, -2), C = iota_along(b, s, -1);
  Ex ri = iota_along(b, bn1, -2), cj = iota_along(b, b1n, -1);
  Shape pbs = with_batch(batch, {n});
  Ex pidx = iota_along(b, pbs, -1);
  Ex lower = C.cmp(Cmp::LE, R);
  Ex a = where(lower, a0, a0.k(0));
  // Alpha as LAPACK computes it in the working precision.
  Ex alpha = (Ex(b, b.splat(17, Type{real_part_dtype(a.v.dtype()), b11})).un("sqrt") + 1.0) / 8.0;
  Ex k0(b, b.splat(0, Type{DType::I64, b11}));
  Value piv0 = b.splat(0, Type{DType::I32, pbs}), info0 = b.splat(0, Type{DType::I32, batch});
  auto to_row = [&](const Ex& col) { return Ex(b, b.reshape(col.v, b1n)); };
  auto to_b = [&](const Ex& x) { return Ex(b, b.reshape(x.v, with_batch(batch, {1}))); };
  std::vector<Value> out = b.while_loop(
      {k0.v, a.v, piv0, info0},
      [&](const V& st) {
        Ex k(b, st[0]);
        Ex kmin(b, b.reduce(k.v, b.constant_int(n, DType::I64), reduce_dims({}, r), Reducer::Min));
        return kmin.cmp(Cmp::LT, Ex(b, b.constant_int(n, DType::I64))).v;
      },
      [&](const V& st) {
        Ex k(b, st[0]), x(b, st[1]), piv(b, st[2]), info(b, st[3]);
        Ex active = k.cmp(Cmp::LT, k.k(static_cast<double>(n)));
        auto at = [&](const Ex& m, const Ex& i, const Ex& j) {  // m[i, j], [..., 1, 1]
          return sum_keep(
              sum_keep(where(both(R.cmp(Cmp::EQ, i), C.cmp(Cmp::EQ, j)), m, m.k(0)), -1), -2);
        };
        auto col = [&](const Ex& m, const Ex& j) {
          return sum_keep(where(C.cmp(Cmp::EQ, j), m, m.k(0)), -1);
        };
        // Pivot choice.
        Ex absakk = cabs1(at(x, k, k));
        Ex ak = col(x, k);
        Ex aka = cabs1(ak);
        Ex cand = where(ri.cmp(Cmp::GT, k), aka, aka.k(-1));  // idamax below k
        auto [cmv, cmi] = b.reduce_arg(cand.v, r - 2, true);
        Ex colmax(b, b.reshape(cmv, b11)), imax(b, b.reshape(cmi, b11));
        colmax = maximum(colmax, colmax.k(0));
        Ex row_im = sum_keep(where(R.cmp(Cmp::EQ, imax), x, x.k(0)), -2);  // x[imax, :]
        Ex ra = cabs1(row_im);
        Ex rm1 = kmax(where(both(cj.cmp(Cmp::GE, k), cj.cmp(Cmp::LT, imax)), ra, ra.k(-1)), -1);
        Ex col_im = col(x, imax);
        Ex ca = cabs1(col_im);
        Ex rm2 = kmax(where(ri.cmp(Cmp::GT, imax), ca, ca.k(-1)), -2);
        Ex rowmax = maximum(rm1, rm2);
        Ex aimim = cabs1(at(x, imax, imax));
        Ex zero =
            either(maximum(absakk, colmax).cmp(Cmp::EQ, absakk.k(0)), absakk.cmp(Cmp::NE, absakk));
        Ex keep = either(zero, either(absakk.cmp(Cmp::GE, alpha * colmax),
                                      absakk.cmp(Cmp::GE, alpha * colmax * (colmax / rowmax))));
        Ex c3 = aimim.cmp(Cmp::GE, alpha * rowmax);
        Ex kp = where(keep, k, imax);
        Ex two = either(keep, c3).un("not");
        Ex kstep = where(two, k.k(2), k.k(1));
        Ex kk = k + kstep - 1.0;
        // Interchange kk <-> kp in the trailing matrix: a symmetric permutation
        // of the lower triangle (data movement only).
        Ex pi = where(ri.cmp(Cmp::EQ, kk), kp, where(ri.cmp(Cmp::EQ, kp), kk, ri));
        Ex pj = where(cj.cmp(Cmp::EQ, kk), kp, where(cj.cmp(Cmp::EQ, kp), kk, cj));
        Ex sym = where(lower, x, Ex(b, b.swap_dims(x.v, r - 1, r - 2)));
        Value g = b.take_along(sym.v, broadcast_to(b, pi.v, s), r - 2);
        g = b.take_along(g, broadcast_to(b, pj.v, s), r - 1);
        Ex trail = both(both(R.cmp(Cmp::GE, k), C.cmp(Cmp::GE, k)), lower);
        Ex x1 = where(trail, Ex(b, g), x);
        // Update the trailing matrix and store L's column(s).
        Ex ck = col(x1, k), ck1 = col(x1, k + 1.0);  // [..., n, 1]
        Ex akk = at(x1, k, k);
        Ex d11 = 1.0 / akk;
        Ex xv = where(ri.cmp(Cmp::GT, k), ck, ck.k(0));
        Ex upd1 = x1 + xv * to_row(-d11 * xv);  // syr: a[i, j] + x[i] * (-d11 * x[j])
        Ex d21 = at(x1, k + 1.0, k);
        Ex e11 = at(x1, k + 1.0, k + 1.0) / d21, e22 = akk / d21;
        Ex t = 1.0 / (e11 * e22 - 1.0);
        d21 = t / d21;
        Ex wk = d21 * (e11 * ck - ck1), wkp1 = d21 * (e22 * ck1 - ck);  // rows j >= k + 2
        Ex upd2 = x1 - ck * to_row(wk) - ck1 * to_row(wkp1);
        Ex go = both(active, zero.un("not"));
        Ex is1 = both(go, two.un("not")), is2 = both(go, two);
        Ex x2 = where(both(is1, both(C.cmp(Cmp::GT, k), lower)), upd1, x1);
        x2 = where(both(is1, both(C.cmp(Cmp::EQ, k), R.cmp(Cmp::GT, k))), xv * d11, x2);
        Ex k2 = k + 2.0;
        x2 = where(both(is2, both(C.cmp(Cmp::GE, k2), lower)), upd2, x2);
        Ex below2 = R.cmp(Cmp::GE, k2);
        x2 = where(both(is2, both(C.cmp(Cmp::EQ, k), below2)), wk, x2);
        x2 = where(both(is2, both(C.cmp(Cmp::EQ, k + 1.0), below2)), wkp1, x2);
        // Pivots (1-based; both columns of a 2x2 block get -kp) and info.
        Ex kb = to_b(k), kpb = to_b(kp), twob = to_b(two), actb = to_b(active);
        Ex pv = (kpb + 1.0).to(DType::I32);
        pv = where(twob, -pv, pv);
        Ex piv2 = where(both(actb, pidx.cmp(Cmp::EQ, kb)), pv, piv);
        piv2 = where(both(both(actb, twob), pidx.cmp(Cmp::EQ, kb + 1.0)), pv, piv2);
        Ex zb(b, b.reshape(both(active, zero).v, batch));
        Ex kn(b, b.reshape(k.v, batch));
        Ex info2 = where(both(zb, info.cmp(Cmp::EQ, info.k(0))), (kn + 1.0).to(DType::I32), info);
        return V{where(active, k + kstep, k).v, x2.v, piv2.v, info2.v};
      });
  return {Ex(b, out[1]), Ex(b, out[2]), Ex(b, out[3])};
}

// Solves LD X = B with sytf2's factor and pivots (LAPACK sytrs, lower): the
// pivots' interchanges and L's columns applied in factorization order, D's
// blocks inverted, then L^T and the interchanges in reverse. ld [..., n, n],
// piv [..., n], rhs [..., n, m], batch dims already equal.
Ex ldl_solve(const Ex& ld, const Ex& piv, const Ex& rhs) {
  Builder& b = *ld.b;
  const Shape& s = rhs.v.shape();
  int64_t r = rhs.v.rank(), n = s[r - 2];
  Shape batch(s.begin(), s.end() - 2);
  Shape b11 = with_batch(batch, {1, 1}), bn1 = with_batch(batch, {n, 1});
  Ex R = iota_along(b, s, -2), ri = iota_along(b, bn1, -2);
  Ex pidx = iota_along(b, with_batch(batch, {n}), -1);
  Ex piv64 = piv.to(DType::I64);
  Shape ls = ld.v.shape();
  Ex LR = iota_along(b, ls, -2), LC = iota_along(b, ls, -1);
  auto pivot_at = [&](const Ex& k) {  // piv[k], [..., 1, 1]
    Ex kb(b, b.reshape(k.v, with_batch(batch, {1})));
    Ex v = where(pidx.cmp(Cmp::EQ, kb), piv64, piv64.k(0));
    return Ex(b, b.reshape(reduce_sum(b, v.v, {r - 2}, true), b11));
  };
  auto lcol = [&](const Ex& j) {  // ld[:, j], [..., n, 1]
    return sum_keep(where(LC.cmp(Cmp::EQ, j), ld, ld.k(0)), -1);
  };
  auto lat = [&](const Ex& i, const Ex& j) {
    return sum_keep(sum_keep(where(both(LR.cmp(Cmp::EQ, i), LC.cmp(Cmp::EQ, j)), ld, ld.k(0)), -1),
                    -2);
  };
  auto row = [&](const Ex& x, const Ex& i) {
    return sum_keep(where(R.cmp(Cmp::EQ, i), x, x.k(0)), -2);
  };
  auto swap_rows = [&](const Ex& x, const Ex& i, const Ex& j) {
    Ex p = where(ri.cmp(Cmp::EQ, i), j, where(ri.cmp(Cmp::EQ, j), i, ri));
    return Ex(b, b.take_along(x.v, broadcast_to(b, p.v, s), r - 2));
  };
  auto kmin_lt = [&](const Ex& k, double lim, bool up) {
    Reducer red = up ? Reducer::Min : Reducer::Max;
    Ex m(b, b.reduce(k.v, b.constant_int(up ? n : -1, DType::I64), reduce_dims({}, r), red));
    return up ? m.cmp(Cmp::LT, m.k(lim)).v : m.cmp(Cmp::GE, m.k(lim)).v;
  };
  Ex k0(b, b.splat(0, Type{DType::I64, b11}));
  // L D X = B.
  std::vector<Value> fw = b.while_loop(
      {k0.v, rhs.v}, [&](const V& st) { return kmin_lt(Ex(b, st[0]), n, true); },
      [&](const V& st) {
        Ex k(b, st[0]), x(b, st[1]);
        Ex active = k.cmp(Cmp::LT, k.k(static_cast<double>(n)));
        Ex p = pivot_at(k);
        Ex two = p.cmp(Cmp::LT, p.k(0));
        Ex k1 = k + 1.0;
        Ex kp = where(two, -p, p) - 1.0;
        Ex y = swap_rows(x, where(two, k1, k), kp);
        // ger: b[i, :] + l[i, k] * (-b[k, :]) below the block, one column at a time.
        Ex lk = lcol(k), lk1 = lcol(k1);
        Ex bk = row(y, k), bk1 = row(y, k1);
        Ex y1 = where(R.cmp(Cmp::GT, k), y + lk * -bk, y);
        y1 = where(R.cmp(Cmp::EQ, k), bk * (1.0 / lat(k, k)), y1);
        Ex below2 = R.cmp(Cmp::GT, k1);
        Ex y2 = where(below2, y + lk * -bk, y);
        y2 = where(below2, y2 + lk1 * -bk1, y2);
        Ex akm1k = lat(k1, k), akm1 = lat(k, k) / akm1k, ak = lat(k1, k1) / akm1k;
        Ex denom = akm1 * ak - 1.0;
        Ex bkm1 = bk / akm1k, bkk = bk1 / akm1k;
        y2 = where(R.cmp(Cmp::EQ, k), (ak * bkm1 - bkk) / denom, y2);
        y2 = where(R.cmp(Cmp::EQ, k1), (akm1 * bkk - bkm1) / denom, y2);
        Ex out = where(active, where(two, y2, y1), x);
        return V{where(active, where(two, k + 2.0, k1), k).v, out.v};
      });
  // L^T X = B, from the last column back.
  Ex kn(b, b.splat(static_cast<double>(n - 1), Type{DType::I64, b11}));
  std::vector<Value> bw = b.while_loop(
      {kn.v, fw[1]}, [&](const V& st) { return kmin_lt(Ex(b, st[0]), 0, false); },
      [&](const V& st) {
        Ex k(b, st[0]), x(b, st[1]);
        Ex active = k.cmp(Cmp::GE, k.k(0));
        Ex p = pivot_at(k);
        Ex two = p.cmp(Cmp::LT, p.k(0));
        Ex km1 = k - 1.0;
        Ex below = R.cmp(Cmp::GT, k);
        // gemv^T: b[k, :] - sum_{i > k} b[i, :] l[i, k]
        auto dot_below = [&](const Ex& j) {
          return sum_keep(where(below, x * lcol(j), x.k(0)), -2);
        };
        Ex y = where(R.cmp(Cmp::EQ, k), x - dot_below(k), x);
        y = where(both(two, R.cmp(Cmp::EQ, km1)), y - dot_below(km1), y);
        Ex kp = where(two, -p, p) - 1.0;
        y = swap_rows(y, k, kp);
        Ex out = where(active, y, x);
        return V{where(active, where(two, k - 2.0, km1), k).v, out.v};
      });
  return Ex(b, bw[1]);
}

TPU_LOWERING(linalg_ldl_factor) {
  // (A, *, hermitian, check_errors) -> (LD, pivots, info); hermitian only
  // matters for complex inputs (LAPACK's hetrf path, not lowered).
  reg("linalg_ldl_factor_ex", [](Ctx& c) -> V {
    if (is_complex(c.in(0).dtype()) && c.flag(1))
      throw hlo::BuildError(
          "[lower] linalg_ldl_factor_ex: hermitian=True for complex input "
          "(LAPACK hetrf) is not supported; complex symmetric is");
    if (c.in(0).type.numel() == 0)
      return {c.b.splat(0, c.out(0)), c.b.splat(0, c.out(1)), c.b.splat(0, c.out(2))};
    Ldl f = ldl_factor(in_as(c, 0, math_dtype(c)));
    return {c.b.convert(f.ld.v, c.out(0).dtype), f.piv.v, f.info.v};
  });
}

TPU_LOWERING(linalg_ldl_solve) {
  // (LD, pivots, B, *, hermitian) -> X; batch dims of LD and B broadcast.
  reg("linalg_ldl_solve", [](Ctx& c) -> V {
    if ((is_complex(c.in(0).dtype()) || is_complex(c.in(2).dtype())) && c.flag(3))
      throw hlo::BuildError(
          "[lower] linalg_ldl_solve: hermitian=True for complex input "
          "(LAPACK hetrs) is not supported; complex symmetric is");
    if (c.out(0).numel() == 0) return {c.b.splat(0, c.out(0))};
    DType t = math_dtype(c);
    Ex ld = in_as(c, 0, t), piv(c.b, c.in(1)), rhs = in_as(c, 2, t);
    const Shape &ls = ld.v.shape(), &bs = rhs.v.shape();
    Shape batch =
        broadcast_shapes(Shape(ls.begin(), ls.end() - 2), Shape(bs.begin(), bs.end() - 2));
    auto to = [&](const Ex& x, std::initializer_list<int64_t> tail) {
      return Ex(c.b, broadcast_to(c.b, x.v, with_batch(batch, tail)));
    };
    int64_t n = ls.back(), m = bs.back();
    Ex x = ldl_solve(to(ld, {n, n}), to(piv, {n}), to(rhs, {n, m}));
    return {c.b.convert(x.v, c.out(0).dtype)};
  });
}

}  // namespace
}  // namespace torchtpu::lower
