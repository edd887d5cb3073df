// Histograms: histc (equal-width bins over a range) and histogram (given or
// computed bin edges, optional weights and density), with the edges it used.
#include <algorithm>
#include <cmath>
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

// Bins of flat x among `edges` [nb + 1] (the last bin closed on the right),
// as a binary search would place them, and whether x counts (inside, not NaN).
std::pair<Ex, Ex> bin_of(Builder& b, const Ex& x, const Ex& edges) {
  int64_t n = x.v.shape()[0], nb = edges.v.shape()[0] - 1;
  Ex e0(b, b.reshape(b.slice(edges.v, {0}, {1}, {}), {})),
      el(b, b.reshape(b.slice(edges.v, {nb}, {nb + 1}, {}), {}));
  Ex below(b, b.broadcast_in_dim(edges.v, {n, nb + 1}, {1}));
  Ex xb(b, b.broadcast_in_dim(x.v, {n, nb + 1}, {0}));
  Ex cnt(b, reduce_sum(b, below.cmp(Cmp::LE, xb).to(DType::I64).v, {1}, false));
  Ex pos = where(x.cmp(Cmp::EQ, el), cnt.k(static_cast<double>(nb - 1)), cnt - 1.0);
  return {pos, x.cmp(Cmp::GE, e0).bin("and", x.cmp(Cmp::LE, el))};
}

// torch.histogramdd over columns xs[d] (each [n]) with edges[d]: optional
// per-element weights, optionally as a density (divided by the total, then by
// each dim's bin widths, in the CPU's order). Shape: the bin counts.
Ex histogram_counts(Builder& b, const std::vector<Ex>& xs, const std::vector<Ex>& edges,
                    const Ex* weight, bool density) {
  int64_t n = xs[0].v.shape()[0], total_bins = 1;
  DType t = xs[0].v.dtype();
  Shape bins;
  for (const Ex& e : edges) bins.push_back(e.v.shape()[0] - 1);
  for (int64_t nb : bins) total_bins *= nb;
  Ex flat(b, b.splat(0, Type{DType::I64, {n}}));
  Ex inside(b, b.splat(1, Type{DType::Bool, {n}}));
  for (size_t d = 0; d < xs.size(); ++d) {
    auto [pos, in] = bin_of(b, xs[d], edges[d]);
    flat = flat * static_cast<double>(bins[d]) + pos;
    inside = inside.bin("and", in);
  }
  Ex idx = where(inside, flat, flat.k(static_cast<double>(total_bins)));
  Value w = weight ? weight->v : b.splat(1, Type{t, {n}});
  Ex h(b, b.reshape(b.scatter_flat(b.splat(0, Type{t, {total_bins}}), idx.v, w, true), bins));
  if (!density) return h;
  Ex total(b, reduce_sum(b, h.v, reduce_dims({}, h.v.rank()), false));
  h = h / Ex(b, b.broadcast_in_dim(total.v, bins, {}));
  for (size_t d = 0; d < edges.size(); ++d) {
    int64_t nb = bins[d];
    Ex widths(b, b.slice(edges[d].v, {1}, {nb + 1}, {}));
    widths = widths - Ex(b, b.slice(edges[d].v, {0}, {nb}, {}));
    h = h / Ex(b, b.broadcast_in_dim(widths.v, bins, {static_cast<int64_t>(d)}));
  }
  return h;
}

// Edges linspace(lo, hi, nb + 1) of flat x as torch computes them: lo and hi
// from `range` (entries 2d, 2d + 1) or the data's min and max, widened by 0.5
// when equal; the linspace from both ends.
Ex linear_edges(Ctx& c, int range_arg, size_t d, const Ex& x, int64_t nb) {
  Builder& b = c.b;
  DType t = x.v.dtype();
  Ex lo(b, b.constant(0, t)), hi = lo;
  if (!c.is_none(range_arg)) {
    auto r = c.arg(range_arg).toDoubleVector();
    lo = Ex(b, b.constant(r[2 * d], t));
    hi = Ex(b, b.constant(r[2 * d + 1], t));
  } else if (x.v.shape()[0] > 0) {
    lo = Ex(b, b.reduce(x.v, b.constant(INFINITY, t), {0}, Reducer::Min));
    hi = Ex(b, b.reduce(x.v, b.constant(-INFINITY, t), {0}, Reducer::Max));
  } else {
    hi = Ex(b, b.constant(1, t));  // an empty input's bins span [0, 1]
  }
  Ex same = lo.cmp(Cmp::EQ, hi);
  lo = where(same, lo - 0.5, lo);
  hi = where(same, hi + 0.5, hi);
  Ex i(b, b.iota(Type{t, {nb + 1}}, 0));
  Ex step = (hi - lo) / static_cast<double>(nb);
  Ex half = i.cmp(Cmp::LT, i.k(static_cast<double>((nb + 1) / 2)));
  return where(half, lo + step * i, hi - step * (static_cast<double>(nb) - i));
}

// histogramdd's input [..., D] as D flat columns in dtype t.
std::vector<Ex> columns(Ctx& c, DType t) {
  Builder& b = c.b;
  Value x = b.convert(c.in(0), t);
  int64_t dims = x.shape().back(), n = x.type.numel() / std::max<int64_t>(dims, 1);
  x = b.reshape(x, {n, dims});
  std::vector<Ex> cols;
  for (int64_t d = 0; d < dims; ++d)
    cols.emplace_back(b, b.reshape(b.slice(x, {0, d}, {n, d + 1}, {}), {n}));
  return cols;
}

Ex* weights(Ctx& c, int arg, int64_t n, DType t, Ex& storage) {
  if (c.is_none(arg)) return nullptr;
  storage = Ex(c.b, c.b.reshape(c.b.convert(c.in(arg), t), {n}));
  return &storage;
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
      Ex edges = given ? Ex(b, b.reshape(b.convert(c.in(1), t), {c.in(1).type.numel()}))
                       : linear_edges(c, 2, 0, x, c.i64(1));
      Ex storage = x;
      Ex* w = weights(c, given ? 2 : 3, x.v.shape()[0], t, storage);
      return {histogram_counts(b, {x}, {edges}, w, c.flag(given ? 3 : 4)).v, edges.v};
    });
  }
  // histogramdd over an input [..., D]: _histogramdd_bin_edges(self, bins, *, range?,
  // weight?, density) -> Tensor[]; _histogramdd_from_bin_cts(same) and
  // _histogramdd_from_bin_tensors(self, Tensor[] bins, *, weight?, density) -> hist.
  reg("_histogramdd_bin_edges", [](Ctx& c) -> V {
    std::vector<Ex> cols = columns(c, c.out(0).dtype);
    V out;
    for (size_t d = 0; d < cols.size(); ++d)
      out.push_back(linear_edges(c, 2, d, cols[d], c.ints(1)[d]).v);
    return out;
  });
  for (const char* name : {"_histogramdd_from_bin_cts", "_histogramdd_from_bin_tensors"}) {
    bool given = std::string(name) == "_histogramdd_from_bin_tensors";
    reg(name, [given](Ctx& c) -> V {
      DType t = c.out(0).dtype;
      std::vector<Ex> cols = columns(c, t), edges;
      if (given) {
        for (Value e : c.list(1)) edges.emplace_back(c.b, c.b.convert(e, t));
      } else {
        for (size_t d = 0; d < cols.size(); ++d)
          edges.push_back(linear_edges(c, 2, d, cols[d], c.ints(1)[d]));
      }
      Ex storage = cols[0];
      Ex* w = weights(c, given ? 2 : 3, cols[0].v.shape()[0], t, storage);
      return {histogram_counts(c.b, cols, edges, w, c.flag(given ? 3 : 4)).v};
    });
  }
}

}  // namespace
}  // namespace torchtpu::lower
