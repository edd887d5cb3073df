// Histograms: histc (equal-width bins over a range) and histogram (given or
// computed bin edges, optional weights and density), with the edges it used.
#include <cmath>
#include <string>
#include <vector>

#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::lower {
namespace {

using hlo::Cmp;
using hlo::Reducer;
using V = std::vector<Value>;

// torch.histogram over flat x with bin edges [nb + 1] (the last bin closed on
// the right): optional per-element weights, optionally as a density.
Ex histogram_counts(Builder& b, const Ex& x, const Ex& edges, const Ex* weight, bool density) {
  int64_t n = x.v.shape()[0], nb = edges.v.shape()[0] - 1;
  DType t = x.v.dtype();
  Ex e0(b, b.reshape(b.slice(edges.v, {0}, {1}, {}), {})),
      el(b, b.reshape(b.slice(edges.v, {nb}, {nb + 1}, {}), {}));
  Ex below(b, b.broadcast_in_dim(edges.v, {n, nb + 1}, {1}));
  Ex xb(b, b.broadcast_in_dim(x.v, {n, nb + 1}, {0}));
  Ex cnt(b, reduce_sum(b, below.cmp(Cmp::LE, xb).to(DType::I64).v, {1}, false));
  Ex pos = cnt - 1.0;
  pos = where(x.cmp(Cmp::EQ, el), pos.k(static_cast<double>(nb - 1)), pos);
  Ex inside = x.cmp(Cmp::GE, e0).bin("and", x.cmp(Cmp::LE, el));
  Ex idx = where(inside, pos, pos.k(static_cast<double>(nb)));
  Value w = weight ? weight->v : b.splat(1, Type{t, {n}});
  Ex h(b, b.scatter_flat(b.splat(0, Type{t, {nb}}), idx.v, w, true));
  if (!density) return h;
  Ex widths(b, b.slice(edges.v, {1}, {nb + 1}, {}));
  widths = widths - Ex(b, b.slice(edges.v, {0}, {nb}, {}));
  Ex total(b, b.reduce(h.v, b.constant(0, t), {0}, Reducer::Add));
  return h / (total * widths);
}

TPU_LOWERING(histogram) {
  // histc(self, bins, min, max): equal-width bins over [min, max] (the data's
  // range when both are 0); values outside are ignored, max falls in the last.
  // Integer inputs (the CPU has no kernel; CUDA's, which MoE layers reach) bin
  // in int64 with truncated bounds and integer division, and count in their dtype.
  reg("histc", [](Ctx& c) -> V {
    Builder& b = c.b;
    const bool integral = !is_float(c.out(0).dtype);
    DType t = integral ? DType::I64 : math_dtype(c);
    Ex x(b, b.reshape(b.convert(c.in(0), t), {c.in(0).type.numel()}));
    int64_t bins = c.i64(1);
    Ex lo(b, c.scalar(2, t)), hi(b, c.scalar(3, t));
    if (x.v.shape()[0] > 0) {
      Ex dmin(b, b.reduce(x.v, reduce_init(b, Reducer::Min, t), {0}, Reducer::Min));
      Ex dmax(b, b.reduce(x.v, reduce_init(b, Reducer::Max, t), {0}, Reducer::Max));
      Ex same = lo.cmp(Cmp::EQ, hi);
      lo = where(same, dmin, lo);
      hi = where(same, dmax, hi);
    }
    Ex same = lo.cmp(Cmp::EQ, hi);
    lo = where(same, lo - 1.0, lo);
    hi = where(same, hi + 1.0, hi);
    Ex pos = (x - lo) * static_cast<double>(bins) / (hi - lo);
    if (!integral) pos = pos.un("floor");
    pos = where(x.cmp(Cmp::EQ, hi), pos.k(static_cast<double>(bins - 1)), pos);
    Ex inside = x.cmp(Cmp::GE, lo).bin("and", x.cmp(Cmp::LE, hi));
    Ex idx = where(inside, pos, pos.k(static_cast<double>(bins))).to(DType::I64);
    Value ones = b.splat(1, Type{t, x.v.shape()});
    return {b.scatter_flat(b.splat(0, Type{t, {bins}}), idx, ones, true)};
  });
  // histogram.bin_ct(self, bins, *, range?, weight?, density) / histogram.bins_tensor(
  // self, bins, *, weight?, density) -> (hist, bin_edges)
  for (const char* name : {"histogram.bin_ct", "histogram.bins_tensor"}) {
    bool given = std::string(name) == "histogram.bins_tensor";
    reg(name, [given](Ctx& c) -> V {
      Builder& b = c.b;
      DType t = math_dtype(c);
      Ex x(b, b.reshape(b.convert(c.in(0), t), {c.in(0).type.numel()}));
      int w_arg = given ? 2 : 3, d_arg = given ? 3 : 4;
      Ex edges = x;
      if (given) {
        edges = Ex(b, b.reshape(b.convert(c.in(1), t), {c.in(1).type.numel()}));
      } else {
        int64_t nb = c.i64(1);
        Ex lo(b, b.constant(0, t)), hi = lo;
        if (!c.is_none(2)) {
          auto r = c.arg(2).toDoubleVector();
          lo = Ex(b, b.constant(r[0], t));
          hi = Ex(b, b.constant(r[1], t));
        } else if (x.v.shape()[0] > 0) {
          lo = Ex(b, b.reduce(x.v, b.constant(INFINITY, t), {0}, Reducer::Min));
          hi = Ex(b, b.reduce(x.v, b.constant(-INFINITY, t), {0}, Reducer::Max));
        } else {
          hi = Ex(b, b.constant(1, t));  // an empty input's bins span [0, 1]
        }
        Ex same = lo.cmp(Cmp::EQ, hi);
        lo = where(same, lo - 0.5, lo);
        hi = where(same, hi + 0.5, hi);
        // linspace(lo, hi, nb + 1) as torch computes it (from both ends).
        Ex i(b, b.iota(Type{t, {nb + 1}}, 0));
        Ex step = (hi - lo) / static_cast<double>(nb);
        Ex half = i.cmp(Cmp::LT, i.k(static_cast<double>((nb + 1) / 2)));
        edges = where(half, lo + step * i, hi - step * (static_cast<double>(nb) - i));
      }
      Ex wv = x;
      bool has_w = !c.is_none(w_arg);
      if (has_w) wv = Ex(b, b.reshape(b.convert(c.in(w_arg), t), {x.v.shape()[0]}));
      return {histogram_counts(b, x, edges, has_w ? &wv : nullptr, c.flag(d_arg)), edges};
    });
  }
}

}  // namespace
}  // namespace torchtpu::lower
