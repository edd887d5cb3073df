// Factory-like ops (arange, linspace, eye, zero tensors) and random fills. Random ops draw
// Philox bits from the per-call generator state (ctx.rng_state).
#include <cmath>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using V = std::vector<Value>;

constexpr double kPi = 3.14159265358979323846;

// Dtype the random math runs in: f64 for f64 outputs, f32 otherwise.
DType rand_dtype(DType out) { return out == DType::F64 ? DType::F64 : DType::F32; }

// `count` draws per element of `shape`: uniform in [0, 1) with 24 (f32) or 53
// (f64) random bits; the leading dim of the result indexes the draw.
Ex uniform01(Ctx& c, const Shape& shape, DType t, int64_t count = 1) {
  Builder& b = c.b;
  Shape s = shape;
  s.insert(s.begin(), count);
  int64_t n = Type{t, s}.numel();
  Value state = c.rng_state(t == DType::F64 ? 2 * n : n);
  if (t == DType::F64) {
    Value bits = b.rng_bit_generator(state, Type{DType::U64, s}).second;
    bits = b.binary("shift_right_logical", bits, b.splat(11, bits.type));
    return Ex(b, b.convert(bits, DType::F64)) * std::ldexp(1.0, -53);
  }
  Value bits = b.rng_bit_generator(state, Type{DType::U32, s}).second;
  bits = b.binary("shift_right_logical", bits, b.splat(8, bits.type));
  return Ex(b, b.convert(bits, DType::F32)) * std::ldexp(1.0, -24);
}
// Draw i of a uniform01 result, shaped like one element set.
Ex draw(const Ex& u, int64_t i) {
  Builder& b = *u.b;
  Shape lo(u.v.rank(), 0), hi = u.v.shape();
  lo[0] = i;
  hi[0] = i + 1;
  Shape s(u.v.shape().begin() + 1, u.v.shape().end());
  return Ex(b, b.reshape(b.slice(u.v, lo, hi, {}), s));
}
// Standard normal by Box-Muller.
Ex std_normal(Ctx& c, const Shape& shape, DType t) {
  Ex u = uniform01(c, shape, t, 2);
  Ex u1 = 1.0 - draw(u, 0), u2 = draw(u, 1);  // u1 in (0, 1]
  return (u1.un("log") * -2.0).un("sqrt") * (u2 * (2 * kPi)).un("cosine");
}
// Uniform integers in [lo, lo + range) as i64 (range > 0).
Ex rand_int(Ctx& c, const Shape& shape, double lo, double range) {
  Builder& b = c.b;
  Value state = c.rng_state(2 * Type{DType::U64, shape}.numel());
  Value bits = b.rng_bit_generator(state, Type{DType::U64, shape}).second;
  Value r = b.binary("remainder", bits, b.splat(range, bits.type));
  return Ex(b, b.convert(r, DType::I64)) + lo;
}
// Largest value random_() draws for a dtype (torch: mantissa range for floats).
double random_max(DType t) {
  switch (t) {
    case DType::F32: return 16777216.0;
    case DType::F64: return 9007199254740992.0;
    case DType::BF16: return 256.0;
    case DType::F16: return 2048.0;
    case DType::Bool: return 1.0;
    default:
      return is_unsigned(t) ? std::ldexp(1.0, 8 * static_cast<int>(itemsize(t))) - 1
                            : std::ldexp(1.0, 8 * static_cast<int>(itemsize(t)) - 1) - 1;
  }
}

TPU_LOWERING(creation_ranges) {
  // start/end/step decide the output's length, so they are keyed by value (an
  // out= tensor is resized only when its key is new).
  spec("arange", {.attribute_scalars = {0, 1, 2}});
  spec("range", {.attribute_scalars = {0, 1, 2}});
  // (start, end, step, *, out): out[i] = start + i * step, length from out's shape.
  reg("arange.start_out", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    DType t = is_float(o.dtype) ? DType::F64 : DType::I64;
    Ex i(c.b, c.b.iota(Type{t, o.shape}, 0));
    return {Ex(c.b, c.scalar(0, t)) + i * Ex(c.b, c.scalar(2, t))};
  });
  reg("arange.out", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    return {c.b.iota(Type{is_float(o.dtype) ? DType::F64 : DType::I64, o.shape}, 0)};
  });
  // (start, end, steps, *, out): symmetric form as torch, exact at both ends.
  reg("linspace.out", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    int64_t steps = c.i64(2);
    // Integer outputs as the CPU computes them: the bounds truncated to the
    // dtype first, each value truncated toward zero.
    const bool integral = !is_float(o.dtype);
    auto trunc = [integral](const Ex& x) {
      return integral ? where(x.cmp(Cmp::LT, x.k(0)), x.un("ceil"), x.un("floor")) : x;
    };
    Ex start = trunc(Ex(c.b, c.scalar(0, DType::F64))),
       end = trunc(Ex(c.b, c.scalar(1, DType::F64)));
    if (steps <= 1) return {broadcast_to(c.b, start, o.shape)};
    Ex i(c.b, c.b.iota(Type{DType::F64, o.shape}, 0));
    Ex step = (end - start) / static_cast<double>(steps - 1);
    Ex half = i.cmp(Cmp::LT, i.k(static_cast<double>(steps / 2)));
    return {
        trunc(where(half, start + step * i, end - step * (static_cast<double>(steps - 1) - i)))};
  });
  // (start, end, steps, base): base ** linspace(start, end, steps), in the
  // output's float dtype as torch does (f64 for integer outputs).
  reg("logspace.out", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    int64_t steps = c.i64(2);
    DType t = is_float(o.dtype) ? compute_dtype(o.dtype) : DType::F64;
    Ex start(c.b, c.scalar(0, t)), end(c.b, c.scalar(1, t));
    Ex e(c.b, broadcast_to(c.b, start, o.shape));
    if (steps > 1) {
      Ex i(c.b, c.b.iota(Type{t, o.shape}, 0));
      Ex step = (end - start) / static_cast<double>(steps - 1);
      Ex half = i.cmp(Cmp::LT, i.k(static_cast<double>(steps / 2)));
      e = where(half, start + step * i, end - step * (static_cast<double>(steps - 1) - i));
    }
    Ex v = e.k(c.f64(3)).bin("power", e);
    if (!is_float(o.dtype)) v = v.un("floor");
    return {v};
  });
  for (const char* n : {"eye.out", "eye.m_out"}) {
    reg(n, [](Ctx& c) -> V {
      const Type& o = c.out(0);
      Type it{DType::I64, o.shape};
      return {c.b.compare(Cmp::EQ, c.b.iota(it, 0), c.b.iota(it, 1))};
    });
  }
  reg("_efficientzerotensor", [](Ctx& c) -> V { return {c.b.splat(0, c.out(0))}; });
}

TPU_LOWERING(creation_random) {
  // (self, from, to, *, generator)
  reg("uniform", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    double from = c.f64(1), to = c.f64(2);
    return {uniform01(c, o.shape, rand_dtype(o.dtype)) * (to - from) + from};
  });
  // normal_ (in-place) and its functional twin: (self, mean, std, *, generator)
  for (const char* n : {"normal", "normal_functional"}) {
    reg(n, [](Ctx& c) -> V {
      const Type& o = c.out(0);
      return {std_normal(c, o.shape, rand_dtype(o.dtype)) * c.f64(2) + c.f64(1)};
    });
  }
  // normal with tensor mean and/or std.
  reg("normal.Tensor_float", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    DType t = rand_dtype(o.dtype);
    return {std_normal(c, o.shape, t) * c.f64(1) + Ex(c.b, c.b.convert(c.in(0), t))};
  });
  reg("normal.float_Tensor", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    DType t = rand_dtype(o.dtype);
    return {std_normal(c, o.shape, t) * Ex(c.b, c.b.convert(c.in(1), t)) + c.f64(0)};
  });
  reg("normal.Tensor_Tensor", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    DType t = rand_dtype(o.dtype);
    return {std_normal(c, o.shape, t) * Ex(c.b, c.b.convert(c.in(1), t)) +
            Ex(c.b, c.b.convert(c.in(0), t))};
  });
  // bernoulli.p(self, p) / bernoulli_.float(self, p) (looked up as
  // "bernoulli.float") / bernoulli(self): p = self / bernoulli.Tensor(self, p).
  for (const char* n : {"bernoulli.p", "bernoulli.float"}) {
    reg(n, [](Ctx& c) -> V {
      const Type& o = c.out(0);
      Ex u = uniform01(c, o.shape, rand_dtype(o.dtype));
      return {u.cmp(Cmp::LT, u.k(c.f64(1)))};
    });
  }
  for (const char* n : {"bernoulli", "bernoulli.Tensor"}) {
    int parg = std::string(n) == "bernoulli" ? 0 : 1;
    reg(n, [parg](Ctx& c) -> V {
      const Type& o = c.out(0);
      DType t = rand_dtype(o.dtype);
      Ex u = uniform01(c, o.shape, t);
      return {u.cmp(Cmp::LT, Ex(c.b, broadcast_to(c.b, c.b.convert(c.in(parg), t), o.shape)))};
    });
  }
  // random_.from(self, from, to?) / random_.to(self, to) / random_(self).
  reg("random.from", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    double from = static_cast<double>(c.i64(1));
    double to = c.is_none(2) ? random_max(o.dtype) + 1 : static_cast<double>(c.i64(2));
    return {rand_int(c, o.shape, from, to - from)};
  });
  reg("random.to",
      [](Ctx& c) -> V { return {rand_int(c, c.out(0).shape, 0, static_cast<double>(c.i64(1)))}; });
  reg("random",
      [](Ctx& c) -> V { return {rand_int(c, c.out(0).shape, 0, random_max(c.out(0).dtype) + 1)}; });
  // (self, lambd)
  reg("exponential", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    Ex u = uniform01(c, o.shape, rand_dtype(o.dtype));
    return {(-u).un("log_plus_one") * (-1.0 / c.f64(1))};
  });
  // (self, mean, std): exp of a normal.
  reg("log_normal", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    return {(std_normal(c, o.shape, rand_dtype(o.dtype)) * c.f64(2) + c.f64(1)).un("exponential")};
  });
  // (self, median, sigma)
  reg("cauchy", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    Ex u = uniform01(c, o.shape, rand_dtype(o.dtype));
    return {((u - 0.5) * kPi).un("tan") * c.f64(2) + c.f64(1)};
  });
  // (self, p): number of trials to the first success.
  reg("geometric", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    Ex u = 1.0 - uniform01(c, o.shape, rand_dtype(o.dtype));  // (0, 1]
    return {(u.un("log") / std::log1p(-c.f64(1))).un("ceil")};
  });
  // (self, num_samples, replacement): rows of self are unnormalized weights.
  reg("multinomial", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value p0 = c.in(0);
    DType t = rand_dtype(p0.dtype());
    int64_t cats = p0.shape().back(), k = c.i64(1), rows = p0.type.numel() / cats;
    Ex p(b, b.reshape(b.convert(p0, t), {rows, cats}));
    if (!c.flag(2)) {
      // Gumbel top-k: sorting log p + Gumbel noise samples without replacement.
      Ex u = draw(uniform01(c, {rows, cats}, t), 0);
      Ex key = p.un("log") - (-(1.0 - u).un("log")).un("log");
      Value s = b.sort_indexed(key.v, 1, true).second;
      return {b.slice(s, {0, 0}, {rows, k}, {})};
    }
    // Inverse CDF: count the categories whose cumulative weight is <= u * total.
    Value cdf = b.reduce_window(p.v, b.constant(0, t), hlo::Reducer::Add, {1, cats}, {},
                                {0, cats - 1}, {0, 0});
    Ex total(b, b.slice(cdf, {0, cats - 1}, {rows, cats}, {}));
    Ex u = draw(uniform01(c, {rows, k}, t), 0) * total;
    Ex cdf3(b, b.reshape(cdf, {rows, 1, cats})), u3(b, b.reshape(u.v, {rows, k, 1}));
    Value cnt = cdf3.cmp(hlo::Cmp::LE, u3).to(DType::I64).v;
    Ex idx(b, b.reduce(cnt, b.constant(0, DType::I64), {2}, hlo::Reducer::Add));
    return {minimum(idx, idx.k(static_cast<double>(cats - 1)))};
  });
  // randperm.generator_out(n, generator, *, out): argsort of random keys.
  reg("randperm.generator_out", [](Ctx& c) -> V {
    Builder& b = c.b;
    int64_t n = c.out(0).numel();
    Value state = c.rng_state(2 * n);
    Value keys = b.rng_bit_generator(state, Type{DType::U64, {n}}).second;
    return {b.sort_indexed(keys, 0, false).second};
  });
}

}  // namespace
}  // namespace torchtpu::lower
