// Special functions: the gamma family (CHLO ops the plugin legalizes), Bessel
// functions (series, asymptotic expansions and quadrature, evaluated in f64),
// orthogonal polynomials (their recurrences in a while loop) and small
// elementwise relatives of exp/log/erf.
#include <climits>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/math.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;
using Fn = std::function<Ex(Ex)>;

constexpr double kEulerGamma = 0.57721566490153286061;
constexpr double kLn2 = 0.69314718055994530942;

Ex b_and(const Ex& x, const Ex& y) { return x.bin("and", y); }
Ex b_or(const Ex& x, const Ex& y) { return x.bin("or", y); }
Ex eq(const Ex& x, double v) { return x.cmp(Cmp::EQ, x.k(v)); }
Ex lt(const Ex& x, double v) { return x.cmp(Cmp::LT, x.k(v)); }
Ex gt(const Ex& x, double v) { return x.cmp(Cmp::GT, x.k(v)); }

// f evaluated in f64 on x, result back in x's dtype.
Ex in_f64(const Ex& x, const Fn& f) { return f(x.to(DType::F64)).to(x.v.dtype()); }

void unary(const char* name, Fn f, std::source_location loc = std::source_location::current()) {
  reg_at(loc, name, [f](Ctx& c) -> V { return {f(arg_as(c, 0, math_dtype(c)))}; });
}
// Tensor/Scalar overloads of a two-input function (args 0 and 1).
void binary(const std::string& name, std::initializer_list<const char*> overloads,
            std::function<Ex(Ex, Ex)> f,
            std::source_location loc = std::source_location::current()) {
  for (const char* ov : overloads) {
    reg_at(loc, name + (*ov ? "." : "") + ov, [f](Ctx& c) -> V {
      DType t = math_dtype(c);
      Ex x = arg_as(c, 0, t), y = arg_as(c, 1, t);
      return {f(Ex(c.b, broadcast_to(c.b, x, c.out(0).shape)),
                Ex(c.b, broadcast_to(c.b, y, c.out(0).shape)))};
    });
  }
}

// ---- gamma family

Ex digamma_(const Ex& x) {
  // torch: digamma(+-0) = -+inf (the pole's sign follows the zero's).
  Ex d(*x.b, x.b->chlo("digamma", {x.v}, x.v.type));
  Ex neg_zero = is_neg(1.0 / x);
  return where(eq(x, 0), where(neg_zero, x.k(INFINITY), x.k(-INFINITY)), d);
}

// Trigamma as torch's CPU kernel computes it (reflection below 0.5, six
// recurrence steps, then the asymptotic series), so rounding matches near poles.
Ex trigamma_(Ex x) {
  Ex refl = lt(x, 0.5);
  Ex sn = (x * kPi).un("sine");
  Ex r = where(refl, -(kPi * kPi) / (sn * sn), x.k(0));
  x = where(refl, 1.0 - x, x);
  for (int i = 0; i < 6; ++i) {
    r = r + 1.0 / (x * x);
    x = x + 1.0;
  }
  Ex ixx = 1.0 / (x * x);
  r = r + (1.0 + 1.0 / (2.0 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x;
  return where(refl, -r, r);
}

// Hurwitz zeta(s, q). chlo.zeta loses accuracy for q below about -8, so for
// integer s (where the value is defined) q is first shifted above 1 with
// zeta(s, q) = zeta(s, q + 1) + q^-s, in a while loop.
Ex zeta_(const Ex& s, const Ex& q) {
  Builder& b = *q.b;
  Ex shift = b_and(s.un("floor").cmp(Cmp::EQ, s), b_and(lt(q, 1), gt(q, -65536)));
  std::vector<Value> out = b.while_loop(
      {q.v, q.k(0).v},
      [&](const std::vector<Value>& st) {
        Ex qq(b, st[0]);
        Ex need = b_and(shift, lt(qq, 1));
        return b.reduce(need.v, b.constant(0, DType::Bool), reduce_dims({}, need.v.rank()),
                        Reducer::Or);
      },
      [&](const std::vector<Value>& st) {
        Ex qq(b, st[0]), acc(b, st[1]);
        Ex need = b_and(shift, lt(qq, 1));
        Ex term = qq.bin("power", -s);
        return std::vector<Value>{where(need, qq + 1.0, qq).v, where(need, acc + term, acc).v};
      });
  Ex qq(b, out[0]), acc(b, out[1]);
  return acc + Ex(b, b.chlo("zeta", {s.v, qq.v}, q.v.type));
}

// ---- incomplete gamma

// Regularized (P, Q)(a, x) for a > 0, x > 0 in f64: the power series of P
// below x = a + 1, the continued fraction of Q (modified Lentz) above, both
// 300 steps in one while loop.
std::pair<Ex, Ex> incomplete_gamma(const Ex& a, const Ex& x) {
  Builder& b = *a.b;
  const double tiny = 1e-300;
  Ex bcf = x + 1.0 - a;
  Ex d0 = 1.0 / where(bcf.un("abs").cmp(Cmp::LT, bcf.k(tiny)), bcf.k(tiny), bcf);
  Ex inv_a = 1.0 / a;
  std::vector<Value> init = {b.constant(1, DType::F64), inv_a.v, inv_a.v, bcf.v,
                             a.k(1.0 / tiny).v,         d0.v,    d0.v};
  std::vector<Value> out = b.while_loop(
      init, [&](const V& st) { return lt(Ex(b, st[0]), 300).v; },
      [&](const V& st) {
        Ex i(b, st[0]), sum(b, st[1]), term(b, st[2]), bb(b, st[3]), c(b, st[4]), d(b, st[5]),
            h(b, st[6]);
        term = term * x / (a + i);
        sum = sum + term;
        Ex an = -i * (i - a);
        bb = bb + 2.0;
        d = an * d + bb;
        d = where(lt(d.un("abs"), tiny), d.k(tiny), d);
        c = bb + an / c;
        c = where(lt(c.un("abs"), tiny), c.k(tiny), c);
        d = 1.0 / d;
        h = h * d * c;
        return V{(i + 1.0).v, sum.v, term.v, bb.v, c.v, d.v, h.v};
      });
  Ex lg(b, b.chlo("lgamma", {a.v}, a.v.type));
  Ex pre = (a * x.un("log") - x - lg).un("exponential");
  Ex p_series = Ex(b, out[1]) * pre, q_cf = Ex(b, out[6]) * pre;
  Ex use_cf = x.cmp(Cmp::GE, a + 1.0);
  return {where(use_cf, 1.0 - q_cf, p_series), where(use_cf, q_cf, 1.0 - p_series)};
}
// torch's special cases around the core: NaN for negative arguments, the
// limits at a = 0, x = 0 and infinities.
Ex igamma_(Ex a, Ex x, bool upper) {
  Ex safe_a = where(gt(a, 0), a, a.k(1)), safe_x = where(gt(x, 0), x, x.k(1));
  safe_a = where(eq(safe_a, INFINITY), safe_a.k(1), safe_a);
  safe_x = where(eq(safe_x, INFINITY), safe_x.k(1), safe_x);
  auto [p, q] = incomplete_gamma(safe_a, safe_x);
  Ex r = upper ? q : p;
  double lo = upper ? 1 : 0, hi = upper ? 0 : 1;
  r = where(eq(x, INFINITY), r.k(hi), r);
  r = where(eq(a, INFINITY), where(eq(x, INFINITY), r.k(NAN), r.k(lo)), r);
  r = where(eq(x, 0), r.k(lo), r);
  r = where(eq(a, 0), where(gt(x, 0), r.k(hi), r.k(NAN)), r);
  return where(b_or(lt(x, 0), lt(a, 0)), r.k(NAN), r);
}

// ---- Bessel functions (a >= 0, f64)

// Coefficients a_k(nu) = prod_{j<=k} (4 nu^2 - (2j-1)^2) / (k! 8^k) of the
// large-argument expansions.
std::vector<double> asym_coef(double nu, int n) {
  std::vector<double> c = {1.0};
  for (int k = 1; k < n; ++k)
    c.push_back(c.back() * (4 * nu * nu - (2 * k - 1) * (2 * k - 1)) / (8.0 * k));
  return c;
}
// sum_k s^k (a/2)^(2k+nu) / (k! (k+nu)!), s = -1 for J_nu, +1 for I_nu (nu 0 or 1).
Ex power_series(const Ex& a, int nu, double s, int terms = 45) {
  Ex q = a * a * (0.25 * s);
  Ex t = nu == 1 ? a * 0.5 : a.k(1), sum = t;
  for (int k = 1; k <= terms; ++k) {
    t = t * q / (static_cast<double>(k) * (k + nu));
    sum = sum + t;
  }
  return sum;
}
// Hankel's expansion: (J_nu, Y_nu)(a) for large a.
std::pair<Ex, Ex> hankel(const Ex& a, double nu) {
  std::vector<double> c = asym_coef(nu, 24);
  Ex u = 1.0 / a, u2 = u * u;
  Ex p = a.k(0), q = a.k(0);
  for (int k = 11; k >= 0; --k) {
    double sign = k % 2 ? -1.0 : 1.0;
    p = p * u2 + sign * c[2 * k];
    q = q * u2 + sign * c[2 * k + 1];
  }
  q = q * u;
  Ex chi = a - (nu / 2 + 0.25) * kPi;
  Ex f = (2.0 / kPi / a).un("sqrt"), cs = chi.un("cosine"), sn = chi.un("sine");
  return {f * (p * cs - q * sn), f * (p * sn + q * cs)};
}
Ex bessel_j(const Ex& a, int nu) {
  return where(a.cmp(Cmp::LE, a.k(12)), power_series(a, nu, -1), hankel(a, nu).first);
}
// Y_0, Y_1 for a > 0: the log series below 12, Hankel's expansion above.
Ex bessel_y(const Ex& a, int nu) {
  Ex q = a * a * -0.25, lg = (a * 0.5).un("log");
  Ex small = a.k(0);
  if (nu == 0) {
    Ex t = a.k(1), s = a.k(0);
    double h = 0;
    for (int k = 1; k <= 45; ++k) {
      h += 1.0 / k;
      t = t * q / (static_cast<double>(k) * k);
      s = s - t * h;
    }
    small = (2.0 / kPi) * ((lg + kEulerGamma) * power_series(a, 0, -1) + s);
  } else {
    Ex t = a * 0.5, s = t * (1.0 - 2 * kEulerGamma);
    double hk = 0, hk1 = 1;
    for (int k = 1; k <= 45; ++k) {
      hk += 1.0 / k;
      hk1 += 1.0 / (k + 1);
      t = t * q / (static_cast<double>(k) * (k + 1));
      s = s + t * (hk + hk1 - 2 * kEulerGamma);
    }
    small = (2.0 / kPi) * power_series(a, 1, -1) * lg - (2.0 / kPi) / a - s / kPi;
  }
  return where(a.cmp(Cmp::LE, a.k(12)), small, hankel(a, nu).second);
}
// exp(-a) I_nu(a): the power series below 15, the asymptotic series above.
Ex bessel_i_scaled(const Ex& a, int nu) {
  std::vector<double> c = asym_coef(nu, 14);
  Ex u = 1.0 / a, s = a.k(0);
  for (int k = 13; k >= 0; --k) s = s * u + (k % 2 ? -c[k] : c[k]);
  Ex large = s / (2 * kPi * a).un("sqrt");
  Ex small = power_series(a, nu, 1, 50) * (-a).un("exponential");
  return where(a.cmp(Cmp::LE, a.k(15)), small, large);
}
// exp(a) K_nu(a), a > 0: trapezoid rule on the integral of
// exp(-a (cosh t - 1)) cosh(nu t) over t >= 0 (exponentially accurate for an
// analytic, fast-decaying integrand) up to 20, the asymptotic series above.
Ex bessel_k_scaled(const Ex& a, double nu) {
  const double h = 0.125;
  Ex s = a.k(0.5);
  for (int j = 1; j <= 160; ++j) {
    double t = j * h;
    s = s + (a * -(std::cosh(t) - 1.0)).un("exponential") * std::cosh(nu * t);
  }
  std::vector<double> c = asym_coef(nu, 15);
  Ex u = 1.0 / a, p = a.k(0);
  for (int k = 14; k >= 0; --k) p = p * u + c[k];
  Ex large = p * (kPi / 2 / a).un("sqrt");
  return where(a.cmp(Cmp::LE, a.k(20)), s * h, large);
}

Ex i0e_(const Ex& x) { return bessel_i_scaled(x.un("abs"), 0); }
Ex i0_(const Ex& x) { return i0e_(x) * x.un("abs").un("exponential"); }
Ex i1e_(const Ex& x) { return flip_sign(is_neg(x), bessel_i_scaled(x.un("abs"), 1)); }
Ex i1_(const Ex& x) { return i1e_(x) * x.un("abs").un("exponential"); }
// K for x > 0; K(0) = inf, K(x < 0) = NaN as torch.
Ex k_scaled(const Ex& x, double nu) {
  Ex r = bessel_k_scaled(maximum(x, x.k(1e-300)), nu);
  r = where(eq(x, 0), x.k(INFINITY), r);
  return where(lt(x, 0), x.k(NAN), r);
}
Ex y_(const Ex& x, int nu) {
  Ex r = bessel_y(maximum(x, x.k(1e-300)), nu);
  r = where(eq(x, 0), x.k(-INFINITY), r);
  return where(lt(x, 0), x.k(NAN), r);
}

// Airy Ai (f64): Maclaurin series on [-10, 7], the asymptotic expansions
// beyond (exponentially small on the right, oscillating on the left).
Ex airy_ai_(const Ex& x) {
  const double c1 = 0.355028053887817239, c2 = 0.258819403792806798;
  Ex x3 = x * x * x;
  Ex tf = x.k(1), tg = x, f = tf, g = tg;
  for (int k = 1; k <= 40; ++k) {
    tf = tf * x3 / (3.0 * k * (3.0 * k - 1));
    tg = tg * x3 / ((3.0 * k + 1) * (3.0 * k));
    f = f + tf;
    g = g + tg;
  }
  Ex series = c1 * f - c2 * g;
  std::vector<double> u = {1.0};
  for (int k = 1; k < 16; ++k)
    u.push_back(u.back() * (6.0 * k - 5) * (6.0 * k - 3) * (6.0 * k - 1) /
                ((2.0 * k - 1) * 216 * k));
  Ex a = x.un("abs");
  Ex zeta = a * a.un("sqrt") * (2.0 / 3.0);
  Ex iz = 1.0 / zeta;
  Ex sr = x.k(0), p = x.k(0), q = x.k(0);
  for (int k = 15; k >= 0; --k) sr = sr * -iz + u[k];
  for (int k = 7; k >= 0; --k) {
    double sign = k % 2 ? -1.0 : 1.0;
    p = p * iz * iz + sign * u[2 * k];
    q = q * iz * iz + sign * u[2 * k + 1];
  }
  q = q * iz;
  Ex quarter = a.un("sqrt").un("sqrt");
  Ex right = (-zeta).un("exponential") * sr / (2.0 * std::sqrt(kPi) * quarter);
  Ex ph = zeta + kPi / 4;
  Ex left = (ph.un("sine") * p - ph.un("cosine") * q) / (std::sqrt(kPi) * quarter);
  Ex r = where(gt(x, 7), right, where(lt(x, -10), left, series));
  return where(eq(x, INFINITY), x.k(0), where(eq(x, -INFINITY), x.k(0), r));
}

// ---- orthogonal polynomials p_n(x), n truncated to an integer as torch.

// Runs p_{j+1} = step(j, p_{j-1}, p_j) for j = 1 .. n-1 from p_0 = 1 and p1,
// per element, in one while loop up to the largest n that `active` needs.
Ex recurrence(const Ex& n, const Ex& active, const Ex& p1,
              const std::function<Ex(const Ex&, const Ex&, const Ex&)>& step) {
  Builder& b = *n.b;
  DType t = p1.v.dtype();
  Ex nl = where(active, n, n.k(0));
  Ex nmax(b, b.reduce(nl.v, b.constant(0, t), reduce_dims({}, nl.v.rank()), Reducer::Max));
  nmax = minimum(nmax, nmax.k(1 << 20));  // torch loops until NaN; we stop eventually
  Value j0 = b.constant(1, t);
  Value p0 = p1.k(1);
  std::vector<Value> out = b.while_loop(
      {j0, p0, p1.v}, [&](const std::vector<Value>& s) { return Ex(b, s[0]).cmp(Cmp::LT, nmax).v; },
      [&](const std::vector<Value>& s) {
        Ex j(b, s[0]), p(b, s[1]), q(b, s[2]);
        Ex r = step(j, p, q);
        Ex on = j.cmp(Cmp::LT, n);
        return std::vector<Value>{(j + 1.0).v, where(on, q, p).v, where(on, r, q).v};
      });
  return where(eq(n, 0), p1.k(1), Ex(b, out[2]));
}
Ex is_odd(const Ex& n) { return (n * 0.5).un("floor").cmp(Cmp::NE, n * 0.5); }
Ex odd_sign(const Ex& n, const Ex& v) { return where(is_odd(n), -v, v); }

enum class Cheb { T, U, V, W };
// Chebyshev polynomials of y (y = x, or 2x - 1 for the shifted ones); trig
// closed forms for |y| < 1 above `trig_from`, as torch does.
Ex chebyshev(Ex y, Ex n, Cheb kind, int trig_from) {
  Ex two_y = y + y;
  Ex p1 = kind == Cheb::T   ? y
          : kind == Cheb::U ? two_y
          : kind == Cheb::V ? two_y - 1.0
                            : two_y + 1.0;
  Ex inside = lt(y.un("abs"), 1);
  Ex trig = b_and(inside, gt(n, trig_from));
  Ex r = recurrence(n, trig.un("not"), p1,
                    [&](const Ex&, const Ex& p, const Ex& q) { return two_y * q - p; });
  Ex th = ((1.0 - y) * (1.0 + y)).un("sqrt").bin("atan2", y);  // acos(y)
  Ex tv = kind == Cheb::T   ? (n * th).un("cosine")
          : kind == Cheb::U ? ((n + 1.0) * th).un("sine") / th.un("sine")
          : kind == Cheb::V ? ((n + 0.5) * th).un("cosine") / (th * 0.5).un("cosine")
                            : ((n + 0.5) * th).un("sine") / (th * 0.5).un("sine");
  r = where(trig, tv, r);
  Ex n21 = n * 2.0 + 1.0, n1 = n + 1.0, one = y.k(1);
  Ex at_p1 = kind == Cheb::U ? n1 : kind == Cheb::W ? n21 : one;
  Ex at_m1 = kind == Cheb::U   ? odd_sign(n, n1)
             : kind == Cheb::V ? odd_sign(n, n21)
                               : odd_sign(n, one);
  r = where(eq(y, 1), at_p1, where(eq(y, -1), at_m1, r));
  return where(lt(n, 0), y.k(0), r);
}

void polynomial(const std::string& name, std::function<Ex(Ex, Ex)> f) {
  binary(name, {"", "x_scalar", "n_scalar"}, [f](Ex x, Ex n) {
    Ex nt = where(is_neg(n), n.un("ceil"), n.un("floor"));
    return f(x, nt);
  });
}

TPU_LOWERING(special_gamma) {
  unary("lgamma", [](Ex x) { return Ex(*x.b, x.b->chlo("lgamma", {x.v}, x.v.type)); });
  unary("digamma", digamma_);
  reg("polygamma", [](Ctx& c) -> V {
    Ex x = arg_as(c, 1, math_dtype(c));
    int64_t n = c.i64(0);
    if (n == 0) return {digamma_(x)};
    if (n == 1) return {trigamma_(x)};
    // (-1)^(n+1) n! zeta(n+1, x) (chlo.polygamma goes wrong for x below about -8).
    double f = std::tgamma(static_cast<double>(n) + 1) * (n % 2 ? 1 : -1);
    return {zeta_(x.k(static_cast<double>(n + 1)), x) * f};
  });
  // x < 1 is NaN whatever q (the CPU tests it first; chlo.zeta gives inf for
  // an integer q <= 0, e.g. zeta(0, 0) from bool inputs).
  binary("special_zeta", {"", "self_scalar", "other_scalar"}, [](Ex x, Ex q) {
    Ex z(*x.b, x.b->chlo("zeta", {x.v, q.v}, x.v.type));
    return where(x.cmp(Cmp::LT, x.k(1)), x.k(NAN), z);
  });
  // A NaN operand gives NaN, as on the CPU (the series would return a number).
  for (bool upper : {false, true}) {
    binary(upper ? "igammac" : "igamma", {""}, [upper](Ex a, Ex x) {
      Ex r = igamma_(a.to(DType::F64), x.to(DType::F64), upper).to(a.v.dtype());
      r = where(a.cmp(Cmp::NE, a), a, r);
      return where(x.cmp(Cmp::NE, x), x, r);
    });
  }
  binary("nextafter", {""}, [](Ex x, Ex y) {
    return Ex(*x.b, x.b->chlo("next_after", {x.v, y.v}, x.v.type));
  });
}

TPU_LOWERING(special_bessel) {
  auto f64 = [](Fn f) { return [f](Ex x) { return in_f64(x, f); }; };
  unary("i0", f64(i0_));
  unary("special_i0e", f64(i0e_));
  unary("special_i1", f64(i1_));
  unary("special_i1e", f64(i1e_));
  unary("special_modified_bessel_i0", f64(i0_));
  unary("special_modified_bessel_i1", f64(i1_));
  unary("special_modified_bessel_k0",
        f64([](Ex x) { return k_scaled(x, 0) * (-x).un("exponential"); }));
  unary("special_modified_bessel_k1",
        f64([](Ex x) { return k_scaled(x, 1) * (-x).un("exponential"); }));
  unary("special_scaled_modified_bessel_k0", f64([](Ex x) { return k_scaled(x, 0); }));
  unary("special_scaled_modified_bessel_k1", f64([](Ex x) { return k_scaled(x, 1); }));
  unary("special_bessel_j0", f64([](Ex x) { return bessel_j(x.un("abs"), 0); }));
  unary("special_bessel_j1",
        f64([](Ex x) { return flip_sign(is_neg(x), bessel_j(x.un("abs"), 1)); }));
  unary("special_bessel_y0", f64([](Ex x) { return y_(x, 0); }));
  unary("special_bessel_y1", f64([](Ex x) { return y_(x, 1); }));
  unary("special_airy_ai", f64(airy_ai_));
  unary("special_spherical_bessel_j0", [](Ex x) {
    Ex r = x.un("sine") / x;
    r = where(eq(x, 0), x.k(1), r);
    return where(eq(x.un("abs"), INFINITY), x.k(0), r);
  });
}

TPU_LOWERING(special_polynomials) {
  const std::pair<const char*, Cheb> kinds[] = {
      {"t", Cheb::T}, {"u", Cheb::U}, {"v", Cheb::V}, {"w", Cheb::W}};
  for (auto [suffix, kind] : kinds) {
    Cheb k = kind;
    polynomial(std::string("special_chebyshev_polynomial_") + suffix,
               [k](Ex x, Ex n) { return chebyshev(x, n, k, k == Cheb::T ? 6 : 8); });
    int shifted_from = k == Cheb::W ? 4 : 6;
    polynomial(
        std::string("special_shifted_chebyshev_polynomial_") + suffix,
        [k, shifted_from](Ex x, Ex n) { return chebyshev(x + x - 1.0, n, k, shifted_from); });
  }
  polynomial("special_hermite_polynomial_h", [](Ex x, Ex n) {
    Ex r = recurrence(
        n, n.k(1).cmp(Cmp::EQ, n.k(1)), x + x,
        [&](const Ex& j, const Ex& p, const Ex& q) { return (x + x) * q - (j + j) * p; });
    r = where(gt(n, x.v.dtype() == DType::F64 ? 512 : 128), x.k(NAN), r);
    return where(lt(n, 0), x.k(0), r);
  });
  polynomial("special_hermite_polynomial_he", [](Ex x, Ex n) {
    Ex r = recurrence(n, n.k(1).cmp(Cmp::EQ, n.k(1)), x,
                      [&](const Ex& j, const Ex& p, const Ex& q) { return x * q - j * p; });
    r = where(gt(n, x.v.dtype() == DType::F64 ? 512 : 128), x.k(NAN), r);
    return where(lt(n, 0), x.k(0), r);
  });
  polynomial("special_laguerre_polynomial_l", [](Ex x, Ex n) {
    Ex r =
        recurrence(n, x.cmp(Cmp::NE, x.k(0)), 1.0 - x, [&](const Ex& j, const Ex& p, const Ex& q) {
          return ((j + j + (1.0 - x)) * q - j * p) / (j + 1.0);
        });
    r = where(eq(x, 0), x.k(1), r);
    return where(lt(n, 0), x.k(0), r);
  });
  polynomial("special_legendre_polynomial_p", [](Ex x, Ex n) {
    Ex r = recurrence(n, x.un("abs").cmp(Cmp::NE, x.k(1)), x,
                      [&](const Ex& j, const Ex& p, const Ex& q) {
                        return ((j + j + 1.0) * x * q - j * p) / (j + 1.0);
                      });
    r = where(eq(x, 1), x.k(1), where(eq(x, -1), odd_sign(n, x.k(1)), r));
    return where(lt(n, 0), x.k(0), r);
  });
}

TPU_LOWERING(special_misc) {
  reg("signbit", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    DType t = x.v.dtype();
    if (t == DType::Bool || is_unsigned(t)) return {c.b.splat(0, c.out(0))};
    if (!is_float(t)) return {is_neg(x)};
    if (t != DType::F64) x = x.to(DType::F32);
    DType it = x.v.dtype() == DType::F64 ? DType::I64 : DType::I32;
    return {is_neg(Ex(c.b, c.b.bitcast_convert(x, it)))};
  });
  unary("sinc", [](Ex x) {
    Ex px = x * kPi;
    return where(eq(x, 0), x.k(1), px.un("sine") / px);
  });
  binary("logaddexp2", {""}, [](Ex x, Ex y) {
    Ex m = maximum(x, y);
    Ex r = m + (x.k(2).bin("power", -(x - y).un("abs"))).un("log_plus_one") * (1.0 / kLn2);
    return where(x.cmp(Cmp::EQ, y), x + 1.0, r);
  });
  binary("heaviside", {""}, [](Ex x, Ex v) {
    DType t = x.v.dtype();
    Ex pos = x.k(0).cmp(Cmp::LT, x).to(t);
    return where(eq(x, 0), v, pos);
  });
  unary("special_entr", [](Ex x) {
    Ex r = -x * x.un("log");
    r = where(eq(x, 0), x.k(0), r);
    return where(is_neg(x), x.k(-INFINITY), r);
  });
  binary("special_xlog1py", {"", "self_scalar", "other_scalar"}, [](Ex x, Ex y) {
    Ex r = x * y.un("log_plus_one");
    return where(b_and(eq(x, 0), y.cmp(Cmp::EQ, y)), x.k(0), r);
  });
  unary("special_erfcx", [](Ex x) {
    Ex a = x.un("abs");
    Ex small = (x * x).un("exponential") * erfc_(x);
    Ex pos = erfcx_large(a);
    Ex neg = 2.0 * (x * x).un("exponential") - pos;
    return where(lt(a, 1), small, where(is_neg(x), neg, pos));
  });
  unary("special_log_ndtr", [](Ex x) {
    // Phi(x) = erfc(-x / sqrt2) / 2, kept accurate at both tails.
    Ex t = x * -M_SQRT1_2;
    Ex mid = (erfc_(t) * 0.5).un("log");
    Ex right = (erfc_(-t) * -0.5).un("log_plus_one");
    Ex left = -(t * t) + erfcx_large(maximum(t, t.k(1))).un("log") - kLn2;
    return where(gt(x, 0), right, where(gt(t, 1), left, mid));
  });
  unary("special_ndtri", [](Ex p) {
    Ex z = erfinv_(p * 2.0 - 1.0) * M_SQRT2;
    // One Newton step on Phi(z) = p.
    Ex phi = erfc_(z * -M_SQRT1_2) * 0.5;
    Ex dens = (z * z * -0.5).un("exponential") * (1.0 / std::sqrt(2 * kPi));
    Ex zn = z - (phi - p) / dens;
    Ex finite = b_and(gt(p, 0), lt(p, 1));
    return where(finite, zn, z);
  });
  // Exact bit manipulation (the plugin flushes subnormal floats, so no float
  // scaling): x = m * 2^e with |m| in [0.5, 1).
  reg("frexp.Tensor", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    DType t = x.v.dtype();
    bool wide = t == DType::F64;
    DType w = wide ? DType::F64 : DType::F32, it = wide ? DType::I64 : DType::I32;
    int mbits = wide ? 52 : 23, bias = wide ? 1022 : 126, width = wide ? 64 : 32;
    auto k = [&](int64_t v) { return Ex(c.b, c.b.constant_int(v, it)); };
    Ex bits(c.b, c.b.bitcast_convert(x.to(w), it));
    Ex frac_mask = k((int64_t{1} << mbits) - 1);
    Ex sign = bits.bin("and", k(wide ? INT64_MIN : int64_t{INT32_MIN}));
    Ex e = bits.bin("shift_right_logical", k(mbits)).bin("and", k(wide ? 0x7ff : 0xff));
    Ex frac = bits.bin("and", frac_mask);
    // Subnormal: normalize the fraction by its leading zeros.
    Ex top = k(width - 1) - frac.un("count_leading_zeros");
    Ex frac_n = frac.bin("shift_left", k(mbits) - top).bin("and", frac_mask);
    Ex sub = e.cmp(Cmp::EQ, k(0));
    Ex ex = where(sub, top - k(mbits + bias - 1), e - k(bias));
    Ex mb = sign.bin("or", k(int64_t{bias} << mbits)).bin("or", where(sub, frac_n, frac));
    Ex m(c.b, c.b.bitcast_convert(mb, w));
    Ex xf = x.to(w);
    Ex special = b_or(eq(xf, 0), b_or(is_nan(xf), eq(xf.un("abs"), INFINITY)));
    m = where(b_or(special, b_and(sub, frac.cmp(Cmp::EQ, k(0)))), xf, m);
    ex = where(special, k(0), ex);
    return {m.to(t), ex.to(c.out(1).dtype)};
  });
}

}  // namespace
}  // namespace torchtpu::lower
