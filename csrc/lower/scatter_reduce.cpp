// Reducing scatters: scatter_reduce, scatter with reduce= and index_reduce (sum,
// mean, prod, amax, amin; with or without self's values).
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

Value at_least_1d(Builder& b, Value x) { return x.rank() == 0 ? b.reshape(x, {1}) : x; }

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
  a.src = c.arg(3).isTensor() ? at_least_1d(b, b.convert(c.in(3), a.x.dtype()))
                              : broadcast_to(b, c.scalar(3, a.x.dtype()), a.idx.shape());
  return a;
}

TPU_LOWERING(scatter_reduce) {
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
    Value idx = b.broadcast_in_dim(b.reshape(c.in(2), {src.shape()[dim]}), src.shape(), {dim});
    return {scatter_reduce(b, x, idx, src, dim, c.arg(4).toStringRef(), c.flag(5))};
  });
}

}  // namespace
}  // namespace torchtpu::lower
