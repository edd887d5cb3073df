// Shared float math on hlo values: erf/erfc/erfinv fits.
#include "lower/math.h"

#include <cmath>

namespace torchtpu::lower {

using hlo::Cmp;

Ex is_neg(const Ex& x) { return x.cmp(Cmp::LT, x.k(0)); }
Ex is_nan(const Ex& x) { return x.cmp(Cmp::NE, x); }
Ex flip_sign(const Ex& neg, const Ex& x) { return where(neg, -x, x); }

Ex poly(const Ex& x, std::initializer_list<double> coef) {
  std::vector<double> c(coef);
  Ex r = x.k(c.back());
  for (int i = static_cast<int>(c.size()) - 2; i >= 0; --i) r = r * x + c[i];
  return r;
}

// erf/erfc from least-squares fits against libm (relative error ~1e-6 in
// f32): erf(x) = x P(x^2) for |x| < 1, erfc(x) = exp(-x^2)/x R(1/x^2) above.
Ex erf_small(const Ex& x) {
  return x * poly(x * x, {1.1283791670801042, -0.3761263855282716, 0.11283783443881532,
                          -0.026865475514885356, 0.00522113869616736, -0.0008485438917970461,
                          0.00011274737946818936, -9.689741108473426e-06});
}
Ex erfcx_large(const Ex& a) {  // a >= 1
  Ex u = 1.0 / (a * a);
  Ex r1 = poly(u, {0.5640759628387074, -0.2787110444012824, 0.3768328686305044, -0.6565427223419706,
                   1.0709434104430156, -1.3897590417320957, 1.306483908870151, -0.8199523484943321,
                   0.3046450158304683, -0.05043245233409011});
  Ex r2 =
      poly(u, {0.5641895539453298, -0.28208886136981404, 0.42268310634782785, -1.0394957456893335,
               3.2706803732991894, -10.153916705478675, 23.18998278616685, -26.136941217692666});
  return where(a.cmp(Cmp::LT, a.k(2.5)), r1, r2) / a;
}
Ex erfc_large(const Ex& a) { return (-(a * a)).un("exponential") * erfcx_large(a); }
Ex erf_(const Ex& x) {
  Ex a = x.un("abs");
  Ex big = flip_sign(is_neg(x), 1.0 - erfc_large(a));
  return where(a.cmp(Cmp::LT, a.k(1)), erf_small(x), big);
}
Ex erfc_(const Ex& x) {
  Ex a = x.un("abs"), e = erfc_large(a);
  Ex big = where(is_neg(x), 2.0 - e, e);
  return where(a.cmp(Cmp::LT, a.k(1)), 1.0 - erf_small(x), big);
}
// Winitzki's closed form, refined by two Halley steps on erf(x) = |y|.
Ex erfinv_(const Ex& y) {
  Ex a = y.un("abs");
  Ex w = -((1.0 - a) * (1.0 + a)).un("log");
  constexpr double ka = 0.147;
  Ex t = 2.0 / (kPi * ka) - w * 0.5;
  Ex x = ((t * t + w / ka).un("sqrt") - t).un("sqrt");
  Ex hi = a.cmp(Cmp::GT, a.k(0.5));
  for (int i = 0; i < 2; ++i) {
    Ex f = where(hi, (1.0 - a) - erfc_(x), erf_(x) - a);
    Ex fp = (-(x * x)).un("exponential") * (2.0 / std::sqrt(kPi));
    x = x - f / (fp + x * f);
  }
  x = where(a.cmp(Cmp::EQ, a.k(1)), a.k(INFINITY), x);
  return flip_sign(is_neg(y), x);
}

}  // namespace torchtpu::lower
