// Margin losses over class scores [N, C] (1-d and 0-d inputs are one row):
// multi_margin_loss and multilabel_margin_loss with their backward ops.
#include <string>
#include <tuple>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

// Scores as [N, C] in the compute dtype.
Ex rows2(Ctx& c, int i, DType t) {
  Value x = c.b.convert(c.in(i), t);
  int64_t n = x.rank() == 2 ? x.shape()[0] : 1, ch = x.rank() == 0 ? 1 : x.shape().back();
  return Ex(c.b, c.b.reshape(x, {n, ch}));
}
Ex col(const Ex& x) {  // [N] -> [N, 1]
  return Ex(*x.b, x.b->reshape(x.v, {x.v.shape()[0], 1}));
}
Ex sum_dim(const Ex& x, int64_t d) { return Ex(*x.b, reduce_sum(*x.b, x.v, {d}, false)); }
// Per-row losses [N] reduced as torch: 0 none, 1 mean, 2 sum.
Ex reduce_rows(const Ex& l, int64_t reduction) {
  if (reduction == 0) return l;
  Ex s = sum_dim(l, 0);
  return reduction == 1 ? s / static_cast<double>(l.v.shape()[0]) : s;
}
// Upstream gradient per row [N, 1].
Ex row_grad(Ctx& c, int i, int64_t n, int64_t reduction, DType t) {
  Ex g(c.b, c.b.convert(c.in(i), t));
  if (reduction == 0) return Ex(c.b, c.b.reshape(g.v, {n, 1}));
  g = Ex(c.b, c.b.reshape(g.v, {}));
  if (reduction == 1) g = g / static_cast<double>(n);
  return Ex(c.b, broadcast_to(c.b, g.v, {n, 1}));
}

// multi_margin terms [N, C]: max(0, margin - x[y] + x[i])^p for i != y
// (before weight and 1/C), the hinge argument z and the target one-hot.
struct MultiMargin {
  Ex z, active, onehot, w;
};
MultiMargin multi_margin(Ctx& c, const Ex& x, int target_arg, int margin_arg, int weight_arg,
                         DType t) {
  Builder& b = c.b;
  int64_t n = x.v.shape()[0], ch = x.v.shape()[1];
  Ex y(b, b.reshape(b.convert(c.in(target_arg), DType::I64), {n, 1}));
  Ex onehot = Ex(b, b.iota(Type{DType::I64, {n, ch}}, 1)).cmp(Cmp::EQ, y);
  Ex xy(b, b.take_along(x.v, y.v, 1));  // [N, 1]
  Ex margin(b, c.scalar(margin_arg, t));
  Ex z = margin - xy + x;
  Ex active = z.cmp(Cmp::GT, z.k(0)).bin("and", onehot.un("not"));
  Ex w = x.k(1);
  if (!c.is_none(weight_arg)) {
    Value wt = b.convert(c.in(weight_arg), t);
    w = Ex(b, b.take_along(b.broadcast_in_dim(wt, {n, ch}, {1}), y.v, 1));  // [N, 1]
  }
  return {z, active, onehot, w};
}

// Unreduced margin losses of a 1-D input are 0-dim on the CPU, not [1] as
// PyTorch's meta kernels say, when the target is 0-dim (multi_margin) or 1-D
// (multilabel_margin).
template <int kMaxTargetDim>
void scalar_loss_of_a_row(const CallArgs& a, std::vector<at::Tensor>& outs) {
  const c10::IValue* reduction = a.named("reduction");
  const c10::IValue& target = a[1];
  if (!outs.empty() && outs[0].dim() == 1 && outs[0].size(0) == 1 && reduction &&
      reduction->toInt() == 0 && target.isTensor() && target.toTensor().dim() <= kMaxTargetDim)
    outs[0] = outs[0].reshape({});
}

TPU_LOWERING(margin_losses) {
  spec("multi_margin_loss", {.fix_shapes = scalar_loss_of_a_row<0>});
  spec("multilabel_margin_loss_forward", {.fix_shapes = scalar_loss_of_a_row<1>});
  // (self, target, p, margin, weight?, reduction)
  reg("multi_margin_loss", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex x = rows2(c, 0, t);
    int64_t ch = x.v.shape()[1];
    MultiMargin m = multi_margin(c, x, 1, 3, 4, t);
    Ex p(c.b, c.scalar(2, t));
    Ex terms = where(m.active, m.z.bin("power", p), m.z.k(0)) * m.w;
    return {reduce_rows(sum_dim(terms, 1) / static_cast<double>(ch), c.i64(5))};
  });
  // (grad_output, self, target, p, margin, weight?, reduction)
  reg("multi_margin_loss_backward", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex x = rows2(c, 1, t);
    int64_t n = x.v.shape()[0], ch = x.v.shape()[1];
    MultiMargin m = multi_margin(c, x, 2, 4, 5, t);
    Ex p(c.b, c.scalar(3, t));
    Ex h = where(m.active, p * m.z.bin("power", p - 1.0), m.z.k(0)) * m.w / static_cast<double>(ch);
    h = h * row_grad(c, 0, n, c.i64(6), t);
    Ex gy = Ex(c.b, c.b.reshape(sum_dim(h, 1).v, {n, 1}));
    return {where(m.onehot, -gy, h)};
  });
  // (self, target, reduction) -> (output, is_target): targets are the labels
  // before the first -1 of each row.
  auto multilabel = [](Ctx& c, const Ex& x, int target_arg, Ex* is_target_out) {
    Builder& b = c.b;
    int64_t n = x.v.shape()[0], ch = x.v.shape()[1];
    Ex tg(b, b.reshape(b.convert(c.in(target_arg), DType::I64), {n, ch}));
    Ex ok = tg.cmp(Cmp::NE, tg.k(-1)).to(DType::I64);
    Ex valid = Ex(b, b.reduce_window(ok.v, b.constant_int(1, DType::I64), Reducer::Min, {1, ch},
                                     {1, 1}, {0, ch - 1}, {0, 0}))
                   .cmp(Cmp::EQ, ok.k(1));  // [N, K]
    Ex safe = where(valid, tg, tg.k(0));
    Type kt{DType::I64, {n, ch, ch}};
    Ex hit = Ex(b, b.iota(kt, 2)).cmp(Cmp::EQ, Ex(b, b.reshape(safe.v, {n, ch, 1})));
    hit = hit.bin("and", Ex(b, b.reshape(valid.v, {n, ch, 1})));  // [N, K, C] one-hots
    Ex is_t(b, b.reduce(hit.v, b.constant(0, DType::Bool), {1}, Reducer::Or));  // [N, C]
    Ex xy(b, b.take_along(x.v, safe.v, 1));                                     // [N, K]
    Ex z = 1.0 - Ex(b, b.reshape(xy.v, {n, ch, 1})) + Ex(b, b.reshape(x.v, {n, 1, ch}));
    Ex active = z.cmp(Cmp::GT, z.k(0))
                    .bin("and", Ex(b, b.reshape(valid.v, {n, ch, 1})))
                    .bin("and", Ex(b, b.reshape(is_t.v, {n, 1, ch})).un("not"));
    *is_target_out = is_t;
    return std::make_tuple(z, active, hit);
  };
  reg("multilabel_margin_loss_forward", [multilabel](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex x = rows2(c, 0, t);
    int64_t ch = x.v.shape()[1];
    Ex is_t = x;
    auto [z, active, hit] = multilabel(c, x, 1, &is_t);
    Ex l = sum_dim(sum_dim(where(active, z, z.k(0)), 2), 1) / static_cast<double>(ch);
    return {reduce_rows(l, c.i64(2)), is_t.to(t)};
  });
  // (grad_output, self, target, reduction, is_target)
  reg("multilabel_margin_loss_backward", [multilabel](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex x = rows2(c, 1, t);
    int64_t n = x.v.shape()[0], ch = x.v.shape()[1];
    Ex is_t = x;
    auto [z, active, hit] = multilabel(c, x, 2, &is_t);
    Ex g = row_grad(c, 0, n, c.i64(3), t) / static_cast<double>(ch);  // [N, 1]
    Ex h = active.to(t) * Ex(c.b, c.b.reshape(g.v, {n, 1, 1}));       // [N, K, C]
    Ex up = sum_dim(h, 1);                                            // to the non-targets
    Ex per_k(c.b, c.b.reshape(sum_dim(h, 2).v, {n, ch, 1}));          // from each target
    Ex down = sum_dim(hit.to(t) * per_k, 1);
    return {up - down};
  });
}

}  // namespace
}  // namespace torchtpu::lower
