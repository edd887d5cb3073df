// Extra ATen ops: glu, prelu, hard/soft shrink (with their backward ops) and
// reducing scatters (scatter_reduce, scatter with reduce=, index_reduce).
#include <string>
#include <utility>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

// Integer index as i64 with negative entries counted from the end of `size`.
Value wrap_index(Builder& b, Value idx, int64_t size) {
  Ex i(b, b.convert(idx, DType::I64));
  return where(i.cmp(Cmp::LT, i.k(0)), i + static_cast<double>(size), i);
}
Value at_least_1d(Builder& b, Value x) { return x.rank() == 0 ? b.reshape(x, {1}) : x; }

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

// Reduction of the src entries that a torch.scatter along `dim` sends to each
// position of an `xshape` tensor, plus a bool "some entry landed here" mask.
// stablehlo.scatter here only combines by add/replace, so max/min/prod are
// reduced densely over a one-hot [idx..., S] mask (S = xshape[dim]): memory
// idx.numel * S, fine for the small index tensors these ops get.
std::pair<Value, Value> scatter_dense(Builder& b, Value idx, Value src, int64_t dim,
                                      const Shape& xshape, Reducer r) {
  int64_t rank = idx.rank(), size = xshape[dim];
  src = b.slice(src, Shape(rank, 0), idx.shape(), {});
  Shape e = idx.shape();
  e.push_back(size);
  std::vector<int64_t> keep;
  for (int64_t d = 0; d < rank; ++d) keep.push_back(d);
  Value mask =
      b.compare(Cmp::EQ, b.broadcast_in_dim(idx, e, keep), b.iota(Type{DType::I64, e}, rank));
  Value init = reduce_init(b, r, src.dtype());
  Value vals = b.select(mask, b.broadcast_in_dim(src, e, keep), broadcast_to(b, init, e));
  Value acc = b.reduce(vals, init, {dim}, r);
  Value hit = b.reduce(mask, b.constant(0, DType::Bool), {dim}, Reducer::Or);
  // The target axis is last now; move it back to `dim` and pad to xshape.
  std::vector<int64_t> perm;
  for (int64_t d = 0; d < rank; ++d) perm.push_back(d < dim ? d : d == dim ? rank - 1 : d - 1);
  acc = b.transpose(acc, perm);
  hit = b.transpose(hit, perm);
  Shape zero(rank, 0), hi(rank, 0);
  for (int64_t d = 0; d < rank; ++d) hi[d] = xshape[d] - acc.shape()[d];
  acc = b.pad(acc, init, zero, hi, zero);
  hit = b.pad(hit, b.constant(0, DType::Bool), zero, hi, zero);
  return {acc, hit};
}

// torch.scatter_reduce(x, dim, idx, src, reduce, include_self) on values
// already rank >= 1, idx wrapped, src in x's dtype.
Value scatter_reduce(Builder& b, Value x, Value idx, Value src, int64_t dim,
                     const std::string& reduce, bool include_self) {
  Ex xe(b, x);
  if (reduce == "sum" || reduce == "mean") {
    Value sliced = b.slice(src, Shape(idx.rank(), 0), idx.shape(), {});
    Ex zeros(b, b.splat(0, x.type));
    Ex sum(b, b.scatter_along(zeros, idx, sliced, dim, true));
    Ex cnt(b, b.scatter_along(zeros, idx, b.splat(1, sliced.type), dim, true));
    Ex hit = cnt.cmp(Cmp::GT, cnt.k(0));
    if (reduce == "sum") return include_self ? xe + sum : where(hit, sum, xe);
    if (include_self) {
      sum = sum + xe;
      cnt = cnt + 1.0;
    }
    Ex mean = sum / where(hit, cnt, cnt.k(1));
    // Integer means round down, as torch's floor division.
    if (!is_float(x.dtype()))
      mean = (sum.to(DType::F64) / cnt.to(DType::F64)).un("floor").to(x.dtype());
    return include_self ? mean : where(hit, mean, xe);
  }
  Reducer r;
  if (reduce == "prod") {
    r = Reducer::Mul;
  } else if (reduce == "amax") {
    r = Reducer::Max;
  } else if (reduce == "amin") {
    r = Reducer::Min;
  } else {
    throw hlo::BuildError("[lower] scatter_reduce: unknown reduce '" + reduce + "'");
  }
  auto [acc_v, hit_v] = scatter_dense(b, idx, src, dim, x.shape(), r);
  Ex acc(b, acc_v), hit(b, hit_v);
  if (!include_self) return where(hit, acc, xe);
  Ex both = r == Reducer::Mul ? xe * acc : r == Reducer::Max ? maximum(xe, acc) : minimum(xe, acc);
  return where(hit, both, xe);
}

// (self, dim, index, src|value, reduce...) arguments as rank >= 1 values.
struct ScatterArgs {
  Value x, idx, src;
  int64_t dim;
};
ScatterArgs scatter_args(Ctx& c) {
  Builder& b = c.b;
  ScatterArgs a;
  a.x = at_least_1d(b, c.in(0));
  a.idx = at_least_1d(b, c.in(2));
  a.dim = wrap_dim(c.i64(1), a.x.rank());
  a.idx = wrap_index(b, a.idx, a.x.shape()[a.dim]);
  a.src = c.arg(3).isTensor() ? at_least_1d(b, b.convert(c.in(3), a.x.dtype()))
                              : broadcast_to(b, c.scalar(3, a.x.dtype()), a.idx.shape());
  return a;
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

TPU_LOWERING(extra_activations) {
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

TPU_LOWERING(extra_scatter) {
  // (self, dim, index, src, reduce, *, include_self)
  reg("scatter_reduce.two", [](Ctx& c) -> V {
    ScatterArgs a = scatter_args(c);
    return {scatter_reduce(c.b, a.x, a.idx, a.src, a.dim, c.arg(4).toStringRef(), c.flag(5))};
  });
  // (self, dim, index, src|value, *, reduce): reduce is "add" or "multiply",
  // always combining with self.
  for (const char* n : {"scatter.reduce", "scatter.value_reduce"}) {
    reg(n, [](Ctx& c) -> V {
      ScatterArgs a = scatter_args(c);
      const std::string& r = c.arg(4).toStringRef();
      if (r != "add" && r != "multiply")
        throw hlo::BuildError("[lower] scatter: unknown reduce '" + r + "'");
      return {scatter_reduce(c.b, a.x, a.idx, a.src, a.dim, r == "add" ? "sum" : "prod", true)};
    });
  }
  // (self, dim, index, source, reduce, *, include_self): index is 1-D and
  // names rows of `dim`, so it is a scatter with the index spread over source.
  reg("index_reduce", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0));
    int64_t dim = wrap_dim(c.i64(1), x.rank());
    Value src = at_least_1d(b, b.convert(c.in(3), x.dtype()));
    Value idx = wrap_index(b, c.in(2), x.shape()[dim]);
    idx = b.broadcast_in_dim(b.reshape(idx, {src.shape()[dim]}), src.shape(), {dim});
    return {scatter_reduce(b, x, idx, src, dim, c.arg(4).toStringRef(), c.flag(5))};
  });
}

TPU_LOWERING(extra_embedding_bag) {
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
}

}  // namespace
}  // namespace torchtpu::lower
