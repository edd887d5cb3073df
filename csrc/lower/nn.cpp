// Neural-network ops: matmuls, layer/batch/group norm, weight norm, dropout, losses.
#include <ATen/ops/empty.h>

#include <string>
#include <string_view>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

Ex sum(const Ex& x, const std::vector<int64_t>& dims, bool keepdim = false) {
  return Ex(*x.b, reduce_sum(*x.b, x.v, dims, keepdim));
}
// reduce_sums on Ex values, optionally keeping the reduced dims as size 1.
std::vector<Ex> sums(const std::vector<Ex>& xs, const std::vector<int64_t>& dims,
                     bool keepdim = false) {
  Builder& b = *xs.at(0).b;
  std::vector<Value> vs;
  for (const Ex& x : xs) vs.push_back(x.v);
  std::vector<Ex> out;
  for (Value r : reduce_sums(b, vs, dims))
    out.emplace_back(b, keepdim ? b.reshape(r, reduced_shape(vs[0].shape(), dims, true)) : r);
  return out;
}
Ex sum_all(const Ex& x) { return sum(x, reduce_dims({}, x.v.rank())); }
std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> r;
  for (int64_t i = from; i < to; ++i) r.push_back(i);
  return r;
}
Ex zeros(Ctx& c, int k) { return Ex(c.b, c.b.splat(0, c.out(k))); }

// beta * self + alpha * product; beta == 0 ignores self (even NaN), as torch does.
Ex add_scaled(Ctx& c, Ex self, Ex prod, int beta_arg, int alpha_arg) {
  DType t = prod.v.dtype();
  Ex beta(c.b, c.scalar(beta_arg, t)), alpha(c.b, c.scalar(alpha_arg, t));
  Ex s = where(beta.cmp(Cmp::EQ, beta.k(0)), self.k(0), self * beta);
  return s + prod * alpha;
}

// Torch reductions: 0 none, 1 mean, 2 sum.
Ex reduce_loss(const Ex& l, int64_t reduction) {
  if (reduction == 0) return l;
  Ex s = sum_all(l);
  return reduction == 1 ? s / static_cast<double>(l.v.type.numel()) : s;
}

TPU_LOWERING(nn_matmul) {
  // mm.dtype and bmm.dtype (self, mat2, out_dtype): the out dtype is the
  // meta kernel's, so the dot accumulates in it like any matmul.
  for (const char* n : {"mm", "bmm", "dot", "mv", "vdot", "mm.dtype", "bmm.dtype"}) {
    reg(n, [conj_self = std::string_view(n) == "vdot"](Ctx& c) -> V {
      DType t = math_dtype(c);
      // Inputs stay in their dtype; the dot accumulates in t (f32 for bf16).
      DType in = promote(c.in(0).dtype(), c.in(1).dtype());
      Value x = c.b.convert(c.in(0), in);
      if (conj_self) x = conj(Ex(c.b, x));
      return {matmul(c.b, x, c.b.convert(c.in(1), in), t)};
    });
  }
  // (self, a, b, *, beta, alpha); addmm.dtype takes out_dtype before beta (torch's own
  // decomposition of baddbmm.dtype runs before any backend kernel).
  for (const char* n : {"addmm", "baddbmm", "addmv", "addmm.dtype"}) {
    const int beta = std::string_view(n).ends_with(".dtype") ? 4 : 3;
    reg(n, [beta](Ctx& c) -> V {
      DType t = math_dtype(c);
      DType in = promote(c.in(1).dtype(), c.in(2).dtype());
      Ex prod(c.b, matmul(c.b, c.b.convert(c.in(1), in), c.b.convert(c.in(2), in), t));
      return {add_scaled(c, in_as(c, 0, t), prod, beta, beta + 1)};
    });
  }
  reg("addbmm", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    DType in = promote(c.in(1).dtype(), c.in(2).dtype());
    Ex prod(c.b, matmul(c.b, c.b.convert(c.in(1), in), c.b.convert(c.in(2), in), t));
    return {add_scaled(c, in_as(c, 0, t), sum(prod, {0}), 3, 4)};
  });
}

// Group of each position along a grouped dim of length n: the number of
// offsets (cumulative group ends) at or before it; n_groups past the last end.
// Returned as a [groups, n] mask: row e is true where the group is e.
Value group_mask(Builder& b, Value offs, int64_t n) {
  const int64_t e = offs.shape()[0];
  Value ends = b.broadcast_in_dim(b.convert(offs, DType::I64), {e, n}, {0});
  Value pos = b.iota(Type{DType::I64, {e, n}}, 1);
  Value before = b.convert(b.compare(Cmp::LE, ends, pos), DType::I64);
  Value group = b.broadcast_in_dim(reduce_sum(b, before, {0}, false), {e, n}, {1});
  return b.compare(Cmp::EQ, b.iota(Type{DType::I64, {e, n}}, 0), group);
}

// Keeps x where `mask` (broadcast along `dims`) holds, zero elsewhere.
Value keep(Builder& b, Value mask, const std::vector<int64_t>& dims, Value x) {
  Value m = b.broadcast_in_dim(mask, x.shape(), dims);
  return b.select(m, x, b.splat(0, x.type));
}

// _grouped_mm's outputs as the CPU kernel makes them (PyTorch's meta kernel
// accepts bfloat16 only, CUDA's limit): [m, n] when one side is 2d, [g, m, n]
// for 2d x 2d (one per group) and 3d x 3d (bmm).
std::vector<at::Tensor> grouped_mm_meta(const CallArgs& a) {
  const at::Tensor &x = a[0].toTensor(), &y = a[1].toTensor();
  TORCH_CHECK(x.dim() >= 2 && x.dim() <= 3 && y.dim() >= 2 && y.dim() <= 3,
              "_grouped_mm: operands must be 2d or 3d, got ", x.dim(), "d and ", y.dim(), "d");
  const bool x2 = x.dim() == 2, y2 = y.dim() == 2;
  TORCH_CHECK(a[2].isNone() == (!x2 && !y2),
              "_grouped_mm: offs are needed exactly when an operand is 2d");
  TORCH_CHECK(x.size(-1) == y.size(-2) || (x2 && y2),
              "_grouped_mm: contraction sizes differ: ", x.sizes(), " and ", y.sizes());
  const int64_t g = a[2].isNone() ? x.size(0) : a[2].toTensor().size(0);
  std::vector<int64_t> shape;
  if (x2 && y2)
    shape = {g, x.size(0), y.size(1)};
  else if (x2)
    shape = {x.size(0), y.size(2)};
  else if (y2)
    shape = {x.size(1), y.size(1)};
  else
    shape = {x.size(0), x.size(1), y.size(2)};
  c10::ScalarType dt = a[4].isNone() ? x.scalar_type() : a[4].toScalarType();
  return {at::empty(shape, x.options().dtype(dt).device(c10::kMeta))};
}

TPU_LOWERING(nn_grouped_mm) {
  spec("_grouped_mm", {.meta = grouped_mm_meta});
  // (self, mat2, offs?, bias?, out_dtype?): one matmul per group of rows (2d x 3d),
  // columns (3d x 2d) or contraction slices (2d x 2d, one output per group), with
  // the groups' ends in offs; 3d x 3d is bmm. Every group is computed and the
  // right one selected, so the shapes stay static (no read of offs on the host).
  reg("_grouped_mm", [](Ctx& c) -> V {
    TORCH_CHECK(c.is_none(3), "[tpu] _grouped_mm: bias is not supported (as on CUDA)");
    DType t = math_dtype(c), out = c.out(0).dtype;
    DType in = promote(c.in(0).dtype(), c.in(1).dtype());
    Builder& b = c.b;
    Value x = b.convert(c.in(0), in), y = b.convert(c.in(1), in);
    const bool x2 = x.rank() == 2, y2 = y.rank() == 2;
    if (!x2 && !y2) return {b.convert(matmul(b, x, y, t), out)};
    Value offs = c.in(2);
    if (x2 && !y2) {                                       // [m, k] x [g, k, n]: rows grouped
      Value r = b.dot_general(x, y, {}, {}, {1}, {1}, t);  // [m, g, n]
      Value mask = b.transpose(group_mask(b, offs, x.shape()[0]), {1, 0});
      return {b.convert(reduce_sum(b, keep(b, mask, {0, 1}, r), {1}, false), out)};
    }
    if (!x2 && y2) {                                       // [g, m, k] x [k, n]: columns grouped
      Value r = b.dot_general(x, y, {}, {}, {2}, {0}, t);  // [g, m, n]
      Value mask = group_mask(b, offs, y.shape()[1]);
      return {b.convert(reduce_sum(b, keep(b, mask, {0, 2}, r), {0}, false), out)};
    }
    // [m, s] x [s, n]: the contraction grouped, one [m, n] per group. Both
    // sides are masked, so values outside a group (even inf) never enter it.
    const int64_t g = offs.shape()[0], m = x.shape()[0], s = x.shape()[1], n = y.shape()[1];
    Value mask = group_mask(b, offs, s);
    Value xs = keep(b, mask, {0, 2}, b.broadcast_in_dim(x, {g, m, s}, {1, 2}));
    Value ys = keep(b, mask, {0, 1}, b.broadcast_in_dim(y, {g, s, n}, {1, 2}));
    return {b.convert(b.dot_general(xs, ys, {0}, {0}, {2}, {1}, t), out)};
  });
}

TPU_LOWERING(nn_layer_norm) {
  // (input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
  reg("native_layer_norm", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t);
    int64_t r = x.v.rank(), k = static_cast<int64_t>(c.ints(1).size());
    auto axes = range(r - k, r);
    double n = 1;
    for (int64_t a : axes) n *= static_cast<double>(x.v.shape()[a]);
    Ex mean = sum(x, axes, true) / n;
    Ex d = x - mean;
    Ex rstd = (sum(d * d, axes, true) / n + c.f64(4)).un("rsqrt");
    Ex y = d * rstd;
    if (!c.is_none(2)) y = y * in_as(c, 2, t);
    if (!c.is_none(3)) y = y + in_as(c, 3, t);
    return {y, mean, rstd};
  });
  // (grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask[3])
  reg("native_layer_norm_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = in_as(c, 0, t), x = in_as(c, 1, t);
    int64_t r = x.v.rank(), k = static_cast<int64_t>(c.ints(2).size());
    auto axes = range(r - k, r), lead = range(0, r - k);
    double n = 1;
    for (int64_t a : axes) n *= static_cast<double>(x.v.shape()[a]);
    Ex mean = in_as(c, 3, t), rstd = in_as(c, 4, t);
    mean = Ex(c.b, c.b.reshape(mean.v, reduced_shape(x.v.shape(), axes, true)));
    rstd = Ex(c.b, c.b.reshape(rstd.v, reduced_shape(x.v.shape(), axes, true)));
    Ex xhat = (x - mean) * rstd;
    auto mask = c.arg(7).toBoolList();
    V out;
    Ex gw = c.is_none(5) ? g : g * in_as(c, 5, t);
    if (mask.get(0)) {
      std::vector<Ex> s = sums({gw, gw * xhat}, axes, true);
      out.push_back((gw - s[0] / n - xhat * (s[1] / n)) * rstd);
    } else {
      out.push_back(zeros(c, 0));
    }
    if (!mask.get(1) && !mask.get(2)) return {out[0], zeros(c, 1), zeros(c, 2)};
    std::vector<Ex> s = sums({g * xhat, g}, lead);
    out.push_back(mask.get(1) ? s[0].v : zeros(c, 1).v);
    out.push_back(mask.get(2) ? s[1].v : zeros(c, 2).v);
    return out;
  });
}

TPU_LOWERING(nn_weight_norm) {
  // Weight norm w = v * g / ||v||, the norm taken over every dim but `dim`
  // (norms has g's shape). nn.utils.weight_norm on tpu reaches these.
  auto except_dim = [](int64_t rank, int64_t dim) {
    std::vector<int64_t> dims;
    for (int64_t k = 0; k < rank; ++k)
      if (k != wrap_dim(dim, rank)) dims.push_back(k);
    return dims;
  };
  reg("_weight_norm_interface", [except_dim](Ctx& c) -> V {
    DType t = math_dtype(c, 1);
    Ex v = in_as(c, 0, t), g = in_as(c, 1, t);
    auto dims = except_dim(v.v.rank(), c.i64(2));
    Ex norms = Ex(c.b, reduce_sum(c.b, (v * v).v, dims, true)).un("sqrt");
    return {v * (g / norms), norms};
  });
  // (grad_w, v, g, norms, dim) -> (grad_v, grad_g)
  reg("_weight_norm_interface_backward", [except_dim](Ctx& c) -> V {
    DType t = math_dtype(c, 1);
    Ex gw = in_as(c, 0, t), v = in_as(c, 1, t), g = in_as(c, 2, t), norms = in_as(c, 3, t);
    auto dims = except_dim(v.v.rank(), c.i64(4));
    Ex dot(c.b, reduce_sum(c.b, (gw * v).v, dims, true));
    Ex grad_v = (g / norms) * (gw - v * (dot / (norms * norms)));
    return {grad_v, dot / norms};
  });
}

// Per-channel stats (channel dim 1) reshaped to broadcast against x.
Ex channel(Ctx& c, int i, const Value& x, DType t) {
  Shape s(x.rank(), 1);
  s[1] = x.shape()[1];
  return Ex(c.b, c.b.reshape(c.b.convert(c.in(i), t), s));
}

// Batch norm forward over channel dim 1; running stats at args `stats` and
// `stats` + 1 (absent when -1 or None).
V batch_norm(Ctx& c, bool training, double momentum, double eps, int stats) {
  DType t = math_dtype(c);
  Ex x = in_as(c, 0, t);
  std::vector<int64_t> axes = range(0, x.v.rank());
  axes.erase(axes.begin() + 1);
  Ex mean = x, invstd = x;
  V saved;
  if (training) {
    double n = 1;
    for (int64_t a : axes) n *= static_cast<double>(x.v.shape()[a]);
    mean = sum(x, axes, true) / n;
    Ex d = x - mean;
    Ex var = sum(d * d, axes, true) / n;
    invstd = (var + eps).un("rsqrt");
    saved = {mean, invstd};
    // Running stats: (1 - momentum) * old + momentum * batch (unbiased var).
    const Shape cs = {x.v.shape()[1]};
    auto blend = [&](int arg, const Ex& batch) {
      if (arg < 0 || c.is_none(arg)) return;
      Ex old(c.b, c.b.reshape(in_as(c, arg, t).v, cs));
      c.update(arg, old * (1.0 - momentum) + Ex(c.b, c.b.reshape(batch.v, cs)) * momentum);
    };
    blend(stats, mean);
    blend(stats < 0 ? -1 : stats + 1, var * (n / std::max(n - 1.0, 1.0)));
  } else {
    mean = channel(c, stats, x.v, t);
    invstd = (channel(c, stats + 1, x.v, t) + eps).un("rsqrt");
    saved = {zeros(c, 1), zeros(c, 2)};
  }
  Ex y = (x - mean) * invstd;
  if (!c.is_none(1)) y = y * channel(c, 1, x.v, t);
  if (!c.is_none(2)) y = y + channel(c, 2, x.v, t);
  return {y, saved[0], saved[1]};
}

TPU_LOWERING(nn_batch_norm) {
  // (input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
  //   -> (out, save_mean, save_invstd); training also updates the running stats.
  // The _native_batch_norm_legit / _batch_norm_with_update family differs only
  // in where training, momentum and eps sit (and a 4th, empty, reserve output).
  struct BnArgs {
    const char* name;
    int training, momentum, eps;  // arg positions; training -1 = always, -2 = never
    int stats;                    // position of running_mean (var follows), -1 none
  };
  const BnArgs forms[] = {
      {"native_batch_norm", 5, 6, 7, 3},
      {"_native_batch_norm_legit", 5, 6, 7, 3},
      {"_native_batch_norm_legit.no_stats", 3, 4, 5, -1},
      {"_native_batch_norm_legit_no_training", -2, 5, 6, 3},
      {"_batch_norm_with_update", -1, 5, 6, 3},
      {"_batch_norm_no_update", -2, 5, 6, 3},
  };
  // In eval mode no statistics are saved: the CPU returns save_mean and
  // save_invstd empty, PyTorch's meta kernel [C].
  auto no_saved_stats = [](const CallArgs& a, std::vector<at::Tensor>& outs) {
    const c10::IValue* training = a.named("training");
    if (outs.size() >= 3 && (!training || !training->toBool()))
      for (int k : {1, 2}) outs[k] = at::empty({0}, outs[k].options());
  };
  for (const char* base :
       {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"})
    spec(base, {.fix_shapes = no_saved_stats});
  for (const BnArgs& f : forms) {
    BnArgs a = f;
    reg(a.name, [a](Ctx& c) -> V {
      bool training = a.training == -1 || (a.training >= 0 && c.flag(a.training));
      V r = batch_norm(c, training, c.f64(a.momentum), c.f64(a.eps), a.stats);
      for (int k = 3; k < c.num_outputs(); ++k) r.push_back(c.b.splat(0, c.out(k)));
      return r;
    });
  }
  // (grad_out, input, weight?, running_mean?, running_var?, save_mean?,
  //  save_invstd?, train, eps, output_mask)
  reg("native_batch_norm_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = in_as(c, 0, t), x = in_as(c, 1, t);
    std::vector<int64_t> axes = range(0, x.v.rank());
    axes.erase(axes.begin() + 1);
    double n = 1;
    for (int64_t a : axes) n *= static_cast<double>(x.v.shape()[a]);
    bool train = c.flag(7);
    Ex mean = channel(c, train ? 5 : 3, x.v, t);
    Ex invstd = train ? channel(c, 6, x.v, t) : (channel(c, 4, x.v, t) + c.f64(8)).un("rsqrt");
    Ex w = c.is_none(2) ? invstd.k(1) : channel(c, 2, x.v, t);
    Ex xhat = (x - mean) * invstd;
    auto mask = c.arg(9).toBoolList();
    std::vector<Ex> s = sums({g, g * xhat}, axes, true);
    Ex dx = train ? (g - s[0] / n - xhat * (s[1] / n)) * w * invstd : g * w * invstd;
    const Shape cs = {x.v.shape()[1]};
    return {mask.get(0) ? dx.v : zeros(c, 0).v,
            mask.get(1) ? c.b.reshape(s[1].v, cs) : zeros(c, 1).v,
            mask.get(2) ? c.b.reshape(s[0].v, cs) : zeros(c, 2).v};
  });
  // Same arguments (plus a trailing reserve), `update` in the training slot.
  reg("batch_norm_backward", *find_rule("native_batch_norm_backward"));
}

// Group norm views x as [N, G, rest] with mean/rstd [N, G, 1]; weight and
// bias are per channel of [N, C, HxW].
TPU_LOWERING(nn_group_norm) {
  // (input, weight?, bias?, N, C, HxW, group, eps) -> (out, mean, rstd)
  reg("native_group_norm", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Builder& b = c.b;
    int64_t n = c.i64(3), ch = c.i64(4), hw = c.i64(5), g = c.i64(6);
    Value x0 = b.convert(c.in(0), t);
    Ex x(b, b.reshape(x0, {n, g, ch / g * hw}));
    double cnt = static_cast<double>(ch / g * hw);
    Ex mean = sum(x, {2}, true) / cnt, d = x - mean;
    Ex rstd = (sum(d * d, {2}, true) / cnt + c.f64(7)).un("rsqrt");
    Ex y(b, b.reshape((d * rstd).v, {n, ch, hw}));
    if (!c.is_none(1)) y = y * Ex(b, b.reshape(b.convert(c.in(1), t), {ch, 1}));
    if (!c.is_none(2)) y = y + Ex(b, b.reshape(b.convert(c.in(2), t), {ch, 1}));
    return {b.reshape(y.v, x0.shape()), mean, rstd};
  });
  // (grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask)
  reg("native_group_norm_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Builder& b = c.b;
    int64_t n = c.i64(5), ch = c.i64(6), hw = c.i64(7), g = c.i64(8);
    Shape grouped{n, g, ch / g * hw}, chan{n, ch, hw};
    Value x0 = b.convert(c.in(1), t);
    Ex x(b, b.reshape(x0, grouped)), go(b, b.reshape(b.convert(c.in(0), t), grouped));
    Ex mean(b, b.reshape(b.convert(c.in(2), t), {n, g, 1}));
    Ex rstd(b, b.reshape(b.convert(c.in(3), t), {n, g, 1}));
    Ex xhat = (x - mean) * rstd;
    Ex gw = go;
    if (!c.is_none(4))
      gw = Ex(
          b,
          b.reshape(
              (Ex(b, b.reshape(go.v, chan)) * Ex(b, b.reshape(b.convert(c.in(4), t), {ch, 1}))).v,
              grouped));
    double cnt = static_cast<double>(ch / g * hw);
    std::vector<Ex> s = sums({gw, gw * xhat}, {2}, true);
    Ex dx = (gw - s[0] / cnt - xhat * (s[1] / cnt)) * rstd;
    auto mask = c.arg(9).toBoolList();
    Ex gc(b, b.reshape(go.v, chan)), xc(b, b.reshape(xhat.v, chan));
    std::vector<Ex> p = sums({gc * xc, gc}, {0, 2});
    return {mask.get(0) ? b.reshape(dx.v, x0.shape()) : zeros(c, 0).v,
            mask.get(1) ? p[0].v : zeros(c, 1).v, mask.get(2) ? p[1].v : zeros(c, 2).v};
  });
}

TPU_LOWERING(nn_dropout) {
  // (input, p, train?) -> (output, mask)
  reg("native_dropout", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t);
    bool train = c.is_none(2) || c.flag(2);
    if (!train || x.v.type.numel() == 0) return {x, c.b.splat(1, c.out(1))};
    double keep = 1.0 - c.f64(1);
    double scale = keep == 0 ? 0.0 : 1.0 / keep;
    Builder& b = c.b;
    Value state = c.rng_state(x.v.type.numel());
    Value bits = b.rng_bit_generator(state, Type{DType::U32, x.v.shape()}).second;
    // 24 random bits -> uniform in [0, 1), exact in f32.
    bits = b.binary("shift_right_logical", bits, b.splat(8, bits.type));
    Ex u = Ex(b, b.convert(bits, DType::F32)) * (1.0 / 16777216.0);
    Ex m = u.cmp(Cmp::LT, u.k(keep));
    return {where(m, x * scale, x.k(0)), m};
  });
  reg("native_dropout_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = in_as(c, 0, t), m = in_as(c, 1, t);
    return {g * m * c.f64(2)};
  });
}

// nll_loss on (N, C, ...) / (C) inputs: gathers the target class log-prob.
struct Nll {
  Ex x, tgt, w;  // x as (N, C, ...); tgt (N, 1, ...) clamped; w (N, 1, ...) zero where ignored
  Ex valid;      // (N, 1, ...): target is not ignore_index
};
Nll nll_prep(Ctx& c, int self_arg, int tgt_arg, int weight_arg, int ignore_arg) {
  DType t = compute_dtype(c.in(self_arg).dtype());
  Builder& b = c.b;
  Value x = b.convert(c.in(self_arg), t), tgt = b.convert(c.in(tgt_arg), DType::I64);
  if (x.rank() == 1) x = b.reshape(x, {1, x.shape()[0]});
  Shape ts = tgt.shape();
  ts.insert(ts.begin() + (ts.empty() ? 0 : 1), 1);
  if (x.rank() == 2 && ts.size() == 1) ts = {1, 1};
  tgt = b.reshape(tgt, ts);
  Ex target(b, tgt);
  Ex valid = target.cmp(Cmp::NE, target.k(static_cast<double>(c.i64(ignore_arg))));
  Ex safe = where(valid, target, target.k(0));
  Ex w = Ex(b, b.splat(1, Type{t, ts}));
  if (!c.is_none(weight_arg)) {
    Value wt = b.convert(c.in(weight_arg), t);
    Value flat = b.reshape(safe.v, {static_cast<int64_t>(Type{t, ts}.numel())});
    w = Ex(b, b.reshape(b.index_select(wt, flat, 0), ts));
  }
  w = where(valid, w, w.k(0));
  return {Ex(b, x), safe, w, valid};
}

V nll_forward(Ctx& c) {
  Nll p = nll_prep(c, 0, 1, 2, 4);
  Ex picked(c.b, c.b.take_along(p.x.v, p.tgt.v, 1));
  Ex loss = -picked * p.w;
  int64_t red = c.i64(3);
  Ex tw = sum_all(p.w);
  if (red == 0) return {loss, tw.k(0)};
  Ex s = sum_all(loss);
  return {red == 1 ? s / tw : s, tw};
}

// (grad_output, self, target, weight?, reduction, ignore_index, total_weight)
V nll_backward(Ctx& c) {
  Nll p = nll_prep(c, 1, 2, 3, 5);
  DType t = p.x.v.dtype();
  Builder& b = c.b;
  Ex g = in_as(c, 0, t);
  int64_t red = c.i64(4);
  Ex coef = -p.w;
  if (red == 0) {
    g = Ex(b, b.reshape(g.v, p.tgt.v.shape()));
  } else {
    g = Ex(b, b.reshape(g.v, {}));
    if (red == 1) g = g / Ex(b, b.reshape(in_as(c, 6, t).v, {}));
  }
  Ex cls(b, b.iota(Type{DType::I64, p.x.v.shape()}, 1));
  Ex hit = cls.cmp(Cmp::EQ, Ex(b, broadcast_to(b, p.tgt.v, p.x.v.shape())));
  // Ignored targets get no gradient, even when every target is ignored and
  // total_weight is 0 (0 * inf would be NaN).
  hit = hit.bin("and", Ex(b, broadcast_to(b, p.valid.v, p.x.v.shape())));
  return {where(hit, coef * g, p.x.k(0))};
}

TPU_LOWERING(nn_losses) {
  reg("nll_loss_forward", nll_forward);
  reg("nll_loss2d_forward", nll_forward);
  reg("nll_loss_backward", nll_backward);
  reg("nll_loss2d_backward", nll_backward);
  reg("mse_loss", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex d = in_as(c, 0, t) - in_as(c, 1, t);
    return {reduce_loss(d * d, c.i64(2))};
  });
  // (grad_output, self, target, reduction)
  reg("mse_loss_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex d = in_as(c, 1, t) - in_as(c, 2, t);
    Ex g = in_as(c, 0, t) * d * 2.0;
    if (c.i64(3) == 1) g = g / static_cast<double>(c.out(0).numel());
    return {g};
  });
  // (self, target, reduction, beta|delta): quadratic below the threshold.
  for (const char* n : {"smooth_l1_loss", "huber_loss"}) {
    bool huber = std::string(n) == "huber_loss";
    reg(n, [huber](Ctx& c) -> V {
      DType t = math_dtype(c);
      Ex d = (in_as(c, 0, t) - in_as(c, 1, t)).un("abs");
      double k = c.f64(3);
      Ex l = huber    ? where(d.cmp(Cmp::LT, d.k(k)), d * d * 0.5, (d - 0.5 * k) * k)
             : k == 0 ? d
                      : where(d.cmp(Cmp::LT, d.k(k)), d * d * (0.5 / k), d - 0.5 * k);
      return {reduce_loss(l, c.i64(2))};
    });
  }
  // (grad_output, self, target, reduction, beta|delta)
  for (const char* n : {"smooth_l1_loss_backward", "huber_loss_backward"}) {
    bool huber = std::string(n) == "huber_loss_backward";
    reg(n, [huber](Ctx& c) -> V {
      DType t = math_dtype(c);
      Ex g = in_as(c, 0, t), d = in_as(c, 1, t) - in_as(c, 2, t);
      if (c.i64(3) == 1) g = g / static_cast<double>(c.out(0).numel());
      double k = c.f64(4);
      Ex lin = where(d.cmp(Cmp::LT, d.k(0)), -g, g) * (huber ? k : 1.0);
      Ex quad = huber ? d * g : d * g / k;
      if (!huber && k == 0) return {where(d.cmp(Cmp::EQ, d.k(0)), d.k(0), lin)};
      return {where(d.un("abs").cmp(Cmp::LE, d.k(k)), quad, lin)};
    });
  }
  reg("l1_loss", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    return {reduce_loss((in_as(c, 0, t) - in_as(c, 1, t)).un("abs"), c.i64(2))};
  });
  // (self, target, weight?, reduction)
  reg("binary_cross_entropy", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t), y = in_as(c, 1, t);
    Ex lx = maximum(x.un("log"), x.k(-100)), l1x = maximum((1.0 - x).un("log"), x.k(-100));
    Ex l = -(y * lx + (1.0 - y) * l1x);
    if (!c.is_none(2)) l = l * in_as(c, 2, t);
    return {reduce_loss(l, c.i64(3))};
  });
  // (grad_output, self, target, weight?, reduction)
  reg("binary_cross_entropy_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex g = in_as(c, 0, t), x = in_as(c, 1, t), y = in_as(c, 2, t);
    Ex d = g * (x - y) / maximum((1.0 - x) * x, x.k(1e-12));
    if (!c.is_none(3)) d = d * in_as(c, 3, t);
    if (c.i64(4) == 1) d = d / static_cast<double>(c.out(0).numel());
    return {d};
  });
}

}  // namespace
}  // namespace torchtpu::lower
