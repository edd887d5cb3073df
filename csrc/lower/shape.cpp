// Shape-changing ops that copy data: cat/stack, triangles, flip/roll,
// repeat, padding, sort/topk, channel_shuffle. (Pure view ops are handled by the executor.)
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using V = std::vector<Value>;

Value at_least_1d(Builder& b, Value x) { return x.rank() == 0 ? b.reshape(x, {1}) : x; }

// Values and int64 indices of a stable sort along dim.
V sort_with_indices(Builder& b, Value x, int64_t dim, bool descending) {
  x = at_least_1d(b, x);
  dim = wrap_dim(dim, x.rank());
  auto [values, indices] = b.sort_indexed(x, dim, descending);
  return {values, indices};
}

// torch.topk(largest=True) of a float through chlo.top_k, which XLA:CPU runs as
// a partial sort (a [512, 512] float, k = 8: 1.2 ms, where sorting the rows
// took 34 ms). Every NaN becomes +NaN, which top_k's total order puts first,
// as torch does; halves widen to F32 exactly and the values narrow back.
V top_k_largest(Builder& b, Value x, int64_t dim, int64_t k) {
  const int64_t last = x.rank() - 1;
  Ex key(b, b.convert(b.swap_dims(x, dim, last), DType::F32));
  key = where(key.cmp(Cmp::NE, key), key.k(NAN), key);
  auto [v, i] = b.top_k(key.v, k);
  v = b.convert(v, x.dtype());
  i = b.convert(i, DType::I64);
  return {b.swap_dims(v, dim, last), b.swap_dims(i, dim, last)};
}

TPU_LOWERING(shape_ops) {
  // copy(self, src): src converted and broadcast to self's dtype and shape
  // (Fused Eager records tensor.copy_ between device tensors as copy_).
  reg("copy", [](Ctx& c) -> V { return {coerce(c.b, c.in(1), c.out(0))}; });
  // (tensors, dim)
  reg("cat", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    std::vector<Value> xs;
    for (const Value& v : c.list(0)) {
      // Legacy: 1-D empty tensors are skipped whatever the other shapes.
      if (v.rank() == 1 && v.shape()[0] == 0) continue;
      xs.push_back(c.b.convert(v, o.dtype));
    }
    if (xs.empty()) return {c.b.splat(0, o)};
    return {c.b.concatenate(xs, wrap_dim(c.i64(1), o.rank()))};
  });
  reg("stack", [](Ctx& c) -> V {
    const Type& o = c.out(0);
    int64_t dim = wrap_dim(c.i64(1), o.rank());
    std::vector<Value> xs;
    for (const Value& v : c.list(0)) {
      Shape s = v.shape();
      s.insert(s.begin() + dim, 1);
      xs.push_back(c.b.reshape(c.b.convert(v, o.dtype), s));
    }
    return {c.b.concatenate(xs, dim)};
  });
  for (const char* n : {"tril", "triu"}) {
    bool lower = std::string(n) == "tril";
    reg(n, [lower](Ctx& c) -> V {
      Builder& b = c.b;
      Value x = c.in(0);
      int64_t r = x.rank();
      Type it{DType::I64, x.shape()};
      Ex diff = Ex(b, b.iota(it, r - 1)) - Ex(b, b.iota(it, r - 2));
      Ex k = diff.k(static_cast<double>(c.i64(1)));
      Ex keep = lower ? diff.cmp(Cmp::LE, k) : diff.cmp(Cmp::GE, k);
      Ex xv(b, x);
      return {where(keep, xv, xv.k(0))};
    });
  }
  reg("flip", [](Ctx& c) -> V {
    Value x = c.in(0);
    if (c.ints(1).empty()) return {x};  // no dims: a copy (reduce_dims reads [] as all)
    return {c.b.reverse(x, reduce_dims(c.ints(1), x.rank()))};
  });
  // (self, shifts, dims)
  reg("roll", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    auto shifts = c.ints(1), dims = c.ints(2);
    if (dims.empty()) {
      Value f = b.reshape(x, {x.type.numel()});
      return {b.reshape(roll_dim(b, f, shifts.at(0), 0), x.shape())};
    }
    for (size_t i = 0; i < dims.size(); ++i)
      x = roll_dim(b, x, shifts.at(i), wrap_dim(dims[i], x.rank()));
    return {x};
  });
  // (self, repeats): tile by broadcasting into interleaved [r0, s0, r1, s1, ...].
  reg("repeat", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    auto reps = c.ints(1);
    Shape s(reps.size() - x.rank(), 1);
    s.insert(s.end(), x.shape().begin(), x.shape().end());
    x = b.reshape(x, s);
    Shape big, out;
    std::vector<int64_t> dims;
    for (size_t i = 0; i < reps.size(); ++i) {
      big.push_back(reps[i]);
      big.push_back(s[i]);
      dims.push_back(static_cast<int64_t>(2 * i + 1));
      out.push_back(reps[i] * s[i]);
    }
    return {b.reshape(b.broadcast_in_dim(x, big, dims), out)};
  });
  // (self, pad, value): pad lists (lo, hi) pairs from the last dim backwards.
  reg("constant_pad_nd", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    auto pad = c.ints(1);
    int64_t r = x.rank();
    Shape lo(r, 0), hi(r, 0);
    for (size_t i = 0; i + 1 < pad.size(); i += 2) {
      int64_t d = r - 1 - static_cast<int64_t>(i / 2);
      lo[d] = pad[i];
      hi[d] = pad[i + 1];
    }
    return {b.pad(x, c.scalar(2, x.dtype()), lo, hi, {})};
  });
  // (self, dim, descending) / (self, *, stable?, dim, descending)
  reg("sort", [](Ctx& c) -> V { return sort_with_indices(c.b, c.in(0), c.i64(1), c.flag(2)); });
  reg("sort.stable",
      [](Ctx& c) -> V { return sort_with_indices(c.b, c.in(0), c.i64(2), c.flag(3)); });
  // (self, k, dim, largest, sorted)
  reg("topk", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0));
    int64_t dim = wrap_dim(c.i64(2), x.rank()), k = c.i64(1);
    DType t = x.dtype();
    if (c.flag(3) && k > 0 && (t == DType::F32 || t == DType::F16 || t == DType::BF16))
      return top_k_largest(b, x, dim, k);
    V s = sort_with_indices(b, x, dim, c.flag(3));
    Shape lo(x.rank(), 0), hi = x.shape();
    hi[dim] = k;
    return {b.slice(s[0], lo, hi, {}), b.slice(s[1], lo, hi, {})};
  });
  // (self, groups): [N, g, C/g, ...] -> [N, C/g, g, ...].
  for (const char* n : {"channel_shuffle", "native_channel_shuffle"}) {
    reg(n, [](Ctx& c) -> V {
      Value x = c.in(0);
      int64_t g = c.i64(1), ch = x.shape()[1];
      Shape s = x.shape();
      s[1] = ch / g;
      s.insert(s.begin() + 1, g);
      std::vector<int64_t> perm{0, 2, 1};
      for (int64_t k = 3; k < static_cast<int64_t>(s.size()); ++k) perm.push_back(k);
      return {c.b.reshape(c.b.transpose(c.b.reshape(x, s), perm), x.shape())};
    });
  }
}

}  // namespace
}  // namespace torchtpu::lower
