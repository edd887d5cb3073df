// Elementwise ATen ops: arithmetic, math functions (sigmoid, tanh and logit with
// their backward ops among them; activation functions are in activation.cpp),
// comparisons, isin, logical/bitwise ops, fills.
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

constexpr double kLn2 = 0.69314718055994530942;
constexpr double kLn10 = 2.30258509299404568402;

Operand arg_operand(Ctx& c, int i) {
  return c.arg(i).isTensor() ? operand(c.in(i)) : scalar_operand(c.arg(i));
}
// add/sub's alpha (arg 2); torch rounds it to the output dtype first.
Ex alpha(Ctx& c, const Ex& like) {
  return Ex(c.b, c.b.convert(c.scalar(2, c.out(0).dtype), like.v.dtype()));
}

Ex b_and(const Ex& x, const Ex& y) { return x.bin("and", y); }
Ex b_or(const Ex& x, const Ex& y) { return x.bin("or", y); }
Ex b_ne(const Ex& x, const Ex& y) { return x.bin("xor", y); }
Ex as_bool(const Ex& x) { return x.v.dtype() == DType::Bool ? x : x.cmp(Cmp::NE, x.k(0)); }

Ex trunc_(const Ex& x) { return where(is_neg(x), x.un("ceil"), x.un("floor")); }

// Float math functions on a value already in the compute dtype.
const std::vector<std::pair<const char*, Fn>>& float_unary() {
  static const std::vector<std::pair<const char*, Fn>> t = {
      {"exp", [](Ex x) { return x.un("exponential"); }},
      {"expm1", [](Ex x) { return x.un("exponential_minus_one"); }},
      {"exp2", [](Ex x) { return x.k(2).bin("power", x); }},
      {"log", [](Ex x) { return x.un("log"); }},
      {"log1p", [](Ex x) { return x.un("log_plus_one"); }},
      {"log2", [](Ex x) { return x.un("log") * (1.0 / kLn2); }},
      {"log10", [](Ex x) { return x.un("log") * (1.0 / kLn10); }},
      {"sqrt", [](Ex x) { return x.un("sqrt"); }},
      {"rsqrt", [](Ex x) { return x.un("rsqrt"); }},
      {"reciprocal", [](Ex x) { return 1.0 / x; }},
      {"sin", [](Ex x) { return x.un("sine"); }},
      {"cos", [](Ex x) { return x.un("cosine"); }},
      {"tan", [](Ex x) { return x.un("tan"); }},
      {"asin", [](Ex x) { return x.bin("atan2", ((1.0 - x) * (1.0 + x)).un("sqrt")); }},
      {"acos", [](Ex x) { return ((1.0 - x) * (1.0 + x)).un("sqrt").bin("atan2", x); }},
      {"atan", [](Ex x) { return x.bin("atan2", x.k(1)); }},
      {"sinh",
       [](Ex x) {
         if (is_complex(x.v.dtype())) return (x.un("exponential") - (-x).un("exponential")) * 0.5;
         Ex a = x.un("abs"), e = (a * 0.5).un("exponential");
         Ex big = e * (e * 0.5) - 0.5 / (e * e);
         Ex small = (x.un("exponential_minus_one") - (-x).un("exponential_minus_one")) * 0.5;
         return where(a.cmp(Cmp::LT, a.k(1)), small, flip_sign(is_neg(x), big));
       }},
      {"cosh",
       [](Ex x) {
         if (is_complex(x.v.dtype())) return (x.un("exponential") + (-x).un("exponential")) * 0.5;
         Ex e = (x.un("abs") * 0.5).un("exponential");
         return e * (e * 0.5) + 0.5 / (e * e);
       }},
      {"tanh", [](Ex x) { return x.un("tanh"); }},
      {"asinh",
       [](Ex x) {
         if (is_complex(x.v.dtype())) {
           // Odd: computed where Re >= 0, so the sum does not cancel.
           Ex re = x.un("real"), neg = is_neg(re), w = where(neg, -x, x);
           Ex r = (w + (w * w + 1.0).un("sqrt")).un("log");
           return where(neg, -r, r);
         }
         Ex a = x.un("abs");
         Ex r = (a + a * a / (1.0 + (1.0 + a * a).un("sqrt"))).un("log_plus_one");
         r = where(a.cmp(Cmp::GT, a.k(std::ldexp(1.0, 30))), a.un("log") + kLn2, r);
         return flip_sign(is_neg(x), r);
       }},
      {"acosh",
       [](Ex x) {
         Ex y = x - 1.0;
         Ex r = (y + (y * (y + 2.0)).un("sqrt")).un("log_plus_one");
         return where(x.cmp(Cmp::GT, x.k(std::ldexp(1.0, 30))), x.un("log") + kLn2, r);
       }},
      {"atanh",
       [](Ex x) {
         if (is_complex(x.v.dtype())) return (x.un("log_plus_one") - (-x).un("log_plus_one")) * 0.5;
         Ex a = x.un("abs");
         return flip_sign(is_neg(x), (2.0 * a / (1.0 - a)).un("log_plus_one") * 0.5);
       }},
      {"erf", erf_},
      {"erfc", erfc_},
      {"erfinv", erfinv_},
      {"sigmoid", [](Ex x) { return x.un("logistic"); }},
      {"frac", [](Ex x) { return x - trunc_(x); }},
  };
  return t;
}

// Ops that keep integer dtypes (identity or exact integer math on ints).
const std::vector<std::pair<const char*, Fn>>& any_unary() {
  static const std::vector<std::pair<const char*, Fn>> t = {
      {"neg", [](Ex x) { return -x; }},
      {"abs",
       [](Ex x) {
         return x.v.dtype() == DType::Bool || is_unsigned(x.v.dtype()) ? x : x.un("abs");
       }},
      {"sign",
       [](Ex x) {
         if (x.v.dtype() == DType::Bool) return x;
         // torch: (0 < x) - (x < 0), so NaN maps to 0.
         Ex gt = x.k(0).cmp(Cmp::LT, x).to(x.v.dtype()), lt = is_neg(x).to(x.v.dtype());
         return gt - lt;
       }},
      {"floor", [](Ex x) { return is_float(x.v.dtype()) ? x.un("floor") : x; }},
      {"ceil", [](Ex x) { return is_float(x.v.dtype()) ? x.un("ceil") : x; }},
      {"round", [](Ex x) { return is_float(x.v.dtype()) ? x.un("round_nearest_even") : x; }},
      {"trunc", [](Ex x) { return is_float(x.v.dtype()) ? trunc_(x) : x; }},
      {"fix", [](Ex x) { return is_float(x.v.dtype()) ? trunc_(x) : x; }},
      {"bitwise_not", [](Ex x) { return x.un("not"); }},
      {"clone", [](Ex x) { return x; }},
      {"positive", [](Ex x) { return x; }},
  };
  return t;
}

// a // b with Python semantics.
Ex floor_div(const Ex& a, const Ex& b) {
  DType t = a.v.dtype();
  if (is_float(t)) {
    Ex mod = a.bin("remainder", b);
    Ex div = (a - mod) / b;
    Ex fix = b_and(mod.cmp(Cmp::NE, mod.k(0)), b_ne(is_neg(b), is_neg(mod)));
    div = where(fix, div - 1.0, div);
    Ex fl = div.un("floor");
    fl = where((div - fl).cmp(Cmp::GT, fl.k(0.5)), fl + 1.0, fl);
    Ex q = a / b;
    fl = where(div.cmp(Cmp::EQ, div.k(0)), q * 0.0, fl);
    return where(b.cmp(Cmp::EQ, b.k(0)), q, fl);
  }
  if (is_unsigned(t) || t == DType::Bool) return a / b;
  Ex q = a / b, r = a.bin("remainder", b);
  Ex fix = b_and(r.cmp(Cmp::NE, r.k(0)), b_ne(is_neg(r), is_neg(b)));
  return where(fix, q - q.k(1), q);
}
Ex py_remainder(const Ex& a, const Ex& b) {
  Ex r = a.bin("remainder", b);
  if (is_unsigned(a.v.dtype())) return r;
  Ex fix = b_and(r.cmp(Cmp::NE, r.k(0)), b_ne(is_neg(r), is_neg(b)));
  return where(fix, r + b, r);
}

// Registers `name` for each overload suffix with a two-input body; inputs at
// args 0 and 1 (Tensor or Scalar) come converted to the compute dtype.
void binary(const char* name, std::initializer_list<const char*> overloads,
            std::function<Ex(Ctx&, Ex, Ex)> f,
            std::source_location loc = std::source_location::current()) {
  for (const char* ov : overloads) {
    std::string n = std::string(name) + (*ov ? "." : "") + ov;
    reg_at(loc, n, [f](Ctx& c) -> V {
      DType t = math_dtype(c);
      return {f(c, arg_as(c, 0, t), arg_as(c, 1, t))};
    });
  }
}

void compare(const char* name, Cmp dir,
             std::source_location loc = std::source_location::current()) {
  for (const char* ov : {".Tensor", ".Scalar"}) {
    reg_at(loc, std::string(name) + ov, [dir](Ctx& c) -> V {
      DType t = result_type({arg_operand(c, 0), arg_operand(c, 1)});
      return {arg_as(c, 0, t).cmp(dir, arg_as(c, 1, t))};
    });
  }
}

TPU_LOWERING(elementwise_arith) {
  binary("add", {"Tensor", "Scalar"}, [](Ctx& c, Ex x, Ex y) { return x + y * alpha(c, x); });
  // PyTorch rejects bool operands of subtraction (its Scalar overloads' meta
  // kernels do not check, so the rule does).
  auto no_bool = [](Ctx& c) {
    for (int i : {0, 1}) {
      const c10::IValue& v = c.arg(i);
      TORCH_CHECK(!v.isBool() && !(v.isTensor() && v.toTensor().scalar_type() == c10::kBool),
                  "[tpu] ", c.op_name(),
                  ": subtraction of bool tensors is not supported; invert a mask with ~ or "
                  "logical_not()");
    }
  };
  binary("sub", {"Tensor", "Scalar"}, [no_bool](Ctx& c, Ex x, Ex y) {
    no_bool(c);
    return x - y * alpha(c, x);
  });
  binary("rsub", {"Tensor", "Scalar"}, [no_bool](Ctx& c, Ex x, Ex y) {
    no_bool(c);
    return y - x * alpha(c, x);
  });
  binary("mul", {"Tensor", "Scalar"}, [](Ctx&, Ex x, Ex y) { return x * y; });
  binary("div", {"Tensor", "Scalar"}, [](Ctx&, Ex x, Ex y) { return x / y; });
  binary("div", {"Tensor_mode", "Scalar_mode"}, [](Ctx& c, Ex x, Ex y) {
    if (c.is_none(2)) return x / y;
    std::string mode = c.arg(2).toStringRef();
    if (mode == "floor") return floor_div(x, y);
    return is_float(x.v.dtype()) ? trunc_(x / y) : x / y;
  });
  binary("floor_divide", {"", "Scalar"}, [](Ctx&, Ex x, Ex y) { return floor_div(x, y); });
  binary("remainder", {"Tensor", "Scalar", "Scalar_Tensor"},
         [](Ctx&, Ex x, Ex y) { return py_remainder(x, y); });
  binary("fmod", {"Tensor", "Scalar"}, [](Ctx&, Ex x, Ex y) { return x.bin("remainder", y); });
  binary("pow", {"Tensor_Tensor", "Scalar"}, [](Ctx&, Ex x, Ex y) { return x.bin("power", y); });
  // x ** k: k is an attribute, so common exponents become cheap ops and XLA
  // sees a constant.
  spec("pow", {.attribute_scalars = {1}});
  reg("pow.Tensor_Scalar", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, c.out(0).dtype);
    c10::Scalar k = c.arg(1).toScalar();
    double e = k.toDouble();
    if (e == 1) return {x};
    if (e == 2) return {x * x};
    if (is_float(x.v.dtype()) || is_complex(x.v.dtype())) {
      if (e == 0.5) return {x.un("sqrt")};
      if (e == -0.5) return {x.un("rsqrt")};
      if (e == -1) return {1.0 / x};
      return {x.bin("power", x.k(e))};
    }
    return {x.bin("power", Ex(c.b, c.b.constant_int(k.toLong(), x.v.dtype())))};
  });
  binary("atan2", {""}, [](Ctx&, Ex x, Ex y) { return x.bin("atan2", y); });
  binary("arctan2", {""}, [](Ctx&, Ex x, Ex y) { return x.bin("atan2", y); });
  binary("hypot", {""}, [](Ctx&, Ex x, Ex y) {
    // Scaled to avoid overflow in x*x + y*y.
    Ex ax = x.un("abs"), ay = y.un("abs");
    Ex m = maximum(ax, ay), n = minimum(ax, ay), r = n / m;
    Ex h = m * (1.0 + r * r).un("sqrt");
    h = where(m.cmp(Cmp::EQ, m.k(0)), m, h);
    return where(m.cmp(Cmp::EQ, m.k(INFINITY)), m, h);
  });
  binary("copysign", {"Tensor", "Scalar"}, [](Ctx&, Ex x, Ex y) {
    // The sign bit of y, including -0.
    Ex neg = b_or(is_neg(y), b_and(y.cmp(Cmp::EQ, y.k(0)), is_neg(1.0 / y)));
    Ex a = x.un("abs");
    return where(neg, -a, a);
  });
  binary("logaddexp", {""}, [](Ctx&, Ex x, Ex y) {
    Ex m = maximum(x, y);
    Ex r = m + (-(x - y).un("abs")).un("exponential").un("log_plus_one");
    return where(x.cmp(Cmp::EQ, y), x + kLn2, r);  // equal infinities
  });
  binary("xlogy", {"Tensor", "Scalar_Self", "Scalar_Other"}, [](Ctx&, Ex x, Ex y) {
    Ex r = x * y.un("log");
    return where(b_and(x.cmp(Cmp::EQ, x.k(0)), y.cmp(Cmp::EQ, y)), x.k(0), r);
  });
  binary("maximum", {""},
         [](Ctx&, Ex x, Ex y) { return x.v.dtype() == DType::Bool ? b_or(x, y) : maximum(x, y); });
  binary("minimum", {""},
         [](Ctx&, Ex x, Ex y) { return x.v.dtype() == DType::Bool ? b_and(x, y) : minimum(x, y); });
  binary("max", {"other"},
         [](Ctx&, Ex x, Ex y) { return x.v.dtype() == DType::Bool ? b_or(x, y) : maximum(x, y); });
  binary("min", {"other"},
         [](Ctx&, Ex x, Ex y) { return x.v.dtype() == DType::Bool ? b_and(x, y) : minimum(x, y); });
  binary("fmax", {""},
         [](Ctx&, Ex x, Ex y) { return where(is_nan(x), y, where(is_nan(y), x, maximum(x, y))); });
  binary("fmin", {""},
         [](Ctx&, Ex x, Ex y) { return where(is_nan(x), y, where(is_nan(y), x, minimum(x, y))); });
  binary("clamp_min", {"", "Tensor"}, [](Ctx&, Ex x, Ex lo) { return maximum(x, lo); });
  binary("clamp_max", {"", "Tensor"}, [](Ctx&, Ex x, Ex hi) { return minimum(x, hi); });
  for (const char* n : {"clamp", "clamp.Tensor", "clip", "clip.Tensor"}) {
    reg(n, [](Ctx& c) -> V {
      DType t = math_dtype(c);
      Ex x = arg_as(c, 0, t);
      if (!c.is_none(1)) x = maximum(x, arg_as(c, 1, t));
      if (!c.is_none(2)) x = minimum(x, arg_as(c, 2, t));
      return {x};
    });
  }
  for (const char* n : {"lerp.Scalar", "lerp.Tensor"}) {
    reg(n, [](Ctx& c) -> V {
      DType t = math_dtype(c);
      Ex a = arg_as(c, 0, t), e = arg_as(c, 1, t), w = arg_as(c, 2, t);
      // torch's two-sided form keeps lerp exact at both ends.
      Ex d = e - a;
      Ex aw = w.un("abs");  // real for complex weights too
      return {where(aw.cmp(Cmp::LT, aw.k(0.5)), a + w * d, e - d * (1.0 - w))};
    });
  }
  reg("addcmul", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    return {arg_as(c, 0, t) + arg_as(c, 3, t) * arg_as(c, 1, t) * arg_as(c, 2, t)};
  });
  reg("addcdiv", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    return {arg_as(c, 0, t) + arg_as(c, 3, t) * arg_as(c, 1, t) / arg_as(c, 2, t)};
  });
  reg("round.decimals", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    int64_t d = c.i64(1);
    if (!is_float(x.v.dtype()) || d == 0)
      return {is_float(x.v.dtype()) ? x.un("round_nearest_even") : x};
    double p = std::pow(10.0, static_cast<double>(std::llabs(d)));
    return {d > 0 ? (x * p).un("round_nearest_even") / p : (x / p).un("round_nearest_even") * p};
  });
}

TPU_LOWERING(elementwise_unary) {
  for (const auto& [name, fn] : float_unary()) {
    Fn f = fn;
    reg(name, [f](Ctx& c) -> V { return {f(arg_as(c, 0, math_dtype(c)))}; });
  }
  for (const auto& [name, fn] : any_unary()) {
    Fn f = fn;
    // A complex input keeps its dtype: abs of a complex value is real.
    reg(name, [f](Ctx& c) -> V {
      return {f(is_complex(c.in(0).dtype()) ? Ex(c.b, c.in(0)) : arg_as(c, 0, math_dtype(c)))};
    });
  }
  // (self, eps?): log(x / (1 - x)) with x clamped to [eps, 1 - eps].
  reg("logit", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    if (!c.is_none(1)) x = minimum(maximum(x, x.k(c.f64(1))), x.k(1.0 - c.f64(1)));
    return {(x / (1.0 - x)).un("log")};
  });
  // (grad_output, self, eps?)
  reg("logit_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t);
    Ex d = g / (x * (1.0 - x));
    if (c.is_none(2)) return {d};
    double eps = c.f64(2);
    Ex out = b_or(x.cmp(Cmp::LT, x.k(eps)), x.cmp(Cmp::GT, x.k(1.0 - eps)));
    return {where(out, x.k(0), d)};
  });
}

TPU_LOWERING(elementwise_backward) {
  // (grad_output, result) -> grad_input.
  reg("tanh_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), y = arg_as(c, 1, t);
    return {g * (1.0 - y * y)};
  });
  reg("sigmoid_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), y = arg_as(c, 1, t);
    return {g * (1.0 - y) * y};
  });
}

TPU_LOWERING(elementwise_logic) {
  compare("eq", Cmp::EQ);
  compare("ne", Cmp::NE);
  compare("lt", Cmp::LT);
  compare("le", Cmp::LE);
  compare("gt", Cmp::GT);
  compare("ge", Cmp::GE);
  const std::pair<const char*, const char*> logic[] = {
      {"logical_and", "and"}, {"logical_or", "or"}, {"logical_xor", "xor"}};
  for (auto [name, op] : logic) {
    const char* o = op;
    reg(name,
        [o](Ctx& c) -> V { return {as_bool(Ex(c.b, c.in(0))).bin(o, as_bool(Ex(c.b, c.in(1))))}; });
  }
  reg("logical_not", [](Ctx& c) -> V { return {as_bool(Ex(c.b, c.in(0))).un("not")}; });
  for (auto [name, op] : {std::pair{"bitwise_and", "and"}, std::pair{"bitwise_or", "or"},
                          std::pair{"bitwise_xor", "xor"}}) {
    const char* o = op;
    binary(name, {"Tensor", "Scalar", "Scalar_Tensor"},
           [o](Ctx&, Ex x, Ex y) { return x.bin(o, y); });
  }
  // Euclid's algorithm on every element pair at once, until all remainders are 0;
  // the loop carries both operands at their broadcast shape (a 0-dim `other`).
  auto gcd = [](Ex x, Ex y) {
    Builder& b = *x.b;
    Shape shape = broadcast_shapes(x.v.shape(), y.v.shape());
    std::vector<Value> st = b.while_loop(
        {broadcast_to(b, x.un("abs").v, shape), broadcast_to(b, y.un("abs").v, shape)},
        [&](const V& s) -> Value {
          Ex nz = Ex(b, s[1]).cmp(Cmp::NE, Ex(b, s[1]).k(0));
          std::vector<int64_t> all(static_cast<size_t>(s[1].rank()));
          for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int64_t>(k);
          return b.reduce(nz.v, b.constant(0, DType::Bool), all, hlo::Reducer::Or);
        },
        [&](const V& s) -> V {
          Ex a(b, s[0]), d(b, s[1]);
          Ex nz = d.cmp(Cmp::NE, d.k(0));
          Ex r = a.bin("remainder", where(nz, d, d.k(1)));
          return {where(nz, d, a).v, where(nz, r, d.k(0)).v};
        });
    return Ex(b, st[0]);
  };
  binary("gcd", {""}, [gcd](Ctx&, Ex x, Ex y) { return gcd(x, y); });
  binary("lcm", {""}, [gcd](Ctx&, Ex x, Ex y) {
    Ex g = gcd(x, y), zero = g.cmp(Cmp::EQ, g.k(0));
    return where(zero, g.k(0), (x / where(zero, g.k(1), g) * y).un("abs"));
  });
  // Shift amounts outside [0, bits) give 0 (left) or the sign fill (right), as
  // on the CPU: StableHLO reads the amount as unsigned and saturates the same way.
  for (const char* name : {"bitwise_left_shift", "__lshift__"})
    binary(name, {"Tensor", "Scalar", "Tensor_Scalar", "Scalar_Tensor"},
           [](Ctx&, Ex x, Ex y) { return x.bin("shift_left", y); });
  for (const char* name : {"bitwise_right_shift", "__rshift__"})
    binary(name, {"Tensor", "Scalar", "Tensor_Scalar", "Scalar_Tensor"}, [](Ctx&, Ex x, Ex y) {
      bool is_unsigned = x.v.dtype() == DType::U8 || x.v.dtype() == DType::Bool;
      return x.bin(is_unsigned ? "shift_right_logical" : "shift_right_arithmetic", y);
    });
  reg("isnan", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    return {is_float(x.v.dtype()) ? is_nan(x) : Ex(c.b, c.b.splat(0, c.out(0)))};
  });
  reg("isinf", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    if (!is_float(x.v.dtype())) return {c.b.splat(0, c.out(0))};
    return {x.un("abs").cmp(Cmp::EQ, x.k(INFINITY))};
  });
  reg("isposinf", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    if (!is_float(x.v.dtype())) return {c.b.splat(0, c.out(0))};
    return {x.cmp(Cmp::EQ, x.k(INFINITY))};
  });
  reg("isneginf", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    if (!is_float(x.v.dtype())) return {c.b.splat(0, c.out(0))};
    return {x.cmp(Cmp::EQ, x.k(-INFINITY))};
  });
  reg("isfinite", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    if (!is_float(x.v.dtype())) return {c.b.splat(1, c.out(0))};
    return {x.un("is_finite")};
  });
  reg("nan_to_num", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    DType t = x.v.dtype();
    if (!is_float(t)) return {x};
    double big = t == DType::F64    ? 1.7976931348623157e308
                 : t == DType::F32  ? 3.4028234663852886e38
                 : t == DType::BF16 ? 3.3895313892515355e38
                                    : 65504.0;
    double nan = c.is_none(1) ? 0.0 : c.f64(1);
    double pinf = c.is_none(2) ? big : c.f64(2), ninf = c.is_none(3) ? -big : c.f64(3);
    x = where(is_nan(x), x.k(nan), x);
    x = where(x.cmp(Cmp::EQ, x.k(INFINITY)), x.k(pinf), x);
    return {where(x.cmp(Cmp::EQ, x.k(-INFINITY)), x.k(ninf), x)};
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
}

TPU_LOWERING(elementwise_select) {
  for (const char* n : {"where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar"}) {
    reg(n, [](Ctx& c) -> V {
      DType t = c.out(0).dtype;
      return {where(Ex(c.b, c.in(0)), arg_as(c, 1, t), arg_as(c, 2, t))};
    });
  }
  // As on the CPU, fills may write through expanded views.
  for (const char* base : {"fill", "zero", "masked_fill"})
    spec(base, {.writes_expanded_views = true});
  for (const char* n : {"masked_fill.Scalar", "masked_fill.Tensor"}) {
    reg(n, [](Ctx& c) -> V {
      DType t = c.out(0).dtype;
      return {where(Ex(c.b, c.in(1)), arg_as(c, 2, t), arg_as(c, 0, t))};
    });
  }
  for (const char* n : {"fill.Scalar", "fill.Tensor"}) {
    reg(n, [](Ctx& c) -> V {
      return {broadcast_to(c.b, arg_as(c, 1, c.out(0).dtype), c.out(0).shape)};
    });
  }
  reg("zero", [](Ctx& c) -> V { return {c.b.splat(0, c.out(0))}; });
}

}  // namespace
}  // namespace torchtpu::lower
