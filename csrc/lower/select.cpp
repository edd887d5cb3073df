// Flat-index and mask-driven selection whose output shape is static: take,
// put, nonzero_static, masked_scatter. (Ops whose output size depends on
// values, e.g. nonzero and masked_select, sync once for the size in
// csrc/aten/dynamic_ops.cpp and then run these.)
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

Ex flat(const Ex& x) { return Ex(*x.b, x.b->reshape(x.v, {x.v.type.numel()})); }
// Inclusive prefix sum of a rank-1 value.
Ex cumsum1(const Ex& x) {
  int64_t n = x.v.shape()[0];
  if (n == 0) return x;
  return Ex(*x.b, x.b->reduce_window(x.v, reduce_init(*x.b, Reducer::Add, x.v.dtype()),
                                     Reducer::Add, {n}, {1}, {n - 1}, {0}));
}
// torch's flat indices may be negative (counted from the end).
Ex wrap_index(const Ex& i, int64_t n) {
  Ex l = i.to(DType::I64);
  return where(l.cmp(Cmp::LT, l.k(0)), l + static_cast<double>(n), l);
}

TPU_LOWERING(select_flat) {
  // (self, index): self.flatten()[index]
  reg("take", [](Ctx& c) -> V {
    Ex x = flat(Ex(c.b, c.in(0)));
    int64_t n = x.v.shape()[0];
    if (n == 0) return {c.b.splat(0, c.out(0))};
    return {c.b.gather_flat(x, wrap_index(Ex(c.b, c.in(1)), n))};
  });
  // (self, index, source, accumulate)
  reg("put", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    Ex f = flat(x);
    int64_t n = f.v.shape()[0];
    Ex idx = flat(wrap_index(Ex(c.b, c.in(1)), n));
    Ex src = flat(Ex(c.b, c.b.convert(c.in(2), x.v.dtype())));
    if (idx.v.shape()[0] == 0) return {x};
    return {c.b.reshape(c.b.scatter_flat(f, idx, src, c.flag(3)), x.v.shape())};
  });
  // (self, *, size, fill_value): coordinates of the first `size` nonzeros in
  // row-major order, rows past the count filled.
  reg("nonzero_static", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    const Shape& s = x.v.shape();
    int64_t r = x.v.rank(), n = x.v.type.numel(), size = c.i64(1);
    Type ot{DType::I64, {size * r}};
    Ex out(c.b, c.b.splat(static_cast<double>(c.i64(2)), ot));
    if (n == 0 || r == 0 || size == 0) {
      if (r == 0 && n == 1) return {c.b.splat(0, c.out(0))};
      return {c.b.reshape(out.v, {size, r})};
    }
    Ex nz = flat(x.v.dtype() == DType::Bool ? x : x.cmp(Cmp::NE, x.k(0)));
    Ex pos = cumsum1(nz.to(DType::I64)) - 1.0;
    pos = where(nz, pos, pos.k(static_cast<double>(size)));  // dropped: out of range
    Ex lin(c.b, c.b.iota(Type{DType::I64, {n}}, 0));
    std::vector<Value> idx, val;
    int64_t stride = n;
    for (int64_t d = 0; d < r; ++d) {
      stride /= s[d];
      Ex coord = lin / static_cast<double>(stride);
      coord = coord.bin("remainder", coord.k(static_cast<double>(s[d])));
      Ex target = pos * static_cast<double>(r) + static_cast<double>(d);
      target = where(pos.cmp(Cmp::LT, pos.k(static_cast<double>(size))), target,
                     target.k(static_cast<double>(size * r)));
      idx.push_back(target.v);
      val.push_back(coord.v);
    }
    Value ti = c.b.concatenate(idx, 0), tv = c.b.concatenate(val, 0);
    return {c.b.reshape(c.b.scatter_flat(out, ti, tv, false), {size, r})};
  });
  // (self, mask, source): the i-th masked element takes source.flatten()[i].
  reg("masked_scatter", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    const Shape& s = c.out(0).shape;
    Ex xb(c.b, broadcast_to(c.b, x, s));
    Ex m(c.b, broadcast_to(c.b, c.in(1), s));
    Ex src = flat(Ex(c.b, c.b.convert(c.in(2), x.v.dtype())));
    if (src.v.shape()[0] == 0 || Type{DType::I64, s}.numel() == 0) return {xb};
    Ex mf = flat(m);
    Ex pos = maximum(cumsum1(mf.to(DType::I64)) - 1.0, Ex(c.b, c.b.constant_int(0, DType::I64)));
    Ex picked(c.b, c.b.reshape(c.b.gather_flat(src, pos), s));
    return {where(m, picked, xb)};
  });
}

}  // namespace
}  // namespace torchtpu::lower
