// StableHLO text emission: convolution, dilated / arg-max window reductions, FFT.
#include <cmath>
#include <limits>

#include "hlo/builder.h"

namespace torchtpu::hlo {
namespace {

std::string ints(const std::vector<int64_t>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + std::to_string(v[i]);
  return s;
}

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw BuildError(std::string("[hlo] ") + op + ": " + what);
}

// An empty list means `fill` for each of n dims.
std::vector<int64_t> or_fill(const std::vector<int64_t>& v, size_t n, int64_t fill) {
  return v.empty() ? std::vector<int64_t>(n, fill) : v;
}

std::string pad_attr(const std::vector<std::pair<int64_t, int64_t>>& pad) {
  std::string s = "dense<[";
  for (size_t i = 0; i < pad.size(); ++i)
    s += (i ? ", [" : "[") + std::to_string(pad[i].first) + ", " + std::to_string(pad[i].second) +
         "]";
  return s + "]> : tensor<" + std::to_string(pad.size()) + "x2xi64>";
}

// Output size of a window of `k` taps `dil` apart sliding by `stride` over a
// `base_dil`-dilated, padded dim of size n; -1 when the window does not fit.
int64_t window_out(int64_t n, int64_t k, int64_t stride, int64_t base_dil, int64_t win_dil,
                   int64_t lo, int64_t hi) {
  int64_t size = (n > 0 ? (n - 1) * base_dil + 1 : 0) + lo + hi;
  int64_t span = (k - 1) * win_dil + 1;
  if (k < 1 || stride < 1 || base_dil < 1 || win_dil < 1 || size < span) return -1;
  return (size - span) / stride + 1;
}

// Attributes and result shape of a reduce_window over x.
struct Window {
  std::string attrs;
  Shape out;
};
Window window_for(const char* op, const Type& x, const Shape& window, const Shape& strides,
                  const Shape& dilations, const Shape& pad_lo, const Shape& pad_hi) {
  size_t n = static_cast<size_t>(x.rank());
  Shape st = or_fill(strides, n, 1), dil = or_fill(dilations, n, 1);
  Shape lo = or_fill(pad_lo, n, 0), hi = or_fill(pad_hi, n, 0);
  if (window.size() != n || st.size() != n || dil.size() != n || lo.size() != n || hi.size() != n)
    fail(op, "window/strides/dilations/padding rank differs from " + x.str());
  Window w;
  std::vector<std::pair<int64_t, int64_t>> pad;
  for (size_t i = 0; i < n; ++i) {
    int64_t o = lo[i] < 0 || hi[i] < 0
                    ? -1
                    : window_out(x.shape[i], window[i], st[i], 1, dil[i], lo[i], hi[i]);
    if (o < 0)
      fail(op, "window [" + ints(window) + "] stride [" + ints(st) + "] dilation [" + ints(dil) +
                   "] does not fit " + x.str());
    w.out.push_back(o);
    pad.emplace_back(lo[i], hi[i]);
  }
  w.attrs = "window_dimensions = array<i64: " + ints(window) +
            ">, window_strides = array<i64: " + ints(st) +
            ">, window_dilations = array<i64: " + ints(dil) + ">";
  if (n > 0) w.attrs += ", padding = " + pad_attr(pad);
  return w;
}

}  // namespace

Value Builder::convolution(Value lhs, Value rhs, const std::vector<int64_t>& window_strides,
                           const std::vector<std::pair<int64_t, int64_t>>& padding,
                           const std::vector<int64_t>& lhs_dilation,
                           const std::vector<int64_t>& rhs_dilation, int64_t fgc, int64_t bgc,
                           DType out) {
  const char* op_name = "convolution";
  if (lhs.rank() < 2 || rhs.rank() != lhs.rank())
    fail(op_name,
         "need lhs and rhs of one rank >= 2, got " + lhs.type.str() + ", " + rhs.type.str());
  if (lhs.dtype() != rhs.dtype())
    fail(op_name, "operand types differ: " + lhs.type.str() + " vs " + rhs.type.str());
  size_t n = static_cast<size_t>(lhs.rank() - 2);
  Shape st = or_fill(window_strides, n, 1), ld = or_fill(lhs_dilation, n, 1);
  Shape rd = or_fill(rhs_dilation, n, 1);
  auto pad = padding.empty() ? std::vector<std::pair<int64_t, int64_t>>(n, {0, 0}) : padding;
  if (st.size() != n || ld.size() != n || rd.size() != n || pad.size() != n)
    fail(op_name,
         "strides/padding/dilations need " + std::to_string(n) + " entries for " + lhs.type.str());
  const Shape &ls = lhs.shape(), &rs = rhs.shape();
  if (fgc < 1 || bgc < 1 || (fgc > 1 && bgc > 1))
    fail(op_name, "feature_group_count " + std::to_string(fgc) + " / batch_group_count " +
                      std::to_string(bgc) + ": both >= 1, at most one > 1");
  if (ls[1] != rs[1] * fgc || rs[0] % fgc != 0 || ls[0] % bgc != 0 || rs[0] % bgc != 0)
    fail(op_name, "features of " + lhs.type.str() + " and kernel " + rhs.type.str() +
                      " do not fit feature_group_count " + std::to_string(fgc) +
                      ", batch_group_count " + std::to_string(bgc));
  Type t{out, {ls[0] / bgc, rs[0]}};
  for (size_t i = 0; i < n; ++i) {
    int64_t o = window_out(ls[i + 2], rs[i + 2], st[i], ld[i], rd[i], pad[i].first, pad[i].second);
    if (o < 0)
      fail(op_name, "kernel " + rhs.type.str() + " does not fit input " + lhs.type.str() +
                        " (stride [" + ints(st) + "], dilations [" + ints(ld) + "]/[" + ints(rd) +
                        "])");
    t.shape.push_back(o);
  }
  std::string sp;
  for (size_t i = 0; i < n; ++i) sp += ", " + std::to_string(i);
  std::string attrs = "batch_group_count = " + std::to_string(bgc) +
                      " : i64, dimension_numbers = #stablehlo.conv<[b, f" + sp + "]x[o, i" + sp +
                      "]->[b, f" + sp + "]>, feature_group_count = " + std::to_string(fgc) +
                      " : i64";
  if (n > 0)
    attrs += ", lhs_dilation = array<i64: " + ints(ld) + ">, padding = " + pad_attr(pad) +
             ", rhs_dilation = array<i64: " + ints(rd) +
             ">, window_strides = array<i64: " + ints(st) + ">";
  attrs += ", " + precision_config(lhs.dtype(), float_precision().conv);
  return op("convolution", {lhs, rhs}, attrs, t);
}

Value Builder::reduce_window_dilated(Value x, Value init, Reducer r, const Shape& window,
                                     const Shape& strides, const Shape& dilations,
                                     const Shape& pad_lo, const Shape& pad_hi) {
  if (init.rank() != 0 || init.dtype() != x.dtype())
    fail("reduce_window", "init " + init.type.str() + " for " + x.type.str());
  Window w = window_for("reduce_window", x.type, window, strides, dilations, pad_lo, pad_hi);
  std::string body = fold_region(r, x.dtype());
  return op("reduce_window", {x, init}, w.attrs, Type{x.dtype(), w.out}, body);
}

// The comparator is a total order (NaN by larger idx, then value, then smaller
// idx), so the reduction's evaluation order cannot change the winner.
std::pair<Value, Value> Builder::reduce_window_argmax(Value x, Value idx, const Shape& window,
                                                      const Shape& strides, const Shape& dilations,
                                                      const Shape& pad_lo, const Shape& pad_hi) {
  if (idx.dtype() != DType::I64 || idx.shape() != x.shape())
    fail("reduce_window_argmax", "idx " + idx.type.str() + " for " + x.type.str());
  DType dt = x.dtype();
  Value init_v;
  if (is_float(dt)) {
    init_v = constant(-INFINITY, dt);
  } else if (dt == DType::Bool || is_unsigned(dt)) {
    init_v = constant_int(0, dt);
  } else {
    int bits = static_cast<int>(itemsize(dt)) * 8;
    init_v = constant_int(
        bits == 64 ? std::numeric_limits<int64_t>::min() : -(int64_t{1} << (bits - 1)), dt);
  }
  Value init_i = constant_int(std::numeric_limits<int64_t>::max(), DType::I64);
  Window w = window_for("reduce_window_argmax", x.type, window, strides, dilations, pad_lo, pad_hi);
  Type sv{dt, {}}, si{DType::I64, {}};
  std::string body = region({sv, si, sv, si}, [&](const std::vector<Value>& a) {
    Value av = a[0], ai = a[1], bv = a[2], bi = a[3];
    Value a_first = compare(Cmp::LT, ai, bi);
    Value pick =
        binary("or", compare(Cmp::GT, av, bv), binary("and", compare(Cmp::EQ, av, bv), a_first));
    if (is_float(dt)) {
      Value an = compare(Cmp::NE, av, av), bn = compare(Cmp::NE, bv, bv);
      Value both = binary("and", an, bn);
      Value nan_pick = binary("or", binary("and", an, unary("not", bn)),
                              binary("and", both, unary("not", a_first)));
      pick = select(binary("or", an, bn), nan_pick, pick);
    }
    return std::vector<Value>{select(pick, av, bv), select(pick, ai, bi)};
  });
  std::vector<Type> outs{Type{dt, w.out}, Type{DType::I64, w.out}};
  auto r =
      emit_multi(generic("reduce_window", {x, idx, init_v, init_i}, w.attrs, outs, body), outs);
  return {r[0], r[1]};
}

Value Builder::fft(Value x, Fft type, const Shape& lengths) {
  const int64_t r = x.rank(), k = static_cast<int64_t>(lengths.size());
  if (k < 1 || k > 3 || k > r)
    fail("fft", "needs 1 to 3 lengths, at most the rank of " + x.type.str());
  const bool real_in = type == Fft::RFFT;
  if (real_in != !is_complex(x.dtype()) ||
      (real_in && x.dtype() != DType::F32 && x.dtype() != DType::F64))
    fail("fft", "wrong element type " + x.type.str());
  Type out = x.type;
  const int64_t n = lengths.back();
  Shape expect(x.shape().end() - k, x.shape().end());
  if (type == Fft::RFFT) {
    out = Type{complex_dtype(x.dtype()), x.shape()};
    out.shape.back() = n / 2 + 1;
  } else if (type == Fft::IRFFT) {
    out = Type{real_part_dtype(x.dtype()), x.shape()};
    out.shape.back() = n;
    expect.back() = n;
    if (x.shape().back() != n / 2 + 1)
      fail("fft", "IRFFT input needs n/2+1 values in its last dim");
  }
  if (expect != lengths) fail("fft", "lengths differ from the trailing dims of " + x.type.str());
  static const char* names[] = {"FFT", "IFFT", "RFFT", "IRFFT"};
  std::string attrs = std::string("fft_type = #stablehlo<fft_type ") +
                      names[static_cast<int>(type)] +
                      ">, fft_length = array<i64: " + ints(lengths) + ">";
  return op("fft", {x}, attrs, out);
}

}  // namespace torchtpu::hlo
