// Mixed precision and fused optimizers: GradScaler's two ops, and the fused
// Adam/AdamW/SGD/Adagrad steps that `fused=True` calls. Each is one rule over
// all of its parameters, so in Fused Eager the unscale, the step and the
// scale update join one program. The math follows PyTorch's CPU kernels.
#include <optional>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

// A one-element tensor argument as a rank-0 value of dtype t.
Ex one(Ctx& c, int i, DType t) { return Ex(c.b, c.b.convert(c.b.reshape(c.in(i), {}), t)); }
// A hyperparameter in f64 (the CPU kernels' precision): a float passed at run
// time (Spec::runtime_floats) or, in `tensor_lr` overloads, a tensor.
Ex hyper(Ctx& c, int i) {
  if (c.arg(i).isTensor()) return one(c, i, DType::F64);
  return Ex(c.b, c.scalar(i, DType::F64));
}
Ex logical(const char* op, const Ex& x, const Ex& y) { return x.bin(op, y); }

TPU_LOWERING(amp) {
  // (Tensor(a!)[] grads, Tensor(b!) found_inf, Tensor inv_scale): every grad is
  // multiplied by inv_scale; found_inf becomes 1 if any value is inf or NaN.
  reg("_amp_foreach_non_finite_check_and_unscale_", [](Ctx& c) -> V {
    std::vector<Value> grads = c.list(0);
    if (grads.empty()) return {};
    Ex finite = scalar(c.b, 1, DType::Bool);
    Ex inv = one(c, 2, DType::F32);
    for (size_t e = 0; e < grads.size(); ++e) {
      DType t = compute_dtype(grads[e].dtype());
      Ex g = Ex(c.b, grads[e]).to(t);
      std::vector<int64_t> all = reduce_dims({}, g.v.rank());
      Ex ok(c.b, c.b.reduce(g.un("is_finite"), reduce_init(c.b, Reducer::And, DType::Bool), all,
                            Reducer::And));
      finite = logical("and", finite, ok);
      c.update_at(0, static_cast<int>(e), g * inv.to(t));
    }
    Ex found = one(c, 1, DType::F32);
    c.update(1, where(finite, found, found.k(1)));
    return {};
  });
  // (Tensor(a!) scale, Tensor(b!) growth_tracker, Tensor found_inf,
  //  float growth_factor, float backoff_factor, int growth_interval) -> scale
  reg("_amp_update_scale_", [](Ctx& c) -> V {
    Ex scale = one(c, 0, DType::F64);
    Ex tracker = one(c, 1, DType::I32);
    Ex inf = one(c, 2, DType::F32).cmp(Cmp::NE, scalar(c.b, 0, DType::F32));
    Ex successful = tracker + 1;
    Ex grow = successful.cmp(Cmp::EQ, successful.k(static_cast<double>(c.i64(5))));
    // The grown scale must stay finite in f32.
    Ex grown = (scale * c.f64(3)).to(DType::F32);
    Ex kept = where(logical("and", grow, grown.un("is_finite")), grown, scale.to(DType::F32));
    Ex new_scale = where(inf, (scale * c.f64(4)).to(DType::F32), kept);
    c.update(1, where(logical("or", inf, grow), tracker.k(0), successful));
    return {new_scale};
  });
}

// One parameter of a fused optimizer step, in its math dtype.
struct Elem {
  DType t;
  Ex param, grad;
  std::vector<std::optional<Ex>> state;        // per state list; none when the list is empty
  std::optional<Ex> step;                      // state_steps element in f64
  Ex k(const Ex& h) const { return h.to(t); }  // a hyperparameter in the math dtype
};

// A fused optimizer op: its list arguments (params are 0, grads 1) and the
// per-element update of its parameter and states from the unscaled grad.
struct FusedOptim {
  const char* op;
  std::vector<int> states;   // Tensor(x!)[] state lists, in Elem::state order
  int steps;                 // Tensor[] state_steps, -1 for none
  int maximize;              // bool argument
  std::vector<int> runtime;  // float hyperparameters passed at run time
  void (*update)(Ctx&, Elem&);
};

// (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
//  beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)
template <bool decoupled>
void adam(Ctx& c, Elem& x) {
  Ex lr = hyper(c, 6), beta1 = hyper(c, 7), beta2 = hyper(c, 8), eps = hyper(c, 10);
  const double wd = c.f64(9);
  if (wd != 0 && decoupled) x.param = x.param * x.k(1.0 - lr * wd);
  if (wd != 0 && !decoupled) x.grad = x.grad + x.param * wd;
  Ex& m = *x.state[0];
  Ex& v = *x.state[1];
  // m.lerp_(grad, 1 - beta1), in lerp's two-sided form.
  Ex w = x.k(1.0 - beta1), d = x.grad - m;
  m = where(w.un("abs").cmp(Cmp::LT, w.k(0.5)), m + w * d, x.grad - d * (1.0 - w));
  v = v * x.k(beta2) + x.k(1.0 - beta2) * x.grad * x.grad;
  Ex bc1 = 1.0 - beta1.bin("power", *x.step), bc2 = 1.0 - beta2.bin("power", *x.step);
  Ex denom_of = v;
  if (c.flag(11)) {
    *x.state[2] = maximum(*x.state[2], v);
    denom_of = *x.state[2];
  }
  Ex denom = denom_of.un("sqrt") / x.k(bc2.un("sqrt")) + x.k(eps);
  x.param = x.param + x.k(-(lr / bc1)) * m / denom;
}

// (self, grads, momentum_buffer_list, *, weight_decay, momentum, lr,
//  dampening, nesterov, maximize, is_first_step, grad_scale, found_inf);
// momentum == 0 comes with an empty buffer list.
void sgd(Ctx& c, Elem& x) {
  const double wd = c.f64(3);
  if (wd != 0) x.grad = x.grad + x.param * wd;
  if (x.state[0]) {
    Ex momentum = x.k(hyper(c, 4));
    Ex& buf = *x.state[0];
    buf = c.flag(9) ? x.grad : buf * momentum + x.grad * x.k(1.0 - hyper(c, 6));
    x.grad = c.flag(7) ? x.grad + buf * momentum : buf;
  }
  x.param = x.param + x.grad * x.k(-hyper(c, 5));
}

// (self, grads, state_sums, state_steps, *, lr, lr_decay, weight_decay, eps,
//  maximize, grad_scale, found_inf)
void adagrad(Ctx& c, Elem& x) {
  const double wd = c.f64(6);
  if (wd != 0) x.grad = x.grad + x.param * wd;
  Ex clr = hyper(c, 4) / (1.0 + (*x.step - 1.0) * hyper(c, 5));
  Ex& sum = *x.state[0];
  sum = sum + x.grad * x.grad;
  x.param = x.param - x.k(clr) * x.grad / (sum.un("sqrt") + x.k(hyper(c, 7)));
}

const FusedOptim kOptims[] = {
    {"_fused_adam_", {2, 3, 4}, 5, 12, {6, 7, 8, 10}, &adam<false>},
    {"_fused_adamw_", {2, 3, 4}, 5, 12, {6, 7, 8, 10}, &adam<true>},
    {"_fused_sgd_", {2}, -1, 8, {4, 5, 6}, &sgd},
    {"_fused_adagrad_", {2}, 3, 8, {4, 5, 7}, &adagrad},
};

// Every list element: grads unscaled (and written back, as the CPU kernel
// does), the update, and with found_inf == 1 nothing changed at all.
V fused_step(const FusedOptim& o, Ctx& c) {
  const int gs = c.num_args() - 2, fi = c.num_args() - 1;
  std::vector<Value> params = c.list(0), grads = c.list(1);
  std::vector<std::vector<Value>> states;
  for (int s : o.states) states.push_back(c.list(s));
  std::vector<Value> steps = o.steps >= 0 ? c.list(o.steps) : std::vector<Value>{};
  std::optional<Ex> skip, scale;
  if (!c.is_none(gs)) scale = one(c, gs, DType::F32);
  if (!c.is_none(fi)) skip = one(c, fi, DType::F32).cmp(Cmp::EQ, scalar(c.b, 1, DType::F32));
  auto put = [&](int arg, size_t e, const Ex& now, Value before) {
    Ex v = now.to(before.dtype());
    c.update_at(arg, static_cast<int>(e), skip ? where(*skip, Ex(c.b, before), v) : v);
  };
  for (size_t e = 0; e < params.size(); ++e) {
    const DType t = compute_dtype(params[e].dtype());
    Elem x{t, Ex(c.b, params[e]).to(t), Ex(c.b, grads[e]).to(t), {}, {}};
    for (const auto& s : states)
      x.state.push_back(s.empty() ? std::nullopt : std::optional<Ex>(Ex(c.b, s[e]).to(t)));
    if (!steps.empty()) x.step = Ex(c.b, c.b.convert(c.b.reshape(steps[e], {}), DType::F64));
    if (scale) {
      x.grad = x.grad / scale->to(t);
      put(1, e, x.grad, grads[e]);
    }
    if (c.flag(o.maximize)) x.grad = -x.grad;
    o.update(c, x);
    put(0, e, x.param, params[e]);
    for (size_t k = 0; k < states.size(); ++k)
      if (x.state[k]) put(o.states[k], e, *x.state[k], states[k][e]);
  }
  return {};
}

TPU_LOWERING(fused_optim) {
  for (const FusedOptim& o : kOptims) {
    for (const char* overload : {"", ".tensor_lr"})
      reg(std::string(o.op) + overload, [&o](Ctx& c) -> V { return fused_step(o, c); });
    spec(base_name(o.op), {.runtime_floats = o.runtime});
  }
}

}  // namespace
}  // namespace torchtpu::lower
