// Indexing ops: index_select, gather/scatter, advanced indexing (index.Tensor,
// index_put) with integer index tensors.
#include <algorithm>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using V = std::vector<Value>;

std::vector<int64_t> iota_vec(int64_t n) {
  std::vector<int64_t> r(n);
  for (int64_t i = 0; i < n; ++i) r[i] = i;
  return r;
}

Value at_least_1d(Builder& b, Value x) { return x.rank() == 0 ? b.reshape(x, {1}) : x; }

// Advanced indexing plan: x transposed to [indexed dims..., other dims...]
// with the indexed dims flattened into one, and flat row positions.
struct IndexPlan {
  std::vector<int64_t> perm;  // transpose of x putting indexed dims first
  Shape rest;                 // sizes of the other dims, in order
  int64_t rows = 1;           // product of the indexed dim sizes
  Shape bshape;               // broadcast shape of the index tensors
  Value pos;                  // i64 [bshape] flat row positions
  int64_t front = 0;          // where torch puts the index dims in the result
};

IndexPlan plan_index(Builder& b, Value x, const std::vector<Value>& idx) {
  IndexPlan p;
  std::vector<int64_t> dims;
  for (size_t d = 0; d < idx.size(); ++d) {
    if (!idx[d].valid()) continue;
    if (idx[d].dtype() == DType::Bool)
      throw hlo::BuildError("[lower] index with a bool mask has a data-dependent shape");
    dims.push_back(static_cast<int64_t>(d));
    p.bshape = broadcast_shapes(p.bshape, idx[d].shape());
  }
  bool adjacent = !dims.empty() && dims.back() - dims.front() + 1 == (int64_t)dims.size();
  p.front = adjacent ? dims.front() : 0;
  p.perm = dims;
  for (int64_t d = 0; d < x.rank(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
      p.perm.push_back(d);
      p.rest.push_back(x.shape()[d]);
    }
  Ex pos(b, b.splat(0, Type{DType::I64, p.bshape}));
  for (int64_t d : dims) {
    int64_t size = x.shape()[d];
    Ex i(b, broadcast_to(b, wrap_index(b, idx[d], size), p.bshape));
    pos = pos * static_cast<double>(size) + i;
    p.rows *= size;
  }
  p.pos = pos;
  return p;
}
Value flat_rows(Builder& b, Value x, const IndexPlan& p) {
  Shape s{p.rows};
  s.insert(s.end(), p.rest.begin(), p.rest.end());
  return b.reshape(b.transpose(x, p.perm), s);
}
// Permutation from [B..., rest...] to torch's result order.
std::vector<int64_t> result_perm(const IndexPlan& p) {
  int64_t nb = static_cast<int64_t>(p.bshape.size()), nr = static_cast<int64_t>(p.rest.size());
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < p.front; ++i) perm.push_back(nb + i);
  for (int64_t i = 0; i < nb; ++i) perm.push_back(i);
  for (int64_t i = p.front; i < nr; ++i) perm.push_back(nb + i);
  return perm;
}

Value index_tensor(Builder& b, Value x, const std::vector<Value>& idx) {
  IndexPlan p = plan_index(b, x, idx);
  int64_t n = Type{DType::I64, p.bshape}.numel();
  Value rows = b.index_select(flat_rows(b, x, p), b.reshape(p.pos, {n}), 0);
  Shape s = p.bshape;
  s.insert(s.end(), p.rest.begin(), p.rest.end());
  return b.transpose(b.reshape(rows, s), result_perm(p));
}

Value index_put(Builder& b, Value x, const std::vector<Value>& idx, Value vals, bool acc) {
  IndexPlan p = plan_index(b, x, idx);
  int64_t n = Type{DType::I64, p.bshape}.numel(), rn = Type{DType::I64, p.rest}.numel();
  // Values broadcast to the indexing result (torch order), then moved to [B..., rest...].
  Shape res = p.bshape;
  res.insert(res.end(), p.rest.begin(), p.rest.end());
  std::vector<int64_t> rp = result_perm(p), inv(rp.size());
  Shape torch_shape;
  for (int64_t d : rp) torch_shape.push_back(res[d]);
  for (size_t i = 0; i < rp.size(); ++i) inv[rp[i]] = static_cast<int64_t>(i);
  vals = b.transpose(broadcast_to(b, b.convert(vals, x.dtype()), torch_shape), inv);
  vals = b.reshape(vals, {n, rn});
  Value rows = b.reshape(flat_rows(b, x, p), {p.rows, rn});
  Value out = b.scatter_slices(rows, b.reshape(p.pos, {n}), vals, 0, acc);
  Shape ts;
  for (int64_t d : p.perm) ts.push_back(x.shape()[d]);
  std::vector<int64_t> back(p.perm.size());
  for (size_t i = 0; i < p.perm.size(); ++i) back[p.perm[i]] = static_cast<int64_t>(i);
  return b.transpose(b.reshape(out, ts), back);
}

// index_put with one bool mask over dims [d, d + k) of x and no other index:
// the i-th true position takes row i of the values (or the one row they
// broadcast from), so the output shape is static even though the count is not.
Value index_put_mask(Builder& b, Value x, int64_t d, Value mask, Value vals, bool acc) {
  int64_t k = mask.rank();
  Shape pre(x.shape().begin(), x.shape().begin() + d),
      post(x.shape().begin() + d + k, x.shape().end());
  int64_t rows = Type{DType::Bool, mask.shape()}.numel();
  Shape xs = pre;
  xs.push_back(rows);
  xs.insert(xs.end(), post.begin(), post.end());
  Value xf = b.reshape(x, xs);
  int64_t at = static_cast<int64_t>(pre.size());
  // Values broadcast to torch's result shape [pre..., count, post...].
  Value v = b.convert(vals, x.dtype());
  Shape vs = v.shape();
  int64_t from_end = static_cast<int64_t>(post.size());
  int64_t count = static_cast<int64_t>(vs.size()) > from_end ? vs[vs.size() - 1 - from_end] : 1;
  Shape target = pre;
  target.push_back(count);
  target.insert(target.end(), post.begin(), post.end());
  v = broadcast_to(b, v, target);
  Value m = b.reshape(mask, {rows});
  if (count != 1) {
    Ex cnt(b, b.convert(m, DType::I64));
    Ex pos(b, b.reduce_window(cnt.v, b.constant_int(0, DType::I64), hlo::Reducer::Add, {rows}, {1},
                              {rows - 1}, {0}));
    pos = maximum(pos - 1.0, pos.k(0));
    v = b.take_along(v, b.broadcast_in_dim(pos.v, xs, {at}), at);
  } else {
    v = broadcast_to(b, v, xs);
  }
  Value mb = b.broadcast_in_dim(m, xs, {at});
  Ex out = acc ? Ex(b, xf) + where(Ex(b, mb), Ex(b, v), Ex(b, xf).k(0))
               : where(Ex(b, mb), Ex(b, v), Ex(b, xf));
  return b.reshape(out.v, x.shape());
}

// Where each value goes in the sequence along seq's last dim (a 1-D sequence
// serves every value), by torch's binary search, step for step: right of
// an entry unless it is >= the value (> with `right`), so a NaN entry sends the
// search right and a NaN value ends past every entry. One gather per halving;
// comparing every pair took 3 s for 64 x 4096 values in rows of 4096.
Value insertion_points(Builder& b, Value seq, Value vals, bool right) {
  DType t = promote(seq.dtype(), vals.dtype());
  Value v = b.convert(vals, t), s = b.convert(seq, t);
  const int64_t m = s.shape().back();
  const Shape out = v.shape();
  const bool batched = s.rank() > 1;
  const int64_t rows = batched ? s.type.numel() / m : 1;
  if (batched) {
    s = b.reshape(s, {rows, m});
    v = b.reshape(v, {rows, v.type.numel() / rows});
  } else {
    v = b.reshape(v, {v.type.numel()});
  }
  Ex ve(b, v);
  const Type it{DType::I64, v.shape()};
  Ex lo(b, b.splat(0, it)), hi(b, b.splat(static_cast<double>(m), it));
  for (int64_t span = m; span > 0; span /= 2) {
    Ex mid = (lo + hi).bin("shift_right_logical", lo.k(1));
    Value at = minimum(mid, mid.k(static_cast<double>(m - 1))).v;
    Ex sm(b, batched ? b.take_along(s, at, 1) : b.gather_flat(s, at));
    Ex stop = right ? sm.cmp(Cmp::GT, ve) : sm.cmp(Cmp::GE, ve);
    Ex go = stop.un("not").bin("and", mid.cmp(Cmp::LT, hi));
    lo = where(go, mid + 1.0, lo);
    hi = where(go, hi, mid);
  }
  return b.reshape(lo.v, out);
}

TPU_LOWERING(index_ops) {
  // Debug Eager checks every index along `dim` first (XLA clamps silently).
  // Only index_fill takes negative indices; the rules below leave them out of
  // the program (a wrap recomputed per gathered element slowed index_select 1.6x).
  for (const char* base : {"index_select", "gather", "scatter", "scatter_add", "index_add",
                           "index_copy", "scatter_reduce", "index_reduce"})
    spec(base, {.index_checks = {{IndexCheck::AlongDim, 0, 1, 2}}});
  spec("index_fill", {.index_checks = {{IndexCheck::AlongDim, 0, 1, 2, true}}});
  for (const char* base : {"index", "index_put", "_index_put_impl"})
    spec(base, {.index_checks = {{IndexCheck::EachDim, 0, -1, 1, true}}, .mask_index_list = 1});
  // (self, dim, index)
  reg("index_select", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0));
    int64_t dim = wrap_dim(c.i64(1), x.rank());
    Value idx = c.in(2);
    return {b.index_select(x, b.reshape(idx, {idx.type.numel()}), dim)};
  });
  // (self, dim, index, *, sparse_grad)
  reg("gather", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0)), idx = at_least_1d(b, c.in(2));
    int64_t dim = wrap_dim(c.i64(1), x.rank());
    return {b.take_along(x, idx, dim)};
  });
  // (self, dim, index, src|value)
  for (const char* n : {"scatter.src", "scatter.value", "scatter_add"}) {
    bool add = std::string(n) == "scatter_add";
    reg(n, [add](Ctx& c) -> V {
      Builder& b = c.b;
      Value x = at_least_1d(b, c.in(0)), idx = at_least_1d(b, c.in(2));
      int64_t dim = wrap_dim(c.i64(1), x.rank());
      Value src = c.arg(3).isTensor() ? at_least_1d(b, b.convert(c.in(3), x.dtype()))
                                      : broadcast_to(b, c.scalar(3, x.dtype()), idx.shape());
      return {b.scatter_along(x, idx, src, dim, add)};
    });
  }
  // (self, dim, index, source, *, alpha) / (self, dim, index, source)
  for (const char* n : {"index_add", "index_copy"}) {
    bool add = std::string(n) == "index_add";
    reg(n, [add](Ctx& c) -> V {
      Builder& b = c.b;
      Value x = at_least_1d(b, c.in(0));
      int64_t dim = wrap_dim(c.i64(1), x.rank());
      Value src = at_least_1d(b, b.convert(c.in(3), x.dtype()));
      if (add) src = Ex(b, src) * Ex(b, c.scalar(4, x.dtype()));
      Value idx = c.in(2);
      return {b.scatter_slices(x, b.reshape(idx, {idx.type.numel()}), src, dim, add)};
    });
  }
  // (self, dim, index, value): rows of `dim` named by index are set to value.
  for (const char* n : {"index_fill.int_Scalar", "index_fill.int_Tensor"}) {
    reg(n, [](Ctx& c) -> V {
      Builder& b = c.b;
      Value x = at_least_1d(b, c.in(0));
      int64_t dim = wrap_dim(c.i64(1), x.rank()), size = x.shape()[dim];
      Value idx = wrap_index(b, c.in(2), size);
      int64_t k = idx.type.numel();
      idx = b.reshape(idx, {1, k});
      Ex rows(b, b.iota(Type{DType::I64, {size, k}}, 0));
      Ex hit = rows.cmp(Cmp::EQ, Ex(b, broadcast_to(b, idx, {size, k})));
      Value mask = b.reduce(hit.v, b.constant(0, DType::Bool), {1}, hlo::Reducer::Or);
      mask = b.broadcast_in_dim(mask, x.shape(), {dim});
      Value v = c.arg(3).isTensor() ? b.convert(c.in(3), x.dtype()) : c.scalar(3, x.dtype());
      return {where(Ex(b, mask), Ex(b, v), Ex(b, x))};
    });
  }
  // searchsorted.Tensor(sorted_sequence, self, *, out_int32, right, side?, sorter?):
  // the insertion point is how many sequence entries sort before each value.
  reg("searchsorted.Tensor", [](Ctx& c) -> V {
    bool right = c.flag(3) || (!c.is_none(4) && c.arg(4).toStringRef() == "right");
    if (c.out(0).numel() == 0 || c.in(0).type.numel() == 0) return {c.b.splat(0, c.out(0))};
    Value seq = c.in(0);
    if (!c.is_none(5)) {  // sorter: the sequence in the order it gives
      Value srt = wrap_index(c.b, c.in(5), seq.shape().back());
      seq = c.b.take_along(seq, srt, seq.rank() - 1);
    }
    return {insertion_points(c.b, seq, c.in(1), right)};
  });
  // bucketize.Tensor(self, boundaries, *, out_int32, right)
  reg("bucketize.Tensor",
      [](Ctx& c) -> V { return {insertion_points(c.b, c.in(1), c.in(0), c.flag(3))}; });
  reg("index.Tensor", [](Ctx& c) -> V { return {index_tensor(c.b, c.in(0), c.list(1))}; });
  // (self, indices, values, accumulate[, unsafe])
  for (const char* n : {"index_put", "_index_put_impl"}) {
    reg(n, [](Ctx& c) -> V {
      std::vector<Value> idx = c.list(1);
      int valid = 0, mask_at = -1;
      for (size_t d = 0; d < idx.size(); ++d)
        if (idx[d].valid()) {
          ++valid;
          if (idx[d].dtype() == DType::Bool) mask_at = static_cast<int>(d);
        }
      if (valid == 1 && mask_at >= 0)
        return {index_put_mask(c.b, c.in(0), mask_at, idx[mask_at], c.in(2), c.flag(3))};
      return {index_put(c.b, c.in(0), idx, c.in(2), c.flag(3))};
    });
  }
}

}  // namespace
}  // namespace torchtpu::lower
