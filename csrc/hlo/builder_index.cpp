// StableHLO text emission: reductions, dot_general, gather/scatter, sort, rng.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "hlo/builder.h"

namespace torchtpu::hlo {
namespace {

// Identity of max (highest=false) / min (highest=true) for reduce_arg's init.
Value extreme(Builder& b, DType t, bool highest) {
  if (is_float(t)) return b.constant(highest ? INFINITY : -INFINITY, t);
  if (t == DType::Bool || is_unsigned(t)) return b.constant_int(highest ? -1 : 0, t);  // -1 wraps
  int bits = static_cast<int>(itemsize(t)) * 8;
  int64_t mx = bits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (bits - 1)) - 1;
  return b.constant_int(highest ? mx : -mx - 1, t);
}

std::vector<int64_t> range(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

bool is_int(DType t) { return is_signed_int(t) || is_unsigned(t); }

Shape drop_dims(const Shape& s, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i)
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) out.push_back(s[i]);
  return out;
}

}  // namespace

// ---------------------------------------------------------------- reductions

std::string Builder::reducer_region(Reducer r, DType dt, size_t n) {
  static const char* kOps[] = {"add", "multiply", "maximum", "minimum", "and", "or", "xor"};
  const char* opname = kOps[static_cast<int>(r)];
  if (dt == DType::Bool && r == Reducer::Add) opname = "or";  // bool sum saturates (any)
  if (dt == DType::Bool && r == Reducer::Mul) opname = "and";
  if ((r == Reducer::And || r == Reducer::Or || r == Reducer::Xor) && is_float(dt))
    fail("reduce", "and/or/xor on float");
  // n accumulators side by side: (a_0..a_n-1, b_0..b_n-1) -> a_i op b_i.
  return region(std::vector<Type>(2 * n, Type{dt, {}}), [&](const std::vector<Value>& a) {
    std::vector<Value> out;
    for (size_t i = 0; i < n; ++i) out.push_back(binary(opname, a[i], a[n + i]));
    return out;
  });
}

// XLA:CPU runs a float maximum/minimum reducer as a slow scalar loop: amax
// over the rows of a [256, 256] float tensor took 340 us, the same reduce
// with this body 25 us. NaN still wins from either side, as in torch.
std::string Builder::fold_region(Reducer r, DType dt, size_t n) {
  if (!is_float(dt) || (r != Reducer::Max && r != Reducer::Min)) return reducer_region(r, dt, n);
  return region(std::vector<Type>(2 * n, Type{dt, {}}), [&](const std::vector<Value>& a) {
    std::vector<Value> out;
    for (size_t i = 0; i < n; ++i) {
      Value x = a[i], y = a[n + i];
      Value wins = binary("or", compare(r == Reducer::Max ? Cmp::GT : Cmp::LT, x, y),
                          compare(Cmp::NE, x, x));
      out.push_back(select(wins, x, y));
    }
    return out;
  });
}

Value Builder::reduce(Value x, Value init, const std::vector<int64_t>& dims, Reducer r) {
  return reduce_each({x}, init, dims, r)[0];
}

std::vector<Value> Builder::reduce_each(const std::vector<Value>& xs, Value init,
                                        const std::vector<int64_t>& dims, Reducer r) {
  if (xs.empty()) return {};
  const Type& t = xs[0].type;
  check_dims("reduce", dims, t.rank());
  if (init.rank() != 0 || init.dtype() != t.dtype)
    fail("reduce", "init " + init.type.str() + " for " + t.str());
  for (const Value& x : xs)
    if (x.type != t) fail("reduce", "operands " + t.str() + " and " + x.type.str() + " differ");
  const size_t n = xs.size();
  std::string body = fold_region(r, t.dtype, n);
  std::vector<Value> args = xs;
  args.insert(args.end(), n, init);
  std::vector<Type> outs(n, Type{t.dtype, drop_dims(t.shape, dims)});
  return emit_multi(generic("reduce", args, "dimensions = " + arr(dims), outs, body), outs);
}

// (value, index) by torch's order: NaN beats everything, ties go to the
// smaller index. Two plain reduces, the extreme and then the least index that
// holds it. XLA:CPU runs a variadic reduce with a comparator as a scalar loop:
// argmax over the rows of a [512, 512] float took 640-790 us that way and
// 93-194 us as two reduces. Bool keeps the comparator.
std::pair<Value, Value> Builder::reduce_arg(Value x, int64_t dim, bool is_max) {
  if (dim < 0 || dim >= x.rank())
    fail("reduce_arg", "dim " + std::to_string(dim) + " out of range for " + x.type.str());
  DType dt = x.dtype();
  Value idx = iota(Type{DType::I64, x.shape()}, dim);
  Shape s = drop_dims(x.shape(), {dim});
  std::vector<int64_t> keep;
  for (int64_t k = 0; k < x.rank(); ++k)
    if (k != dim) keep.push_back(k);
  if (dt != DType::Bool) {
    Value m = reduce(x, extreme(*this, dt, !is_max), {dim}, is_max ? Reducer::Max : Reducer::Min);
    Value mb = broadcast_in_dim(m, x.shape(), keep);
    Value hit = compare(Cmp::EQ, x, mb);
    if (is_float(dt))
      hit = binary("or", hit, binary("and", compare(Cmp::NE, x, x), compare(Cmp::NE, mb, mb)));
    Value n = constant_int(x.shape()[dim], DType::I64);
    Value at = select(hit, idx, broadcast_in_dim(n, x.shape(), {}));
    return {m, reduce(at, n, {dim}, Reducer::Min)};
  }
  // Init index 0 is safe: the init value only wins a tie when every element
  // equals it, and then index 0 is the answer.
  Value init_v = extreme(*this, dt, !is_max), init_i = constant_int(0, DType::I64);
  Type sv{dt, {}}, si{DType::I64, {}};
  std::string body = region({sv, si, sv, si}, [&](const std::vector<Value>& a) {
    Value av = a[0], ai = a[1], bv = a[2], bi = a[3];
    Value better = compare(is_max ? Cmp::GT : Cmp::LT, av, bv), eq = compare(Cmp::EQ, av, bv);
    Value pick = binary("or", better, binary("and", eq, compare(Cmp::LT, ai, bi)));
    return std::vector<Value>{select(pick, av, bv), select(pick, ai, bi)};
  });
  std::vector<Type> outs{Type{dt, s}, Type{DType::I64, s}};
  auto r = emit_multi(
      generic("reduce", {x, idx, init_v, init_i}, "dimensions = " + arr({dim}), outs, body), outs);
  return {r[0], r[1]};
}

Value Builder::reduce_window(Value x, Value init, Reducer r, const Shape& window,
                             const Shape& strides, const Shape& pad_lo, const Shape& pad_hi) {
  size_t n = static_cast<size_t>(x.rank());
  Shape st = strides.empty() ? Shape(n, 1) : strides;
  Shape lo = pad_lo.empty() ? Shape(n, 0) : pad_lo, hi = pad_hi.empty() ? Shape(n, 0) : pad_hi;
  if (window.size() != n || st.size() != n || lo.size() != n || hi.size() != n)
    fail("reduce_window", "window/strides/padding rank differs from " + x.type.str());
  if (init.rank() != 0 || init.dtype() != x.dtype())
    fail("reduce_window", "init " + init.type.str() + " for " + x.type.str());
  Type out{x.dtype(), {}};
  std::string pad = "padding = dense<[";
  bool padded = false;
  for (size_t i = 0; i < n; ++i) {
    int64_t size = x.shape()[i] + lo[i] + hi[i];
    if (window[i] < 1 || st[i] < 1 || lo[i] < 0 || hi[i] < 0 || size < window[i])
      fail("reduce_window",
           "window " + list(window) + " stride " + list(st) + " does not fit " + x.type.str());
    out.shape.push_back((size - window[i]) / st[i] + 1);
    pad += (i ? ", [" : "[") + std::to_string(lo[i]) + ", " + std::to_string(hi[i]) + "]";
    padded |= lo[i] != 0 || hi[i] != 0;
  }
  pad += "]> : tensor<" + std::to_string(n) + "x2xi64>";
  std::string attrs = "window_dimensions = " + arr(window) + ", window_strides = " + arr(st);
  if (padded) attrs += ", " + pad;
  std::string body = fold_region(r, x.dtype());
  return op("reduce_window", {x, init}, attrs, out, body);
}

// ---------------------------------------------------------------- dot

Value Builder::dot_general(Value lhs, Value rhs, const std::vector<int64_t>& lb,
                           const std::vector<int64_t>& rb, const std::vector<int64_t>& lc,
                           const std::vector<int64_t>& rc, DType out) {
  if (lhs.dtype() != rhs.dtype())
    fail("dot_general", "operand types differ: " + lhs.type.str() + " vs " + rhs.type.str());
  if (lb.size() != rb.size() || lc.size() != rc.size())
    fail("dot_general", "batch/contracting dim counts differ");
  std::vector<int64_t> l_all = lb, r_all = rb;
  l_all.insert(l_all.end(), lc.begin(), lc.end());
  r_all.insert(r_all.end(), rc.begin(), rc.end());
  check_dims("dot_general", l_all, lhs.rank());
  check_dims("dot_general", r_all, rhs.rank());
  for (size_t i = 0; i < l_all.size(); ++i)
    if (lhs.shape()[l_all[i]] != rhs.shape()[r_all[i]])
      fail("dot_general", "size mismatch lhs dim " + std::to_string(l_all[i]) + " vs rhs dim " +
                              std::to_string(r_all[i]) + " for " + lhs.type.str() + ", " +
                              rhs.type.str());
  Type t{out, {}};
  for (int64_t d : lb) t.shape.push_back(lhs.shape()[d]);
  for (int64_t d : drop_dims(lhs.shape(), l_all)) t.shape.push_back(d);
  for (int64_t d : drop_dims(rhs.shape(), r_all)) t.shape.push_back(d);
  // Empty lists are omitted, as MLIR prints them.
  std::string dn;
  auto field = [&](const char* k, const std::vector<int64_t>& v) {
    if (!v.empty()) dn += (dn.empty() ? "" : ", ") + std::string(k) + " = " + list(v);
  };
  field("lhs_batching_dimensions", lb);
  field("rhs_batching_dimensions", rb);
  field("lhs_contracting_dimensions", lc);
  field("rhs_contracting_dimensions", rc);
  return op("dot_general", {lhs, rhs},
            "dot_dimension_numbers = #stablehlo.dot<" + dn + ">, " +
                precision_config(lhs.dtype(), float_precision().dot),
            t);
}

// ---------------------------------------------------------------- gather / scatter

// `dims` are both the collapsed (inserted) dims and the index->operand map.
Value Builder::gather(Value x, Value idx, const std::vector<int64_t>& offset_dims,
                      const std::vector<int64_t>& dims, int64_t index_vector_dim,
                      const Shape& slice_sizes, const Type& out) {
  std::string dn = "dimension_numbers = #stablehlo.gather<";
  if (!offset_dims.empty()) dn += "offset_dims = " + list(offset_dims) + ", ";
  dn += "collapsed_slice_dims = " + list(dims) + ", start_index_map = " + list(dims) +
        ", index_vector_dim = " + std::to_string(index_vector_dim) + ">";
  return op("gather", {x, idx},
            dn + ", indices_are_sorted = false, slice_sizes = " + arr(slice_sizes), out);
}

Value Builder::scatter(const char* who, Value x, Value idx, Value updates,
                       const std::vector<int64_t>& dims, int64_t index_vector_dim, bool add,
                       const std::vector<int64_t>& window_dims) {
  if (updates.dtype() != x.dtype())
    fail(who, "updates " + updates.type.str() + " for " + x.type.str());
  std::string attrs = "scatter_dimension_numbers = #stablehlo.scatter<";
  if (!window_dims.empty()) attrs += "update_window_dims = " + list(window_dims) + ", ";
  attrs += "inserted_window_dims = " + list(dims) +
           ", scatter_dims_to_operand_dims = " + list(dims) +
           ", index_vector_dim = " + std::to_string(index_vector_dim) +
           ">, indices_are_sorted = false, unique_indices = false";
  Type s{x.dtype(), {}};
  std::string body =
      add ? reducer_region(Reducer::Add, x.dtype())
          : region({s, s}, [](const std::vector<Value>& a) { return std::vector<Value>{a[1]}; });
  return op("scatter", {x, idx, updates}, attrs, x.type, body);
}

Value Builder::coords(Value idx, int64_t dim, int64_t rank) {
  Value i64 = convert(idx, DType::I64);
  Shape s = idx.shape();
  s.push_back(1);
  std::vector<Value> parts;
  for (int64_t d = 0; d < rank; ++d)
    parts.push_back(reshape(d == dim ? i64 : iota(Type{DType::I64, idx.shape()}, d), s));
  return concatenate(parts, rank);
}

Value Builder::take_along(Value x, Value idx, int64_t dim) {
  int64_t r = x.rank();
  if (!is_int(idx.dtype()) || idx.rank() != r || dim < 0 || dim >= r)
    fail("take_along",
         "index " + idx.type.str() + " dim " + std::to_string(dim) + " for " + x.type.str());
  for (int64_t d = 0; d < r; ++d)
    if (d != dim && idx.shape()[d] > x.shape()[d])
      fail("take_along", "index " + idx.type.str() + " larger than " + x.type.str());
  return gather(x, coords(idx, dim, r), {}, range(r), r, Shape(r, 1), Type{x.dtype(), idx.shape()});
}

Value Builder::index_select(Value x, Value idx, int64_t dim) {
  if (!is_int(idx.dtype()) || idx.rank() != 1 || dim < 0 || dim >= x.rank())
    fail("index_select",
         "index " + idx.type.str() + " dim " + std::to_string(dim) + " for " + x.type.str());
  Shape slice = x.shape(), out = x.shape();
  slice[dim] = 1;
  out[dim] = idx.shape()[0];
  std::vector<int64_t> offset = range(x.rank());
  offset.erase(offset.begin() + dim);
  return gather(x, convert(idx, DType::I64), offset, {dim}, 1, slice, Type{x.dtype(), out});
}

Value Builder::scatter_along(Value x, Value idx, Value updates, int64_t dim, bool add) {
  int64_t r = x.rank();
  if (!is_int(idx.dtype()) || idx.rank() != r || updates.rank() != r || dim < 0 || dim >= r)
    fail("scatter_along", "index " + idx.type.str() + " updates " + updates.type.str() + " dim " +
                              std::to_string(dim) + " for " + x.type.str());
  for (int64_t d = 0; d < r; ++d)
    if ((d != dim && idx.shape()[d] > x.shape()[d]) || idx.shape()[d] > updates.shape()[d])
      fail("scatter_along", "index " + idx.type.str() + " larger than updates or " + x.type.str());
  // torch only reads the idx-shaped corner of a larger `updates`.
  if (updates.shape() != idx.shape()) updates = slice(updates, Shape(r, 0), idx.shape(), {});
  return scatter("scatter_along", x, coords(idx, dim, r), updates, range(r), r, add);
}

Value Builder::scatter_slices(Value x, Value idx, Value updates, int64_t dim, bool add) {
  int64_t r = x.rank();
  Shape want = x.shape();
  if (dim >= 0 && dim < r) want[dim] = idx.type.numel();
  if (!is_int(idx.dtype()) || idx.rank() != 1 || dim < 0 || dim >= r || updates.shape() != want)
    fail("scatter_slices", "index " + idx.type.str() + " updates " + updates.type.str() + " dim " +
                               std::to_string(dim) + " for " + x.type.str());
  std::vector<int64_t> window = range(r);
  window.erase(window.begin() + dim);
  return scatter("scatter_slices", x, convert(idx, DType::I64), updates, {dim}, 1, add, window);
}

Value Builder::gather_flat(Value x, Value positions) {
  if (x.rank() != 1 || !is_int(positions.dtype()))
    fail("gather_flat",
         "need rank-1 x and integer positions, got " + x.type.str() + ", " + positions.type.str());
  return gather(x, convert(positions, DType::I64), {}, {0}, positions.rank(), {1},
                Type{x.dtype(), positions.shape()});
}

Value Builder::scatter_flat(Value x, Value positions, Value updates, bool add) {
  if (x.rank() != 1 || !is_int(positions.dtype()) || updates.shape() != positions.shape())
    fail("scatter_flat", "x " + x.type.str() + " positions " + positions.type.str() + " updates " +
                             updates.type.str());
  return scatter("scatter_flat", x, convert(positions, DType::I64), updates, {0}, positions.rank(),
                 add);
}

// ---------------------------------------------------------------- sort, rng

// Comparator orders keys only (stable sort keeps ties in input order); NaN is
// largest as in torch: last ascending, first descending.
std::vector<Value> Builder::sort(const std::vector<Value>& xs, int64_t dim, bool descending,
                                 bool stable) {
  if (xs.empty()) fail("sort", "no operands");
  if (dim < 0 || dim >= xs[0].rank())
    fail("sort", "dim " + std::to_string(dim) + " out of range for " + xs[0].type.str());
  std::vector<Type> args, outs;
  for (const Value& v : xs) {
    if (v.shape() != xs[0].shape())
      fail("sort", "operand " + v.type.str() + " does not match " + xs[0].type.str());
    args.insert(args.end(), 2, Type{v.dtype(), {}});
    outs.push_back(v.type);
  }
  std::string body = region(args, [&](const std::vector<Value>& a) {
    Value less = compare(descending ? Cmp::GT : Cmp::LT, a[0], a[1]);
    if (is_float(a[0].dtype())) {
      Value an = compare(Cmp::NE, a[0], a[0]), bn = compare(Cmp::NE, a[1], a[1]);
      Value nan_first =
          descending ? binary("and", an, unary("not", bn)) : binary("and", unary("not", an), bn);
      less = binary("or", less, nan_first);
    }
    return std::vector<Value>{less};
  });
  std::string attrs =
      "dimension = " + std::to_string(dim) + " : i64, is_stable = " + (stable ? "true" : "false");
  return emit_multi(generic("sort", xs, attrs, outs, body), outs);
}

Value Builder::order_key(Value x) {
  const DType dt = x.dtype();
  if (itemsize(dt) > 8 || is_complex(dt))
    fail("order_key", "needs a real value of at most 64 bits, got " + x.type.str());
  const bool wide = itemsize(dt) == 8;
  const DType ut = wide ? DType::U64 : DType::U32;
  const Type u{ut, x.shape()};
  auto k = [&](double v) { return splat(v, u); };
  const double sign = wide ? 9223372036854775808.0 : 2147483648.0;  // the top bit
  if (!is_float(dt)) {
    const bool is_signed = is_signed_int(dt);
    Value v = bitcast_convert(convert(x, is_signed ? (wide ? DType::I64 : DType::I32) : ut), ut);
    return is_signed ? binary("xor", v, k(sign)) : v;
  }
  Value f = convert(x, wide ? DType::F64 : DType::F32);  // exact for F16 and BF16
  Value bits = bitcast_convert(f, ut);
  const double quiet_nan = wide ? 9221120237041090560.0 : 2143289344.0;  // positive
  Value folded = select(compare(Cmp::NE, f, f), k(quiet_nan),
                        select(compare(Cmp::EQ, f, splat(0.0, f.type)), k(0), bits));
  // Negative floats flip every bit, the others only the sign bit.
  Value neg = binary("subtract", k(0), binary("shift_right_logical", folded, k(wide ? 63 : 31)));
  return binary("xor", folded, binary("or", neg, k(sign)));
}

// A radix select: the answer's key bits from the top, each kept when fewer than k+1
// keys lie below it (one counting pass over x per bit), where a sort costs
// n log n comparisons (median of a [512, 512] float: 7 ms sorting rows).
std::pair<Value, Value> Builder::kth_smallest(Value x, int64_t dim, Value k) {
  if (dim < 0 || dim >= x.rank())
    fail("kth_smallest", "dim " + std::to_string(dim) + " out of range for " + x.type.str());
  Shape ks = x.shape();
  ks[dim] = 1;
  const DType dt = x.dtype();
  const int64_t n = x.shape()[dim];
  k = convert(k, DType::I64);
  if (itemsize(dt) > 4 || is_complex(dt) || n >= (int64_t{1} << 31)) {
    auto [sorted, index] = sort_indexed(x, dim, false);
    return {take_along(sorted, k, dim), take_along(index, k, dim)};
  }
  const std::vector<int64_t> all = range(x.rank());
  auto spread = [&](Value v) { return broadcast_in_dim(v, x.shape(), all); };
  Value key = order_key(x);
  Value k32 = convert(k, DType::I32);
  const Type kt{DType::U32, ks};
  // A loop over the bits, so the program stays one pass's size (unrolled, the
  // first call compiled for 0.6-1 s).
  Value top = constant(static_cast<double>(uint32_t{1} << 31), DType::U32);
  Value prefix = while_loop(
      {top, splat(0, kt)},
      [&](const std::vector<Value>& a) { return compare(Cmp::NE, a[0], constant(0, DType::U32)); },
      [&](const std::vector<Value>& a) {
        Value t = binary("or", a[1], broadcast_in_dim(a[0], ks, {}));
        Value below = convert(compare(Cmp::LT, key, spread(t)), DType::I32);
        Value count = reshape(reduce(below, constant_int(0, DType::I32), {dim}, Reducer::Add), ks);
        return std::vector<Value>{binary("shift_right_logical", a[0], constant(1, DType::U32)),
                                  select(compare(Cmp::LE, count, k32), t, a[1])};
      })[1];
  Value pos = select(compare(Cmp::EQ, key, spread(prefix)), iota(Type{DType::I64, x.shape()}, dim),
                     splat(static_cast<double>(n), Type{DType::I64, x.shape()}));
  Value index = reshape(reduce(pos, constant_int(n, DType::I64), {dim}, Reducer::Min), ks);
  return {take_along(x, index, dim), index};
}

namespace {

// Unique u64 keys sorted along dim. Keys are unique, so an unstable sort is
// exact. XLA:CPU walks a non-minor dim with a strided iterator, several times
// slower: the rows are sorted instead.
Value sort_keys(Builder& b, Value key, int64_t dim) {
  const int64_t last = key.rank() - 1;
  return b.swap_dims(b.sort({b.swap_dims(key, dim, last)}, last, false, /*stable=*/false)[0], dim,
                     last);
}

// (high << 32) | low of two U32 values.
Value pack(Builder& b, Value high, Value low) {
  Value shift = b.splat(32, Type{DType::U64, high.shape()});
  return b.binary("or", b.binary("shift_left", b.convert(high, DType::U64), shift),
                  b.convert(low, DType::U64));
}

// A stable sort of 64-bit values as two sorts of one key each, least significant
// half first: (low half, index), then (high half, rank after the first sort).
std::pair<Value, Value> sort_indexed_wide(Builder& b, Value x, int64_t dim, bool descending) {
  Value key = b.order_key(x);
  if (descending) key = b.unary("not", key);
  Value high = b.convert(b.binary("shift_right_logical", key, b.splat(32, key.type)), DType::U32);
  Value low = b.convert(key, DType::U32);
  Value pos = b.iota(Type{DType::U32, x.shape()}, dim);
  Value first = b.convert(sort_keys(b, pack(b, low, pos), dim), DType::U32);  // original index
  Value second = b.convert(sort_keys(b, pack(b, b.take_along(high, first, dim), pos), dim),
                           DType::U32);  // rank
  Value index = b.convert(b.take_along(first, second, dim), DType::I64);
  return {b.take_along(x, index, dim), index};
}

}  // namespace

// XLA:CPU sorts one operand under a bare `a < b` comparator with std::sort, but
// calls the compiled comparator per comparison otherwise (several times slower
// on a [512, 512] float). Values of 32 bits or less therefore travel with their
// index in one u64 key: the high half an order-preserving map of the value, the
// low half the index (so keys are unique and ties keep their order) shifted left
// by one over the value's sign bit, which restores -0.0 and NaN's sign after
// both were folded (to 0.0 and one NaN) so that they compare as torch does.
std::pair<Value, Value> Builder::sort_indexed(Value x, int64_t dim, bool descending) {
  if (dim < 0 || dim >= x.rank())
    fail("sort", "dim " + std::to_string(dim) + " out of range for " + x.type.str());
  const DType dt = x.dtype();
  const int64_t n = x.shape()[dim];
  if (itemsize(dt) == 8 && !is_complex(dt) && n < (int64_t{1} << 32))
    return sort_indexed_wide(*this, x, dim, descending);
  const bool packable = itemsize(dt) <= 4 && !is_complex(dt) && n < (int64_t{1} << 31);
  if (!packable) {
    auto s = sort({x, iota(Type{DType::I64, x.shape()}, dim)}, dim, descending);
    return {s[0], s[1]};
  }
  const Type u32{DType::U32, x.shape()}, u64{DType::U64, x.shape()};
  auto k32 = [&](double v) { return splat(v, u32); };
  Value hi = order_key(x);
  Value sign = is_float(dt) ? binary("shift_right_logical",
                                     bitcast_convert(convert(x, DType::F32), DType::U32), k32(31))
                            : k32(0);
  if (descending) hi = unary("not", hi);
  Value lo = binary("or", binary("shift_left", iota(u32, dim), k32(1)), sign);
  Value shift = splat(32, u64);
  Value key = sort_keys(*this, pack(*this, hi, lo), dim);

  Value h = convert(binary("shift_right_logical", key, shift), DType::U32);
  Value l = convert(key, DType::U32);  // the low half
  if (descending) h = unary("not", h);
  Value index = convert(binary("shift_right_logical", l, k32(1)), DType::I64);
  Value value;
  if (is_float(dt)) {
    // Top bit set: the value was non-negative, clear it; else flip every bit back.
    Value top = binary("shift_right_logical", h, k32(31));
    Value restored =
        select(compare(Cmp::NE, top, k32(0)), binary("xor", h, k32(0x80000000u)), unary("not", h));
    Value sign_bit = binary("shift_left", binary("and", l, k32(1)), k32(31));
    value = convert(bitcast_convert(binary("or", restored, sign_bit), DType::F32), dt);
  } else if (is_signed_int(dt)) {
    value = convert(bitcast_convert(binary("xor", h, k32(0x80000000u)), DType::I32), dt);
  } else {
    value = convert(h, dt);
  }
  return {value, index};
}

std::pair<Value, Value> Builder::rng_bit_generator(Value state, const Type& type) {
  if (state.dtype() != DType::U64 || state.rank() != 1 ||
      (state.shape()[0] != 2 && state.shape()[0] != 3))
    fail("rng_bit_generator", "state must be tensor<2xui64>, got " + state.type.str());
  if (type.dtype != DType::U32 && type.dtype != DType::U64)
    fail("rng_bit_generator", "bits must be ui32 or ui64, got " + type.str());
  std::vector<Type> outs{state.type, type};
  auto r = emit_multi(generic("rng_bit_generator", {state},
                              "rng_algorithm = #stablehlo<rng_algorithm PHILOX>", outs),
                      outs);
  return {r[0], r[1]};
}

}  // namespace torchtpu::hlo
