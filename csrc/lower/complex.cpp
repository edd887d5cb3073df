// Complex numbers: building them from parts (complex, polar), conjugation,
// angle and sgn. Arithmetic, reductions and matmuls take complex values in
// their own rules; view_as_real/view_as_complex are views that read_view
// serves through hlo's reinterpret_flat, and a lazy conj() bit is resolved
// before a rule runs (aten/dispatch.cpp), so rules only see plain values.
#include <vector>

#include "lower/helpers.h"
#include "lower/math.h"

namespace torchtpu::lower {

Ex conj(const Ex& z) {
  if (!is_complex(z.v.dtype())) return z;
  return Ex(*z.b, z.b->complex(z.un("real"), -z.un("imag")));
}

namespace {

using hlo::Cmp;
using V = std::vector<Value>;

// A complex value of `shape` from real parts re and im (broadcast).
Value make(Builder& b, const Ex& re, const Ex& im, const Shape& shape) {
  return b.complex(broadcast_to(b, re, shape), broadcast_to(b, im, shape));
}

TPU_LOWERING(complex_numbers) {
  reg("complex", [](Ctx& c) -> V {
    DType part = real_part_dtype(c.out(0).dtype);
    return {make(c.b, in_as(c, 0, part), in_as(c, 1, part), c.out(0).shape)};
  });
  // (abs, angle) -> abs * (cos angle + i sin angle)
  reg("polar", [](Ctx& c) -> V {
    DType part = real_part_dtype(c.out(0).dtype);
    Ex r = in_as(c, 0, part), t = in_as(c, 1, part);
    return {make(c.b, r * t.un("cosine"), r * t.un("sine"), c.out(0).shape)};
  });
  for (const char* n : {"conj_physical", "_conj_physical"})
    reg(n, [](Ctx& c) -> V { return {conj(Ex(c.b, c.in(0)))}; });
  reg("angle", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    if (is_complex(x.v.dtype())) return {x.un("imag").bin("atan2", x.un("real"))};
    // Real input: pi for negatives, 0 otherwise, NaN stays NaN.
    x = x.to(math_dtype(c));
    return {where(is_nan(x), x, where(is_neg(x), x.k(kPi), x.k(0)))};
  });
  // sgn(z) = z / |z| (0 at 0); real inputs are sign's.
  reg("sgn", [](Ctx& c) -> V {
    Ex z(c.b, c.in(0));
    if (!is_complex(z.v.dtype())) return (*find_rule("sign"))(c);
    Ex a = z.un("abs"), zero = a.cmp(Cmp::EQ, a.k(0));
    Ex d = where(zero, a.k(1), a).to(z.v.dtype());
    return {where(zero, z.k(0), z / d)};
  });
}

}  // namespace
}  // namespace torchtpu::lower
