// Reductions, scans (cummax/cummin too), median/nanmedian/mode, var/std, norms and
// renorm, and softmax-family ops.
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

// Input 0 converted to the compute dtype of output k; a complex input stays
// complex (norms and variances of complex values are real).
Ex input(Ctx& c, int i = 0, int k = 0) {
  DType t = compute_dtype(c.out(k).dtype);
  Value x = c.in(i);
  if (is_complex(x.dtype()) && !is_complex(t)) t = complex_dtype(t);
  return Ex(c.b, c.b.convert(x, t));
}
// An int[]? / int[] / int dims argument (None or [] = all dims), wrapped and sorted.
// i < 0: the overload has no dims argument.
std::vector<int64_t> dims_arg(Ctx& c, int i, int64_t rank) {
  if (i < 0 || c.is_none(i)) return reduce_dims({}, rank);
  if (c.arg(i).isInt()) return reduce_dims({c.i64(i)}, rank);
  return reduce_dims(c.ints(i), rank);
}
Ex reduce(const Ex& x, const std::vector<int64_t>& dims, Reducer r, bool keepdim = false) {
  Builder& b = *x.b;
  Value v = b.reduce(x.v, reduce_init(b, r, x.v.dtype()), dims, r);
  return Ex(b, keepdim ? b.reshape(v, reduced_shape(x.v.shape(), dims, true)) : v);
}
// Max/min that propagate NaN (XLA's reduce does not).
Ex reduce_mm(const Ex& x, const std::vector<int64_t>& dims, Reducer r, bool keepdim = false) {
  Ex m = reduce(x, dims, r, keepdim);
  if (!is_float(x.v.dtype())) return m;
  Ex nan = reduce(x.cmp(Cmp::NE, x), dims, Reducer::Or, keepdim);
  return where(nan, m.k(NAN), m);
}
double count(const Shape& s, const std::vector<int64_t>& dims) {
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>(s[d]);
  return n;
}
Ex as_bool(const Ex& x) { return x.v.dtype() == DType::Bool ? x : x.cmp(Cmp::NE, x.k(0)); }
// Rank >= 1 view of x (rank-0 tensors reduce over a unit dim).
Value at_least_1d(Builder& b, Value x) { return x.rank() == 0 ? b.reshape(x, {1}) : x; }

// var over dims with a runtime correction (Scalar?, default 1); also returns the mean.
std::pair<Ex, Ex> var_mean(Ctx& c, int dim_arg, int corr_arg, int keep_arg) {
  Ex x = input(c);
  auto dims = dims_arg(c, dim_arg, x.v.rank());
  bool keep = c.flag(keep_arg);
  double n = count(x.v.shape(), dims);
  Ex mean = reduce(x, dims, Reducer::Add, true) / n;
  Ex d = x - mean;
  if (is_complex(d.v.dtype())) d = d.un("abs");  // |x - mean|^2
  Ex ss = reduce(d * d, dims, Reducer::Add, keep);
  DType rt = d.v.dtype();
  Ex corr = c.is_none(corr_arg) ? scalar(c.b, 1, rt) : Ex(c.b, c.scalar(corr_arg, rt));
  Ex dof = maximum(scalar(c.b, n, rt) - corr, corr.k(0));
  Value m = keep ? mean.v : c.b.reshape(mean.v, reduced_shape(x.v.shape(), dims, false));
  return {ss / dof, Ex(c.b, m)};
}

// p-norm with p known only at run time: every special case is computed and
// the right one selected.
// The order p is an attribute (Spec::attribute_scalars), so only its own
// reduction is built.
Ex vector_norm(const Ex& x, const std::vector<int64_t>& dims, bool keep, double p) {
  Ex a = x.un("abs");
  if (p == 2) return reduce(a * a, dims, Reducer::Add, keep).un("sqrt");
  if (p == 1) return reduce(a, dims, Reducer::Add, keep);
  if (p == INFINITY) return reduce_mm(a, dims, Reducer::Max, keep);
  if (p == -INFINITY) return reduce_mm(a, dims, Reducer::Min, keep);
  if (p == 0) return reduce(as_bool(a).to(a.v.dtype()), dims, Reducer::Add, keep);
  Ex sum = reduce(a.bin("power", a.k(p)), dims, Reducer::Add, keep);
  return sum.bin("power", sum.k(1.0 / p));
}

// Inclusive scan along dim as a reduce_window whose window covers the prefix.
Ex scan(const Ex& x, int64_t dim_arg, Reducer r) {
  Builder& b = *x.b;
  Value v = at_least_1d(b, x.v);
  int64_t dim = wrap_dim(dim_arg, v.rank());
  int64_t n = v.shape()[dim];
  if (n == 0) return Ex(b, v);
  Shape win(v.rank(), 1), lo(v.rank(), 0), hi(v.rank(), 0);
  win[dim] = n;
  lo[dim] = n - 1;
  return Ex(b, b.reduce_window(v, reduce_init(b, r, v.dtype()), r, win, {}, lo, hi));
}

// Running max/min along dim with the index of the element that set it: the
// last one among equals and the last NaN once a NaN appeared (torch's CPU
// cummax/cummin). The running extreme changes only where an entry reaches it,
// and every entry equal to a later extreme reached it too, so the index is a
// running max of the positions that reach theirs: two scans, where comparing
// each position with every earlier one took n^2 (4.6 s for [64, 4096] rows).
std::pair<Value, Value> cum_extreme(Builder& b, Value x, int64_t dim, bool is_max) {
  const bool is_bool = x.dtype() == DType::Bool;
  Ex v(b, is_bool ? b.convert(x, DType::U8) : x);
  Ex m = scan(v, dim, is_max ? Reducer::Max : Reducer::Min);
  Ex hit = v.cmp(Cmp::EQ, m);
  if (is_float(x.dtype())) hit = hit.bin("or", v.cmp(Cmp::NE, v).bin("and", m.cmp(Cmp::NE, m)));
  Ex pos(b, b.iota(Type{DType::I64, x.shape()}, dim));
  Ex index = scan(where(hit, pos, pos.k(-1)), dim, Reducer::Max);
  return {is_bool ? b.convert(m.v, DType::Bool) : m.v, index.v};
}

TPU_LOWERING(reduce_sum_mean) {
  // Overloads with a dims argument at position 1 (others reduce everything).
  const std::pair<const char*, bool> sums[] = {
      {"sum", false}, {"sum.dim_IntList", true}, {"nansum", true}};
  for (auto [name, has_dim] : sums) {
    bool nan = std::string(name) == "nansum", hd = has_dim;
    reg(name, [nan, hd](Ctx& c) -> V {
      Ex x = input(c);
      if (nan && is_float(x.v.dtype())) x = where(x.cmp(Cmp::NE, x), x.k(0), x);
      return {reduce(x, dims_arg(c, hd ? 1 : -1, x.v.rank()), Reducer::Add)};
    });
  }
  for (auto [name, has_dim] : {std::pair{"mean", false}, std::pair{"mean.dim", true}}) {
    bool hd = has_dim;
    reg(name, [hd](Ctx& c) -> V {
      Ex x = input(c);
      auto dims = dims_arg(c, hd ? 1 : -1, x.v.rank());
      return {reduce(x, dims, Reducer::Add) / count(x.v.shape(), dims)};
    });
  }
  for (auto [name, has_dim] : {std::pair{"prod", false}, std::pair{"prod.dim_int", true}}) {
    bool hd = has_dim;
    reg(name, [hd](Ctx& c) -> V {
      Ex x = input(c);
      return {reduce(x, dims_arg(c, hd ? 1 : -1, x.v.rank()), Reducer::Mul)};
    });
  }
  reg("cumsum", [](Ctx& c) -> V { return {scan(input(c), c.i64(1), Reducer::Add)}; });
  reg("cumprod", [](Ctx& c) -> V { return {scan(input(c), c.i64(1), Reducer::Mul)}; });
  // Shifted by the max along dim so the running sum of exps cannot overflow.
  // (_logcumsumexp's meta kernel is ours: csrc/aten/meta_kernels.cpp.)
  for (const char* n : {"logcumsumexp", "_logcumsumexp"}) {
    reg(n, [](Ctx& c) -> V {
      Ex x(c.b, at_least_1d(c.b, input(c).v));
      int64_t dim = wrap_dim(c.i64(1), x.v.rank());
      Ex m = reduce(x, {dim}, Reducer::Max, true);
      m = where(m.un("abs").cmp(Cmp::EQ, m.k(INFINITY)), m.k(0), m);
      return {scan((x - m).un("exponential"), dim, Reducer::Add).un("log") + m};
    });
  }
  // _cummax_helper(self, values(a!), indices(b!), dim) -> ()
  for (auto [name, mx] : {std::pair{"_cummax_helper", true}, std::pair{"_cummin_helper", false}}) {
    bool is_max = mx;
    reg(name, [is_max](Ctx& c) -> V {
      Value x = at_least_1d(c.b, c.in(0));
      auto [m, i] = cum_extreme(c.b, x, wrap_dim(c.i64(3), x.rank()), is_max);
      c.update(1, m);
      c.update(2, i);
      return {};
    });
  }
  reg("trace", [](Ctx& c) -> V {
    Ex x = input(c);
    Type it{DType::I64, x.v.shape()};
    Ex diag = Ex(c.b, c.b.iota(it, 0)).cmp(Cmp::EQ, Ex(c.b, c.b.iota(it, 1)));
    return {reduce(where(diag, x, x.k(0)), {0, 1}, Reducer::Add)};
  });
  reg("count_nonzero.dim_IntList", [](Ctx& c) -> V {
    Ex x = as_bool(Ex(c.b, c.in(0))).to(DType::I64);
    return {reduce(x, dims_arg(c, 1, x.v.rank()), Reducer::Add)};
  });
  reg("logsumexp", [](Ctx& c) -> V {
    Ex x = input(c);
    auto dims = dims_arg(c, 1, x.v.rank());
    Ex m = reduce(x, dims, Reducer::Max, true);
    m = where(m.un("abs").cmp(Cmp::EQ, m.k(INFINITY)), m.k(0), m);
    Ex s = reduce((x - m).un("exponential"), dims, Reducer::Add, true).un("log") + m;
    return {s};
  });
}

TPU_LOWERING(reduce_minmax) {
  struct MinMax {
    const char* name;
    Reducer r;
    bool has_dim;
  };
  const MinMax mm[] = {{"amax", Reducer::Max, true},
                       {"amin", Reducer::Min, true},
                       {"max", Reducer::Max, false},
                       {"min", Reducer::Min, false}};
  for (const MinMax& e : mm) {
    Reducer r = e.r;
    bool hd = e.has_dim;
    reg(e.name, [r, hd](Ctx& c) -> V {
      Ex x(c.b, c.in(0));
      auto dims = dims_arg(c, hd ? 1 : -1, x.v.rank());
      if (x.v.dtype() == DType::Bool)
        return {reduce(x, dims, r == Reducer::Max ? Reducer::Or : Reducer::And)};
      return {reduce_mm(x, dims, r)};
    });
  }
  for (auto [name, is_max] : {std::pair{"max.dim", true}, std::pair{"min.dim", false}}) {
    bool mx = is_max;
    reg(name, [mx](Ctx& c) -> V {
      Value x = at_least_1d(c.b, c.in(0));
      auto [v, i] = c.b.reduce_arg(x, wrap_dim(c.i64(1), x.rank()), mx);
      return {v, i};
    });
  }
  for (auto [name, is_max] : {std::pair{"argmax", true}, std::pair{"argmin", false}}) {
    bool mx = is_max;
    reg(name, [mx](Ctx& c) -> V {
      Value x = c.in(0);
      if (c.is_none(1)) return {c.b.reduce_arg(c.b.reshape(x, {x.type.numel()}), 0, mx).second};
      x = at_least_1d(c.b, x);
      return {c.b.reduce_arg(x, wrap_dim(c.i64(1), x.rank()), mx).second};
    });
  }
  // (self, *, dim?, keepdim) -> (min, max)
  reg("aminmax", [](Ctx& c) -> V {
    Ex x(c.b, c.in(0));
    auto dims = dims_arg(c, 1, x.v.rank());
    if (x.v.dtype() == DType::Bool)
      return {reduce(x, dims, Reducer::And), reduce(x, dims, Reducer::Or)};
    return {reduce_mm(x, dims, Reducer::Min), reduce_mm(x, dims, Reducer::Max)};
  });
  // Order statistics by selection (Builder::kth_smallest): median (lower middle),
  // kthvalue and nanmedian. NaN counts largest, as in torch's sort order.
  reg("median", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    int64_t n = x.type.numel();
    Value k = b.constant_int((n - 1) / 2, DType::I64);
    Ex m(b, b.reshape(b.kth_smallest(b.reshape(x, {n}), 0, b.reshape(k, {1})).first, {}));
    if (!is_float(x.dtype())) return {m};
    Ex xv(b, x);
    return {
        where(reduce(xv.cmp(Cmp::NE, xv), reduce_dims({}, x.rank()), Reducer::Or), m.k(NAN), m)};
  });
  // median.dim(self, dim, keepdim) / kthvalue(self, k, dim, keepdim)
  for (auto [name, kth] : {std::pair{"median.dim", false}, std::pair{"kthvalue", true}}) {
    bool is_kth = kth;
    reg(name, [is_kth](Ctx& c) -> V {
      Builder& b = c.b;
      Value x = at_least_1d(b, c.in(0));
      int64_t dim = wrap_dim(c.i64(is_kth ? 2 : 1), x.rank()), n = x.shape()[dim];
      Shape ks = x.shape();
      ks[dim] = 1;
      Ex k(b,
           b.splat(static_cast<double>(is_kth ? c.i64(1) - 1 : (n - 1) / 2), Type{DType::I64, ks}));
      if (!is_kth && is_float(x.dtype())) {
        // A row holding NaN has median NaN at its first NaN: the smallest of the
        // row's NaNs, which rank above every other value.
        Ex xv(b, x);
        Ex nans(b, reduce_sum(b, xv.cmp(Cmp::NE, xv).to(DType::I64).v, {dim}, true));
        k = where(nans.cmp(Cmp::GT, nans.k(0)), nans.k(static_cast<double>(n)) - nans, k);
      }
      auto [value, index] = b.kth_smallest(x, dim, k.v);
      return {value, index};
    });
  }
  // nanmedian(): the lower middle of the non-NaN values (NaN if none).
  reg("nanmedian", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = c.in(0);
    int64_t n = x.type.numel();
    Value flat = b.reshape(x, {n});
    Ex xv(b, flat);
    Ex cnt(b, b.reshape(reduce_sum(b, xv.cmp(Cmp::EQ, xv).to(DType::I64).v, {0}, true), {1}));
    Ex k = maximum(cnt - 1.0, cnt.k(0)) / 2.0;
    return {b.reshape(b.kth_smallest(flat, 0, k.v).first, {})};
  });
  // nanmedian.dim(self, dim, keepdim) -> (values, indices)
  reg("nanmedian.dim", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0));
    int64_t dim = wrap_dim(c.i64(1), x.rank());
    Ex xv(b, x);
    Ex cnt(b, reduce_sum(b, xv.cmp(Cmp::EQ, xv).to(DType::I64).v, {dim}, true));
    Ex k = maximum(cnt - 1.0, cnt.k(0)) / 2.0;
    auto [value, index] = b.kth_smallest(x, dim, k.v);
    return {value, index};
  });
  // mode(self, dim, keepdim) -> (values, indices): the value of the longest
  // run of equals after sorting (the smallest on ties), with the original
  // index of its last element in the stable sort. A run's length is its last
  // position less its first (a running max of run starts), so the cost stays a
  // sort where comparing every pair of entries took n^2 (3.4 s for [64, 4096]).
  reg("mode", [](Ctx& c) -> V {
    Builder& b = c.b;
    Value x = at_least_1d(b, c.in(0));
    int64_t r = x.rank(), dim = wrap_dim(c.i64(1), r), n = x.shape()[dim];
    auto [sorted, index] = b.sort_indexed(x, dim, false);
    Ex sv(b, sorted);
    // Each entry beside its neighbours along dim; the entries the rolls wrap
    // around to the ends are masked by position below.
    Ex prev(b, roll_dim(b, sorted, 1, dim)), next(b, roll_dim(b, sorted, -1, dim));
    Ex pos(b, b.iota(Type{DType::I32, x.shape()}, dim));
    Ex first = pos.cmp(Cmp::EQ, pos.k(0)).bin("or", sv.cmp(Cmp::NE, prev));
    Ex last = pos.cmp(Cmp::EQ, pos.k(static_cast<double>(n - 1))).bin("or", sv.cmp(Cmp::NE, next));
    Ex start = scan(where(first, pos, pos.k(0)), dim, Reducer::Max);
    // NaN never equals itself: its runs score nothing, as a lone NaN's would.
    Ex score = where(last.bin("and", sv.cmp(Cmp::EQ, sv)), pos - start + 1.0, pos.k(0));
    Value at = b.reduce_arg(score.v, dim, true).second;
    Shape ks = x.shape();
    ks[dim] = 1;
    Value k = b.reshape(at, ks);
    return {b.take_along(sorted, k, dim), b.take_along(index, k, dim)};
  });
  for (const char* n : {"any", "any.dim", "any.dims", "all", "all.dim", "all.dims"}) {
    Reducer r = n[1] == 'n' ? Reducer::Or : Reducer::And;
    bool hd = std::string(n).find('.') != std::string::npos;
    reg(n, [r, hd](Ctx& c) -> V {
      Ex x = as_bool(Ex(c.b, c.in(0)));
      return {reduce(x, dims_arg(c, hd ? 1 : -1, x.v.rank()), r)};
    });
  }
}

TPU_LOWERING(reduce_stats) {
  // (self, dim?, *, correction?, keepdim)
  reg("var.correction", [](Ctx& c) -> V { return {var_mean(c, 1, 2, 3).first}; });
  reg("std.correction", [](Ctx& c) -> V { return {var_mean(c, 1, 2, 3).first.un("sqrt")}; });
  reg("var_mean.correction", [](Ctx& c) -> V {
    auto [v, m] = var_mean(c, 1, 2, 3);
    return {v, m};
  });
  reg("std_mean.correction", [](Ctx& c) -> V {
    auto [v, m] = var_mean(c, 1, 2, 3);
    return {v.un("sqrt"), m};
  });
  spec("linalg_vector_norm", {.attribute_scalars = {1}});
  spec("norm", {.attribute_scalars = {1}});
  reg("linalg_vector_norm", [](Ctx& c) -> V {
    Ex x = input(c);
    return {vector_norm(x, dims_arg(c, 2, x.v.rank()), false, c.arg(1).toScalar().toDouble())};
  });
  // norm.Scalar(self, p=2); norm.ScalarOpt_dim(self, p?, dim, keepdim);
  // norm.ScalarOpt_dtype(self, p?, *, dtype).
  for (const char* n : {"norm.Scalar", "norm.ScalarOpt_dim", "norm.ScalarOpt_dtype"}) {
    bool has_dim = std::string(n) == "norm.ScalarOpt_dim";
    reg(n, [has_dim](Ctx& c) -> V {
      Ex x = input(c);
      double p = c.is_none(1) ? 2.0 : c.arg(1).toScalar().toDouble();
      auto dims = has_dim ? dims_arg(c, 2, x.v.rank()) : reduce_dims({}, x.v.rank());
      return {vector_norm(x, dims, false, p)};
    });
  }
  // (self, p, dim, maxnorm): slices along dim with p-norm above maxnorm are
  // scaled down to it.
  reg("renorm", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Ex x = in_as(c, 0, t);
    int64_t dim = wrap_dim(c.i64(2), x.v.rank());
    std::vector<int64_t> dims;
    for (int64_t k = 0; k < x.v.rank(); ++k)
      if (k != dim) dims.push_back(k);
    Ex p(c.b, c.scalar(1, t)), maxnorm(c.b, c.scalar(3, t));
    Ex sum(c.b, reduce_sum(c.b, x.un("abs").bin("power", p).v, dims, true));
    Ex amax(c.b, c.b.reduce(x.un("abs").v, c.b.constant(0, t), dims, Reducer::Max));
    amax = Ex(c.b, c.b.reshape(amax.v, sum.v.shape()));
    Ex norm = where(p.cmp(Cmp::EQ, p.k(INFINITY)), amax, sum.bin("power", 1.0 / p));
    Ex factor = where(norm.cmp(Cmp::GT, maxnorm), maxnorm / (norm + 1e-7), norm.k(1));
    return {x * factor};
  });
  // hash_tensor(self, dim, keepdim, mode=0): XOR of the elements' bits, read
  // as uint64 after floats widen to float64 and integers to int64 (as the CPU).
  reg("hash_tensor", [](Ctx& c) -> V {
    if (c.i64(3) != 0)
      throw hlo::BuildError("[lower] hash_tensor: mode " + std::to_string(c.i64(3)) +
                            " is not defined (0: xor_sum)");
    Builder& b = c.b;
    Value x = c.in(0);
    if (is_complex(x.dtype())) throw hlo::DTypeError("[lower] hash_tensor: complex input");
    x = b.convert(x, is_float(x.dtype()) ? DType::F64 : DType::I64);
    Ex bits(b, b.bitcast_convert(x, DType::U64));
    return {reduce(bits, dims_arg(c, 1, bits.v.rank()), Reducer::Xor, c.flag(2))};
  });
  // embedding_renorm_(weight, indices, max_norm, norm_type): the rows indices
  // name whose norm is above max_norm are scaled down to it. Repeated indices
  // write the same row twice.
  reg("embedding_renorm", [](Ctx& c) -> V {
    DType t = math_dtype(c);
    Builder& b = c.b;
    Value w = b.convert(c.in(0), t);
    Value idx = b.convert(c.in(1), DType::I64);
    idx = b.reshape(idx, {idx.type.numel()});
    Ex rows(b, b.index_select(w, idx, 0));
    Ex norm = vector_norm(rows, {1}, true, c.f64(3));
    double max_norm = c.f64(2);
    Ex factor = where(norm.cmp(Cmp::GT, norm.k(max_norm)), max_norm / (norm + 1e-7), norm.k(1));
    Value scaled = b.broadcast_in_dim(factor.v, rows.v.shape(), {0, 1});
    return {b.scatter_slices(w, idx, (rows * Ex(b, scaled)).v, 0, false)};
  });
}

TPU_LOWERING(reduce_softmax) {
  // (self, dim, half_to_float) / _safe_softmax(self, dim, dtype?)
  for (const char* n : {"_softmax", "_safe_softmax", "_log_softmax"}) {
    std::string name = n;
    reg(n, [name](Ctx& c) -> V {
      Ex x = input(c);
      Value xv = at_least_1d(c.b, x.v);
      x = Ex(c.b, xv);
      std::vector<int64_t> d{wrap_dim(c.i64(1), xv.rank())};
      Ex m = reduce(x, d, Reducer::Max, true);
      Ex m0 = where(m.un("abs").cmp(Cmp::EQ, m.k(INFINITY)), m.k(0), m);
      Ex z = x - m0;
      Ex s = reduce(z.un("exponential"), d, Reducer::Add, true);
      if (name == "_log_softmax") return {z - s.un("log")};
      Ex y = z.un("exponential") / s;
      // Rows that are entirely -inf give 0 instead of NaN.
      if (name == "_safe_softmax") y = where(m.cmp(Cmp::EQ, m.k(-INFINITY)), y.k(0), y);
      return {y};
    });
  }
  // (grad_output, output, dim, input_dtype)
  reg("_softmax_backward_data", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex g(c.b, at_least_1d(c.b, c.b.convert(c.in(0), t)));
    Ex y(c.b, at_least_1d(c.b, c.b.convert(c.in(1), t)));
    std::vector<int64_t> d{wrap_dim(c.i64(2), g.v.rank())};
    Ex gy = g * y;
    return {gy - y * reduce(gy, d, Reducer::Add, true)};
  });
  reg("_log_softmax_backward_data", [](Ctx& c) -> V {
    DType t = compute_dtype(c.out(0).dtype);
    Ex g(c.b, at_least_1d(c.b, c.b.convert(c.in(0), t)));
    Ex y(c.b, at_least_1d(c.b, c.b.convert(c.in(1), t)));
    std::vector<int64_t> d{wrap_dim(c.i64(2), g.v.rank())};
    return {g - y.un("exponential") * reduce(g, d, Reducer::Add, true)};
  });
}

}  // namespace
}  // namespace torchtpu::lower
