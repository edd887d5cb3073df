// Symmetric (or complex Hermitian) eigendecomposition by cyclic Jacobi
// rotations and the SVD built on it (eigenvectors of A^H A or A A^H), computed
// in f64 (c128) so that the squared condition number costs no float32
// accuracy. Eigen/singular vectors are unique only up to sign (a phase when
// complex): LAPACK's choice is not reproduced.
#include <algorithm>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

constexpr int kSweeps = 12;

std::vector<int64_t> last_two(int64_t r) { return {r - 2, r - 1}; }
// The f64 (c128 for complex) working dtype.
DType wide(DType t) { return is_complex(t) ? DType::C128 : DType::F64; }
Ex adjoint(const Ex& x) { return conj(swap_last(x)); }
Ex real_of(const Ex& x) { return is_complex(x.v.dtype()) ? x.un("real") : x; }
Ex mm(const Ex& x, const Ex& y) { return Ex(*x.b, matmul(*x.b, x.v, y.v, x.v.dtype())); }

// Eigenvalues ascending [..., n] (f64) and eigenvectors (columns) [..., n, n]
// of the symmetric (f64) or Hermitian (c128) a [..., n, n].
std::pair<Ex, Ex> eigh_jacobi(Ex a) {
  Builder& b = *a.b;
  const Shape s = a.v.shape();
  int64_t r = a.v.rank(), n = s.back();
  bool cplx = is_complex(a.v.dtype());
  Ex rows = iota_along(b, s, -2), cols = iota_along(b, s, -1);
  Ex eye = where(rows.cmp(Cmp::EQ, cols), a.k(1), a.k(0));
  if (n > 1) {
    auto i64 = [&](int64_t v) { return Ex(b, b.constant_int(v, DType::I64)); };
    int64_t steps = kSweeps * n * (n - 1) / 2;
    std::vector<Value> out = b.while_loop(
        {i64(0).v, i64(0).v, i64(1).v, a.v, eye.v},
        [&](const V& st) { return Ex(b, st[0]).cmp(Cmp::LT, i64(steps)).v; },
        [&](const V& st) {
          Ex t(b, st[0]), p(b, st[1]), q(b, st[2]), x(b, st[3]), v(b, st[4]);
          auto at = [&](const Ex& i, const Ex& j) {
            Ex m = rows.cmp(Cmp::EQ, i).bin("and", cols.cmp(Cmp::EQ, j));
            return Ex(b, reduce_sum(b, where(m, x, x.k(0)).v, last_two(r), true));
          };
          Ex app = real_of(at(p, p)), aqq = real_of(at(q, q)), apq = at(p, q);
          // Complex a[p, q] = r e^(i phi): the phase e^(-i phi) on column q
          // makes it real (r), then the real rotation applies.
          Ex ph = apq.k(1);
          if (cplx) {
            Ex r = apq.un("abs");
            Ex rz = r.cmp(Cmp::EQ, r.k(0));
            Value rc = b.complex(where(rz, r.k(1), r).v, r.k(0).v);
            ph = where(rz, apq.k(1), conj(apq) / Ex(b, rc));
            apq = r;
          }
          // Rotation zeroing a[p, q]: tan = sign(th) / (|th| + sqrt(th^2 + 1)).
          Ex nz = apq.cmp(Cmp::NE, apq.k(0));
          Ex th = (aqq - app) / (where(nz, apq, apq.k(1)) * 2.0);
          Ex sg = where(th.cmp(Cmp::GE, th.k(0)), th.k(1), th.k(-1));
          Ex tn = sg / (th.un("abs") + (th * th + 1.0).un("sqrt"));
          tn = where(nz, tn, tn.k(0));
          Ex cs = (tn * tn + 1.0).un("rsqrt"), sn = tn * cs;
          Ex rp = rows.cmp(Cmp::EQ, p), rq = rows.cmp(Cmp::EQ, q);
          Ex cp = cols.cmp(Cmp::EQ, p), cq = cols.cmp(Cmp::EQ, q);
          Ex cz = cplx ? Ex(b, b.complex(cs.v, cs.k(0).v)) : cs;
          Ex sz = cplx ? Ex(b, b.complex(sn.v, sn.k(0).v)) : sn;
          Ex j = where(rp.bin("and", cp), cz, eye);
          j = where(rq.bin("and", cq), cz * ph, j);
          j = where(rp.bin("and", cq), sz, j);
          j = where(rq.bin("and", cp), -sz * ph, j);
          Ex x2 = mm(mm(adjoint(j), x), j), v2 = mm(v, j);
          // Next pair in row-major order of the upper triangle.
          Ex q1 = q + 1.0;
          Ex wrap = q1.cmp(Cmp::EQ, q1.k(static_cast<double>(n)));
          Ex p2 = where(wrap, p + 1.0, p);
          p2 = where(p2.cmp(Cmp::EQ, p2.k(static_cast<double>(n - 1))), p2.k(0), p2);
          Ex q2 = where(wrap, p2 + 1.0, q1);
          return V{(t + 1.0).v, p2.v, q2.v, x2.v, v2.v};
        });
    a = Ex(b, out[3]);
    eye = Ex(b, out[4]);
  }
  Ex d = real_of(Ex(b, reduce_sum(b, where(rows.cmp(Cmp::EQ, cols), a, a.k(0)).v, {r - 1}, false)));
  auto sorted = b.sort_indexed(d.v, r - 2, false);
  Shape ps = s;
  ps[r - 2] = 1;
  Value perm = b.reshape(sorted.second, ps);
  Value vecs = b.take_along(eye.v,
                            b.broadcast_in_dim(perm, s,
                                               [&] {
                                                 std::vector<int64_t> dims;
                                                 for (int64_t i = 0; i < r; ++i) dims.push_back(i);
                                                 return dims;
                                               }()),
                            r - 1);
  return {Ex(b, sorted.first), Ex(b, vecs)};
}

// The symmetric (Hermitian) matrix a's `lower` (or upper) triangle describes;
// the imaginary part of the diagonal is ignored, as LAPACK does.
Ex symmetrize(const Ex& a, bool lower) {
  Builder& b = *a.b;
  const Shape& s = a.v.shape();
  Ex rows = iota_along(b, s, -2), cols = iota_along(b, s, -1);
  Ex keep = lower ? cols.cmp(Cmp::LE, rows) : cols.cmp(Cmp::GE, rows);
  Ex t = where(keep, a, a.k(0));
  Ex diag = is_complex(a.v.dtype()) ? Ex(b, b.complex(t.un("real").v, t.un("real").k(0).v)) : t;
  return where(rows.cmp(Cmp::EQ, cols), diag, t + adjoint(t));
}

// Columns of x scaled by 1/s (zero where s is 0); x [..., m, k], s [..., k].
Ex div_cols(const Ex& x, const Ex& s) {
  Builder& b = *x.b;
  Shape ss = s.v.shape();
  ss.insert(ss.end() - 1, 1);
  Ex sr(b, b.reshape(s.v, ss));
  Ex pos = sr.cmp(Cmp::GT, sr.k(0));
  Ex d = where(pos, sr, sr.k(1));
  if (is_complex(x.v.dtype())) d = Ex(b, b.complex(d.v, d.k(0).v));
  return where(pos, x / d, x.k(0));
}

// Singular values (descending) of f64 a [..., m, n] and the eigenvectors of its
// smaller Gram matrix (A^T A when m >= n, else A A^T), in the same order.
std::pair<Ex, Ex> svd_gram(const Ex& a) {
  Builder& b = *a.b;
  const Shape& s = a.v.shape();
  int64_t r = a.v.rank();
  Ex g = s[r - 2] >= s[r - 1] ? mm(adjoint(a), a) : mm(a, adjoint(a));  // [..., k, k]
  auto [w, v] = eigh_jacobi(g);
  w = Ex(b, b.reverse(w.v, {r - 2}));
  v = Ex(b, b.reverse(v.v, {r - 1}));
  return {maximum(w, w.k(0)).un("sqrt"), v};
}

TPU_LOWERING(linalg_eig) {
  // (A, UPLO, compute_v) -> (eigenvalues, eigenvectors)
  reg("_linalg_eigh", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype), tv = compute_dtype(c.out(1).dtype);
    if (c.in(0).type.numel() == 0) return {c.b.splat(0, c.out(0)), c.b.splat(0, c.out(1))};
    Ex a(c.b, c.b.convert(c.in(0), wide(c.in(0).dtype())));
    auto [w, v] = eigh_jacobi(symmetrize(a, c.arg(1).toStringRef() == "L"));
    Value vecs = c.flag(2) ? c.b.convert(v.v, tv) : c.b.splat(0, c.out(1));
    return {c.b.convert(w.v, t), vecs};
  });
  // (A, full_matrices, compute_uv, driver?) -> (U, S, Vh), singular values
  // descending; the vectors of the larger side come from A itself.
  reg("_linalg_svd", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(1).dtype), tv = compute_dtype(c.out(0).dtype);
    Ex a(b, b.convert(c.in(0), wide(c.in(0).dtype())));
    const Shape& s = a.v.shape();
    int64_t r = a.v.rank(), m = s[r - 2], n = s[r - 1];
    bool uv = c.flag(2);
    if (a.v.type.numel() == 0)
      return {b.splat(0, c.out(0)), b.splat(0, c.out(1)), b.splat(0, c.out(2))};
    if (uv && c.flag(1) && m != n)
      throw hlo::BuildError("[lower] _linalg_svd: full_matrices=True for a non-square matrix");
    bool tall = m >= n;
    auto [sv, v] = svd_gram(a);
    V out(3);
    out[1] = b.convert(sv.v, t);
    if (!uv) {
      out[0] = b.splat(0, c.out(0));
      out[2] = b.splat(0, c.out(2));
      return out;
    }
    Ex other = div_cols(tall ? mm(a, v) : mm(adjoint(a), v), sv);  // [..., m|n, k]
    Ex u = tall ? other : v, vv = tall ? v : other;
    out[0] = b.convert(u.v, tv);
    out[2] = b.convert(adjoint(vv).v, tv);
    return out;
  });
}

}  // namespace

Ex singular_values(const Ex& a) {
  Builder& b = *a.b;
  DType t = real_part_dtype(a.v.dtype());
  return Ex(b, b.convert(svd_gram(Ex(b, b.convert(a.v, wide(a.v.dtype())))).first.v, t));
}

}  // namespace torchtpu::lower
