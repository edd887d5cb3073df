// Shared float math on hlo values (polynomial fits of the error function family).
#pragma once
#include <initializer_list>

#include "lower/helpers.h"

namespace torchtpu::lower {

constexpr double kPi = 3.14159265358979323846;

Ex is_neg(const Ex& x);
Ex is_nan(const Ex& x);
Ex flip_sign(const Ex& neg, const Ex& x);
// c[0] + c[1] x + c[2] x^2 + ... (Horner).
Ex poly(const Ex& x, std::initializer_list<double> coef);
Ex erf_(const Ex& x);
Ex erfc_(const Ex& x);
Ex erfinv_(const Ex& y);
// exp(a^2) erfc(a) for a >= 1 (no overflow), and erfc(a) there.
Ex erfcx_large(const Ex& a);
Ex erfc_large(const Ex& a);

}  // namespace torchtpu::lower
