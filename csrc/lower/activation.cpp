// Activation functions (torch.nn.functional's) and their backward ops: relu, gelu,
// silu, mish, elu, leaky and randomized relu, hardtanh, softplus, threshold,
// log_sigmoid, hardsigmoid, hardswish, glu, prelu and the hard/soft shrinks. sigmoid,
// tanh and logit are math functions, in elementwise.cpp.
#include <cmath>
#include <utility>
#include <vector>

#include "lower/helpers.h"
#include "lower/math.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using V = std::vector<Value>;

Ex b_and(const Ex& x, const Ex& y) { return x.bin("and", y); }
Ex b_or(const Ex& x, const Ex& y) { return x.bin("or", y); }
Ex sigmoid_(const Ex& x) { return x.un("logistic"); }
Ex softplus_(const Ex& x, const Ex& beta, const Ex& threshold) {
  Ex xb = x * beta;
  return where(xb.cmp(Cmp::GT, threshold), x, xb.un("exponential").un("log_plus_one") / beta);
}
Ex gelu_(const Ex& x, bool tanh_approx) {
  if (!tanh_approx) return x * 0.5 * (1.0 + erf_(x * M_SQRT1_2));
  Ex inner = (x + x * x * x * 0.044715) * std::sqrt(2.0 / kPi);
  return x * 0.5 * (1.0 + inner.un("tanh"));
}
Ex gelu_grad(const Ex& g, const Ex& x, bool tanh_approx) {
  if (!tanh_approx) {
    Ex cdf = 0.5 * (1.0 + erf_(x * M_SQRT1_2));
    Ex pdf = (x * x * -0.5).un("exponential") * (1.0 / std::sqrt(2.0 * kPi));
    return g * (cdf + x * pdf);
  }
  const double beta = std::sqrt(2.0 / kPi), kappa = 0.044715;
  Ex x2 = x * x;
  Ex th = ((x + x2 * x * kappa) * beta).un("tanh");
  Ex right = 1.0 + th;
  Ex dinner = (1.0 + x2 * (3.0 * kappa)) * beta;
  return g * (right * 0.5 + x * 0.5 * (1.0 - th * th) * dinner);
}

// Sums x down to `shape` (torch's sum_to: leading dims and size-1 dims).
Value sum_to(Builder& b, Value x, const Shape& shape) {
  if (x.shape() == shape) return x;
  int64_t lead = x.rank() - static_cast<int64_t>(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(d);
  Value r = reduce_sum(b, x, dims, /*keepdim=*/true);
  return b.reshape(r, shape);
}

// The two halves of x along dim (glu).
std::pair<Ex, Ex> halves(Builder& b, Value x, int64_t dim) {
  Shape lo(x.rank(), 0), mid = x.shape(), hi = x.shape();
  mid[dim] /= 2;
  Shape start2(x.rank(), 0);
  start2[dim] = mid[dim];
  return {Ex(b, b.slice(x, lo, mid, {})), Ex(b, b.slice(x, start2, hi, {}))};
}

// |x| <= lambd: where the shrinks give 0 and pass no gradient. Tested this way
// round so a NaN is outside, and passes through as on the CPU.
Ex inside(Ctx& c, const Ex& x, int lambd_arg) {
  Ex l(c.b, broadcast_to(c.b, c.scalar(lambd_arg, x.v.dtype()), x.v.shape()));
  return x.un("abs").cmp(Cmp::LE, l);
}

TPU_LOWERING(activation_unary) {
  reg("relu", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    return {maximum(x, x.k(0))};
  });
  reg("silu", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    return {x * sigmoid_(x)};
  });
  reg("mish", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    return {x * softplus_(x, x.k(1), x.k(20)).un("tanh")};
  });
  reg("gelu", [](Ctx& c) -> V {
    return {gelu_(arg_as(c, 0, math_dtype(c)), c.arg(1).toStringRef() == "tanh")};
  });
  reg("elu", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = arg_as(c, 0, t), alpha = arg_as(c, 1, t), scale = arg_as(c, 2, t),
       iscale = arg_as(c, 3, t);
    Ex neg = (x * iscale).un("exponential_minus_one") * alpha * scale;
    return {where(x.cmp(Cmp::GT, x.k(0)), x * scale, neg)};
  });
  reg("leaky_relu", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = arg_as(c, 0, t);
    return {where(x.cmp(Cmp::GT, x.k(0)), x, x * arg_as(c, 1, t))};
  });
  reg("hardtanh", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    return {minimum(maximum(arg_as(c, 0, t), arg_as(c, 1, t)), arg_as(c, 2, t))};
  });
  reg("softplus", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    return {softplus_(arg_as(c, 0, t), arg_as(c, 1, t), arg_as(c, 2, t))};
  });
  reg("threshold", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = arg_as(c, 0, t);
    return {where(x.cmp(Cmp::LE, arg_as(c, 1, t)), arg_as(c, 2, t), x)};
  });
  // log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)); the buffer is unused.
  reg("log_sigmoid_forward", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    Ex r = minimum(x, x.k(0)) - (-x.un("abs")).un("exponential").un("log_plus_one");
    return {r, c.b.splat(0, c.out(1))};
  });
  reg("log_sigmoid_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    return {arg_as(c, 0, t) * sigmoid_(-arg_as(c, 1, t))};
  });
  reg("hardsigmoid", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    return {minimum(maximum(x + 3.0, x.k(0)), x.k(6)) / 6.0};
  });
  reg("hardswish", [](Ctx& c) -> V {
    Ex x = arg_as(c, 0, math_dtype(c));
    return {x * minimum(maximum(x + 3.0, x.k(0)), x.k(6)) / 6.0};
  });
}

TPU_LOWERING(activation_backward) {
  // (grad_output, self_or_result, ...) -> grad_input.
  reg("gelu_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    return {gelu_grad(arg_as(c, 0, t), arg_as(c, 1, t), c.arg(2).toStringRef() == "tanh")};
  });
  reg("silu_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t), s = sigmoid_(x);
    return {g * s * (1.0 + x * (1.0 - s))};
  });
  reg("mish_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t);
    Ex th = softplus_(x, x.k(1), x.k(20)).un("tanh");
    return {g * (th + x * sigmoid_(x) * (1.0 - th * th))};
  });
  reg("threshold_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t);
    return {where(x.cmp(Cmp::LE, arg_as(c, 2, t)), g.k(0), g)};
  });
  reg("elu_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), alpha = arg_as(c, 1, t), scale = arg_as(c, 2, t),
       iscale = arg_as(c, 3, t), x = arg_as(c, 5, t);
    Ex nonpos = x.cmp(Cmp::LE, x.k(0));
    if (c.flag(4))  // x is the forward result
      return {where(nonpos, g * iscale * (x + alpha * scale), g * scale)};
    return {where(nonpos, g * iscale * alpha * scale * (x * iscale).un("exponential"), g * scale)};
  });
  reg("leaky_relu_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t);
    return {where(x.cmp(Cmp::GT, x.k(0)), g, g * arg_as(c, 2, t))};
  });
  reg("hardtanh_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t);
    Ex out = b_or(x.cmp(Cmp::LE, arg_as(c, 2, t)), x.cmp(Cmp::GE, arg_as(c, 3, t)));
    return {where(out, g.k(0), g)};
  });
  reg("softplus_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t), beta = arg_as(c, 2, t);
    Ex xb = x * beta, z = xb.un("exponential");
    return {where(xb.cmp(Cmp::GT, arg_as(c, 3, t)), g, g * z / (z + 1.0))};
  });
  reg("hardsigmoid_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t);
    Ex in = b_and(x.cmp(Cmp::GT, x.k(-3)), x.cmp(Cmp::LT, x.k(3)));
    return {where(in, g / 6.0, g.k(0))};
  });
  reg("hardswish_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = arg_as(c, 0, t), x = arg_as(c, 1, t);
    Ex mid = where(x.cmp(Cmp::LE, x.k(3)), g * (x / 3.0 + 0.5), g);
    return {where(x.cmp(Cmp::LT, x.k(-3)), g.k(0), mid)};
  });
}

TPU_LOWERING(activation_glu_prelu_shrink) {
  // (self, dim)
  reg("glu", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = b.convert(c.in(0), compute_dtype(c.out(0).dtype));
    auto [a, g] = halves(b, x, wrap_dim(c.i64(1), x.rank()));
    return {a * g.un("logistic")};
  });
  // (grad_output, self, dim)
  reg("glu_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Value x = b.convert(c.in(1), t);
    int64_t dim = wrap_dim(c.i64(2), x.rank());
    Ex g(b, b.convert(c.in(0), t));
    auto [a, h] = halves(b, x, dim);
    Ex s = h.un("logistic");
    return {b.concatenate({g * s, g * a * s * (1.0 - s)}, dim)};
  });
  // (self, weight): weight broadcasts against self.
  reg("_prelu_kernel", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Ex x(b, b.convert(c.in(0), t));
    Ex w(b, broadcast_to(b, b.convert(c.in(1), t), c.out(0).shape));
    return {where(x.cmp(Cmp::GT, x.k(0)), x, w * x)};
  });
  // (grad_output, self, weight) -> (grad_self, grad_weight)
  reg("_prelu_kernel_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = compute_dtype(c.out(0).dtype);
    Shape s = broadcast_shapes(c.in(0).shape(), c.in(1).shape());
    s = broadcast_shapes(s, c.in(2).shape());
    Ex g(b, broadcast_to(b, b.convert(c.in(0), t), s));
    Ex x(b, broadcast_to(b, b.convert(c.in(1), t), s));
    Ex w(b, broadcast_to(b, b.convert(c.in(2), t), s));
    Ex pos = x.cmp(Cmp::GT, x.k(0));
    Ex gx = where(pos, g, w * g);
    Ex gw = where(pos, g.k(0), x * g);
    return {sum_to(b, gx, c.out(0).shape), sum_to(b, gw, c.out(1).shape)};
  });
  // (self, lambd)
  reg("hardshrink", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    return {where(inside(c, x, 1), x.k(0), x)};
  });
  reg("softshrink", [](Ctx& c) -> V {
    Builder& b = c.b;
    Ex x(b, c.in(0));
    Ex l(b, broadcast_to(b, c.scalar(1, x.v.dtype()), x.v.shape()));
    Ex shifted = where(x.cmp(Cmp::GT, l), x - l, x + l);
    return {where(inside(c, x, 1), x.k(0), shifted)};
  });
  // (grad_out, self, lambd): both pass the gradient outside [-lambd, lambd].
  for (const char* n : {"hardshrink_backward", "softshrink_backward"}) {
    reg(n, [](Ctx& c) -> V {
      Builder& b = c.b;
      Ex x(b, c.in(1));
      Ex g(b, b.convert(c.in(0), x.v.dtype()));
      return {where(inside(c, x, 2), g.k(0), g)};
    });
  }
}

TPU_LOWERING(activation_rrelu) {
  // rrelu_with_noise(self, noise(b!), lower, upper, training, generator?):
  // training draws a slope in [lower, upper) per negative element (recorded
  // in noise); eval uses the mean slope.
  reg("rrelu_with_noise", [](Ctx& c) -> V {
    Builder& b = c.b;
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t);
    Ex lo(b, c.scalar(2, t)), hi(b, c.scalar(3, t));
    Ex neg = x.cmp(Cmp::LT, x.k(0));
    if (!c.flag(4)) return {where(neg, x * ((lo + hi) / 2.0), x)};
    int64_t n = x.v.type.numel();
    Value bits = b.rng_bit_generator(c.rng_state(n), Type{DType::U32, x.v.shape()}).second;
    bits = b.binary("shift_right_logical", bits, b.splat(8, bits.type));
    Ex u = Ex(b, b.convert(b.convert(bits, DType::F32), t)) * std::ldexp(1.0, -24);
    Ex slope = where(neg, lo + (hi - lo) * u, x.k(1));
    c.update(1, slope);
    return {x * slope};
  });
  // (grad_output, self, noise, lower, upper, training, self_is_result)
  reg("rrelu_with_noise_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = in_as(c, 0, t), x = in_as(c, 1, t);
    Ex lo(c.b, c.scalar(3, t)), hi(c.b, c.scalar(4, t));
    if (c.flag(5)) return {g * in_as(c, 2, t)};
    return {where(x.cmp(Cmp::LE, x.k(0)), g * ((lo + hi) / 2.0), g)};
  });
}

}  // namespace
}  // namespace torchtpu::lower
