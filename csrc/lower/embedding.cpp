// Embedding ops: embedding's backward and embedding_bag (sum, mean and max bags over
// 1-D indices and offsets, with per-sample weights) with its backward ops.
#include <algorithm>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

// Runs the rule registered under `name` (looked up at call time, so the
// registration order of files does not matter).
Rule alias(const std::string& name) {
  return [name](Ctx& c) -> V { return (*find_rule(name))(c); };
}

// (grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
TPU_LOWERING(nn_embedding) {
  // (grad, indices, num_weights, ...): indices must be below num_weights.
  spec("embedding_dense_backward", {.index_checks = {{IndexCheck::SizeArg, 2, -1, 1}}});
  reg("embedding_dense_backward", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Builder& b = c.b;
    Value g = b.convert(c.in(0), t), idx = b.convert(c.in(1), DType::I64);
    int64_t m = idx.type.numel(), d = g.type.numel() / std::max<int64_t>(m, 1);
    int64_t nw = c.i64(2), pad = c.i64(3);
    g = b.reshape(g, {m, d});
    idx = b.reshape(idx, {m});
    Ex gi(b, g), ix(b, idx);
    if (pad >= 0) gi = where(Ex(b, b.reshape(ix.cmp(Cmp::NE, ix.k(pad)).v, {m, 1})), gi, gi.k(0));
    if (c.flag(4)) {
      Value ones = b.splat(1, Type{t, {m}});
      Value cnt = b.scatter_along(b.splat(0, Type{t, {nw}}), idx, ones, 0, true);
      Ex per(b, b.reshape(b.index_select(cnt, idx, 0), {m, 1}));
      gi = gi / per;
    }
    return {b.scatter_slices(b.splat(0, Type{t, {nw, d}}), idx, gi.v, 0, true)};
  });
}

// ---- embedding_bag (mode 0 sum, 1 mean, 2 max) over 1-D indices/offsets.

// Bag of each index and whether it counts (not padding, before the last
// offset); `bags` is the output row count (offsets beyond it are the
// include_last_offset end marker).
struct Bags {
  Value idx;    // i64 [N]
  Value bag;    // i64 [N]
  Value valid;  // bool [N]
  Value count;  // i64 [B], counted indices per bag
  int64_t n, bags;
};
Bags plan_bags(Builder& b, Value indices, Value offsets, int64_t bags, int64_t padding_idx) {
  Bags p;
  p.n = indices.type.numel();
  p.bags = bags;
  p.idx = b.reshape(b.convert(indices, DType::I64), {p.n});
  Value off = b.reshape(b.convert(offsets, DType::I64), {offsets.type.numel()});
  Ex pos(b, b.iota(Type{DType::I64, {p.n}}, 0));
  Ex valid = pos.cmp(Cmp::GE, pos.k(0));
  if (offsets.type.numel() > bags) {  // entries past the end marker are ignored
    Ex end(b, broadcast_to(b, b.slice(off, {bags}, {bags + 1}, {}), {p.n}));
    valid = pos.cmp(Cmp::LT, end);
  }
  // bag[i] = (number of bag starts <= i) - 1; empty bags start where the next does.
  Value starts = b.broadcast_in_dim(b.slice(off, {0}, {bags}, {}), {p.n, bags}, {1});
  Value le =
      b.convert(b.compare(Cmp::LE, starts, b.iota(Type{DType::I64, {p.n, bags}}, 0)), DType::I64);
  p.bag = Ex(b, b.reduce(le, b.constant(0, DType::I64), {1}, Reducer::Add)) - 1.0;
  if (padding_idx >= 0) {
    Ex i(b, p.idx);
    valid = Ex(b, b.binary("and", valid, i.cmp(Cmp::NE, i.k(static_cast<double>(padding_idx)))));
  }
  p.valid = valid;
  p.count = b.scatter_flat(b.splat(0, Type{DType::I64, {bags}}), p.bag,
                           b.convert(p.valid, DType::I64), true);
  return p;
}
// v as `t` when it has t's element count, else zeros (outputs torch leaves unset).
Value fit(Builder& b, Value v, const Type& t) {
  return v.type.numel() == t.numel() && t.numel() > 0 ? v : b.splat(0, t);
}
// Per-index factor: validity, per-sample weight and 1/bag size (mean), as
// [N, 1] in dtype t.
Ex index_scale(Ctx& c, const Bags& p, DType t, int mode, int psw_arg) {
  Builder& b = c.b;
  Ex s(b, b.convert(p.valid, t));
  if (!c.is_none(psw_arg)) s = s * Ex(b, b.reshape(b.convert(c.in(psw_arg), t), {p.n}));
  if (mode == 1) {
    Ex cnt(b, b.convert(b.gather_flat(p.count, p.bag), t));
    s = s / maximum(cnt, cnt.k(1));
  }
  return Ex(b, b.reshape(s, {p.n, 1}));
}

TPU_LOWERING(embedding_bag) {
  // (weight, indices, offsets, scale_grad_by_freq, mode, sparse,
  //  per_sample_weights, include_last_offset, padding_idx)
  //   -> (out, offset2bag, bag_size, max_indices)
  reg("_embedding_bag", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value w = c.in(0);
    int mode = static_cast<int>(c.i64(4));
    int64_t bags = c.out(0).shape[0], d = w.shape()[1];
    Bags p = plan_bags(b, c.in(1), c.in(2), bags, c.i64(8));
    Value rows = b.index_select(w, p.idx, 0);  // [N, D]
    DType t = compute_dtype(w.dtype());
    Ex cnt(b, p.count);
    Value out, max_idx = p.count;
    if (mode != 2) {
      Ex contrib = Ex(b, b.convert(rows, t)) *
                   Ex(b, broadcast_to(b, index_scale(c, p, t, mode, 6), {p.n, d}));
      Value bag = b.broadcast_in_dim(p.bag, {p.n, d}, {0});
      out = b.scatter_along(b.splat(0, Type{t, {bags, d}}), bag, contrib, 0, true);
    } else {
      // Dense [B, N, D] max: small bags only, but exact and with torch's
      // first-max tie rule (reduce_arg picks the smallest position).
      Shape e{bags, p.n, d};
      Value in_bag =
          b.compare(Cmp::EQ, b.broadcast_in_dim(p.bag, e, {1}), b.iota(Type{DType::I64, e}, 0));
      in_bag = b.binary("and", in_bag, b.broadcast_in_dim(p.valid, e, {1}));
      Value vals = b.select(in_bag, b.broadcast_in_dim(rows, e, {1, 2}),
                            broadcast_to(b, reduce_init(b, Reducer::Max, w.dtype()), e));
      auto [mx, pos] = b.reduce_arg(vals, 1, true);
      Ex some(b, b.broadcast_in_dim(cnt.cmp(Cmp::GT, cnt.k(0)), {bags, d}, {0}));
      out = where(some, Ex(b, mx), Ex(b, b.splat(0, mx.type)));
      Ex mi(b, b.gather_flat(p.idx, pos));
      max_idx = where(some, mi, mi.k(0));
    }
    return {out, fit(b, p.bag, c.out(1)), fit(b, p.count, c.out(2)), fit(b, max_idx, c.out(3))};
  });
  // (grad, indices, offsets, offset2bag, bag_size, maximum_indices,
  //  num_weights, scale_grad_by_freq, mode, sparse, per_sample_weights,
  //  padding_idx): bags are recomputed from offsets (offset2bag may be empty).
  reg("_embedding_bag_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    // torch CPU's scale_grad_by_freq gradients are not 1/frequency scaled
    // (checked: a repeated index gets 2x), so that option is left out.
    if (c.flag(7) || c.flag(9))
      throw hlo::BuildError(
          "[lower] _embedding_bag_backward: scale_grad_by_freq and sparse are not supported");
    Value g = c.in(0);
    int64_t bags = g.shape()[0], d = g.shape()[1], num = c.i64(6);
    int mode = static_cast<int>(c.i64(8));
    Bags p = plan_bags(b, c.in(1), c.in(2), bags, c.i64(11));
    DType t = compute_dtype(c.out(0).dtype);
    Ex ge(b, b.convert(g, t));
    Value zeros = b.splat(0, Type{t, {num, d}});
    if (mode == 2) {
      Ex cnt(b, p.count);
      Ex some(b, b.broadcast_in_dim(cnt.cmp(Cmp::GT, cnt.k(0)), {bags, d}, {0}));
      Value mi = b.convert(c.in(5), DType::I64);
      return {b.scatter_along(zeros, mi, where(some, ge, ge.k(0)), 0, true)};
    }
    Ex rows(b, b.index_select(ge, p.bag, 0));  // grad of each index's bag, [N, D]
    Ex contrib = rows * Ex(b, broadcast_to(b, index_scale(c, p, t, mode, 10), {p.n, d}));
    return {b.scatter_slices(zeros, p.idx, contrib.v, 0, true)};
  });
  // (grad, weight, indices, offsets, offset2bag, mode, padding_idx): the
  // gradient of each sample weight is its row dotted with its bag's grad.
  reg("_embedding_bag_per_sample_weights_backward", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value g = c.in(0);
    Bags p = plan_bags(b, c.in(2), c.in(3), g.shape()[0], c.i64(6));
    DType t = compute_dtype(c.out(0).dtype);
    Ex rows(b, b.convert(b.index_select(c.in(1), p.idx, 0), t));
    Ex gb(b, b.index_select(b.convert(g, t), p.bag, 0));
    Value dot = b.reduce(rows * gb, b.constant(0, t), {1}, Reducer::Add);
    return {where(Ex(b, p.valid), Ex(b, dot), Ex(b, b.splat(0, dot.type)))};
  });
  reg("_embedding_bag_forward_only", alias("_embedding_bag"));
}

}  // namespace
}  // namespace torchtpu::lower
