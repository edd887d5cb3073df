#include "lower/view.h"

#include <algorithm>
#include <numeric>

#include "lower/helpers.h"

namespace torchtpu::lower {

using hlo::Builder;
using hlo::Shape;
using hlo::Type;
using hlo::Value;

int64_t ViewGeom::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool ViewGeom::contiguous() const {
  int64_t expected = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    if (sizes[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= sizes[i];
  }
  return true;
}

namespace {

Value idx(Builder& b, int64_t v) { return b.constant_int(v, DType::I64); }

// A non-overlapping strided view is a slice of a reshaped contiguous "box":
// dims sorted by stride, each stride a multiple of the next. Covers
// transposes, narrow/split/chunk and step slicing without a gather.
struct Box {
  std::vector<int64_t> order;  // view dims (size > 1, stride != 0) by stride, descending
  Shape box;                   // reshape of the region: [z0, s0/s1, ..., s_{k-1}]
  int64_t total = 0;           // region length = z0 * s0
};

bool make_box(const ViewGeom& g, Box& out) {
  for (size_t i = 0; i < g.sizes.size(); ++i)
    if (g.sizes[i] > 1 && g.strides[i] != 0) out.order.push_back(static_cast<int64_t>(i));
  std::stable_sort(out.order.begin(), out.order.end(),
                   [&](int64_t a, int64_t c) { return g.strides[a] > g.strides[c]; });
  const auto& o = out.order;
  if (o.empty()) {
    out.box = {1};
    out.total = 1;
    return true;
  }
  for (int64_t d : o)
    if (g.strides[d] < 1) return false;
  out.box.push_back(g.sizes[o[0]]);
  for (size_t j = 0; j + 1 < o.size(); ++j) {
    int64_t s = g.strides[o[j]], t = g.strides[o[j + 1]];
    if (s % t != 0 || s / t < g.sizes[o[j + 1]]) return false;
    out.box.push_back(s / t);
  }
  out.box.push_back(g.strides[o.back()]);
  out.total = g.sizes[o[0]] * g.strides[o[0]];
  return true;
}

// Flat storage padded with zeros so [offset, offset + len) is in range.
Value padded(Builder& b, Value flat, int64_t end) {
  int64_t n = flat.shape()[0];
  if (end <= n) return flat;
  return b.pad(flat, b.constant(0, flat.dtype()), {0}, {end - n}, {0});
}

Value slice1(Builder& b, Value flat, int64_t start, int64_t len) {
  if (start == 0 && len == flat.shape()[0]) return flat;
  return b.slice(flat, {start}, {start + len}, {1});
}

// Flat positions offset + sum(i_k * stride_k), shape g.sizes.
Value positions(Builder& b, const ViewGeom& g) {
  Type t{DType::I64, g.sizes};
  Value pos = b.splat(static_cast<double>(g.offset), t);
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    if (g.strides[d] == 0 || g.sizes[d] == 1) continue;
    Value term = b.binary("multiply", b.iota(t, static_cast<int64_t>(d)),
                          b.splat(static_cast<double>(g.strides[d]), t));
    pos = b.binary("add", pos, term);
  }
  return pos;
}

// Sizes of the boxed dims in box order, with the trailing unit dim.
Shape boxed_sizes(const ViewGeom& g, const Box& box) {
  Shape s;
  for (int64_t d : box.order) s.push_back(g.sizes[d]);
  s.push_back(1);
  return s;
}

// Rank of each boxed dim among the boxed dims in view order.
std::vector<int64_t> ranks(const Box& box) {
  std::vector<int64_t> sorted = box.order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> r;
  for (int64_t d : box.order)
    r.push_back(std::lower_bound(sorted.begin(), sorted.end(), d) - sorted.begin());
  return r;
}

}  // namespace

Value read_view(Builder& b, Value flat, const ViewGeom& g) {
  const int64_t numel = g.numel();
  if (numel == 0) return b.splat(0, Type{flat.dtype(), g.sizes});
  if (g.contiguous()) return b.reshape(slice1(b, flat, g.offset, numel), g.sizes);
  Box box;
  if (!make_box(g, box)) return b.reshape(b.gather_flat(flat, positions(b, g)), g.sizes);
  Value p = padded(b, flat, g.offset + box.total);
  Value r = b.reshape(slice1(b, p, g.offset, box.total), box.box);
  Shape zs = boxed_sizes(g, box);
  Shape zero(zs.size(), 0), ones(zs.size(), 1);
  r = b.slice(r, zero, zs, ones);
  zs.pop_back();
  r = b.reshape(r, zs);
  // Box order -> view order of the boxed dims.
  if (zs.size() > 1) r = b.transpose(r, inverse_permutation(ranks(box)));
  // Re-insert unit and broadcast (stride 0) dims.
  Shape with_units;
  std::vector<int64_t> dims;
  for (size_t d = 0; d < g.sizes.size(); ++d) {
    bool boxed = std::find(box.order.begin(), box.order.end(), d) != box.order.end();
    if (boxed) dims.push_back(static_cast<int64_t>(d));
  }
  Shape sorted_sizes;
  for (int64_t d : dims) sorted_sizes.push_back(g.sizes[d]);
  r = b.reshape(r, sorted_sizes);
  return b.broadcast_in_dim(r, g.sizes, dims);
}

Value write_view(Builder& b, Value flat, const ViewGeom& g, Value value) {
  const int64_t numel = g.numel(), n = flat.shape()[0];
  if (numel == 0) return flat;
  value = b.convert(value, flat.dtype());
  if (g.contiguous()) {
    Value v = b.reshape(value, {numel});
    if (g.offset == 0 && numel == n) return v;
    return b.dynamic_update_slice(flat, v, {idx(b, g.offset)});
  }
  Box box;
  bool expanded = false;
  for (size_t d = 0; d < g.sizes.size(); ++d) expanded |= g.sizes[d] > 1 && g.strides[d] == 0;
  if (expanded || !make_box(g, box))
    return b.scatter_flat(flat, positions(b, g), value, /*add=*/false);
  int64_t end = std::max(n, g.offset + box.total);
  Value p = padded(b, flat, end);
  Value r = b.reshape(slice1(b, p, g.offset, box.total), box.box);
  // Value (view order) -> boxed dims in box order, plus the trailing unit dim.
  Shape view_sizes;
  for (size_t d = 0; d < g.sizes.size(); ++d)
    if (std::find(box.order.begin(), box.order.end(), d) != box.order.end())
      view_sizes.push_back(g.sizes[d]);
  Value u = b.reshape(value, view_sizes);
  if (view_sizes.size() > 1) u = b.transpose(u, ranks(box));
  u = b.reshape(u, boxed_sizes(g, box));
  std::vector<Value> zeros(box.box.size(), idx(b, 0));
  r = b.dynamic_update_slice(r, u, zeros);
  p = b.dynamic_update_slice(p, b.reshape(r, {box.total}), {idx(b, g.offset)});
  return end == n ? p : b.slice(p, {0}, {n}, {1});
}

}  // namespace torchtpu::lower
