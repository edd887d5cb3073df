// FFTs: _fft_r2c, _fft_c2r and _fft_c2c, which torch.fft.*, stft and istft
// (and their backward formulas) reach, through stablehlo.fft. XLA transforms
// at most three trailing dims and scales its inverses by 1/n; torch names any
// dims and a normalization (0: none, 1: 1/sqrt(n), 2: 1/n).
#include <algorithm>
#include <cmath>
#include <vector>

#include "lower/helpers.h"

namespace torchtpu::lower {
namespace {

using hlo::Fft;
using V = std::vector<Value>;

// The permutation putting `dims` last, in their order.
std::vector<int64_t> dims_last(int64_t rank, const std::vector<int64_t>& dims) {
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < rank; ++i)
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) perm.push_back(i);
  perm.insert(perm.end(), dims.begin(), dims.end());
  return perm;
}

// FFT or IFFT over the trailing k dims, three at a time (the transform is
// separable, so the groups may go in any order).
Value c2c_trailing(Builder& b, Value x, int64_t k, Fft type) {
  const int64_t r = x.rank(), m = std::min<int64_t>(k, 3);
  x = b.fft(x, type, Shape(x.shape().end() - m, x.shape().end()));
  if (k == m) return x;
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r - k; ++i) perm.push_back(i);
  for (int64_t i = r - m; i < r; ++i) perm.push_back(i);
  for (int64_t i = r - k; i < r - m; ++i) perm.push_back(i);
  x = c2c_trailing(b, b.transpose(x, perm), k - m, type);
  return b.transpose(x, inverse_permutation(perm));
}

// FFT/IFFT over the k dims before the last one.
Value c2c_before_last(Builder& b, Value x, int64_t k, Fft type) {
  if (k == 0) return x;
  const int64_t r = x.rank();
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < r - 1 - k; ++i) perm.push_back(i);
  perm.push_back(r - 1);
  for (int64_t i = r - 1 - k; i < r - 1; ++i) perm.push_back(i);
  x = c2c_trailing(b, b.transpose(x, perm), k, type);
  return b.transpose(x, inverse_permutation(perm));
}

// torch's normalization of a transform of n points, times `undo` (XLA's
// 1/n of inverse transforms is undone by undo = n).
Ex normalize(const Ex& y, int64_t mode, double n, double undo) {
  double s = undo * (mode == 1 ? 1.0 / std::sqrt(n) : mode == 2 ? 1.0 / n : 1.0);
  return s == 1.0 ? y : y * s;
}

struct Signal {
  Value moved;                // input with the transformed dims last
  std::vector<int64_t> perm;  // how it was moved
  double n = 1;               // points per transform (the input's signal sizes)
};
Signal signal(Ctx& c, Value x, int dims_arg) {
  Signal s;
  std::vector<int64_t> dims;
  for (int64_t d : c.ints(dims_arg)) dims.push_back(wrap_dim(d, x.rank()));
  for (int64_t d : dims) s.n *= static_cast<double>(x.shape()[d]);
  s.perm = dims_last(x.rank(), dims);
  s.moved = c.b.transpose(x, s.perm);
  return s;
}

TPU_LOWERING(fft) {
  // (self, dim[], normalization, forward)
  reg("_fft_c2c", [](Ctx& c) -> V {
    Signal s = signal(c, c.b.convert(c.in(0), c.out(0).dtype), 1);
    const bool fwd = c.flag(3);
    const int64_t k = static_cast<int64_t>(c.ints(1).size());
    Ex y(c.b, c2c_trailing(c.b, s.moved, k, fwd ? Fft::FFT : Fft::IFFT));
    y = normalize(y, c.i64(2), s.n, fwd ? 1.0 : s.n);
    return {c.b.transpose(y, inverse_permutation(s.perm))};
  });
  // (self, dim[], normalization, onesided): the last dim is halved when onesided.
  reg("_fft_r2c", [](Ctx& c) -> V {
    DType cd = c.out(0).dtype;
    Signal s = signal(c, c.b.convert(c.in(0), real_part_dtype(cd)), 1);
    const int64_t k = static_cast<int64_t>(c.ints(1).size());
    Value y;
    if (c.flag(3)) {
      y = c.b.fft(s.moved, Fft::RFFT, {s.moved.shape().back()});
      y = c2c_before_last(c.b, y, k - 1, Fft::FFT);
    } else {
      y = c2c_trailing(c.b, c.b.convert(s.moved, cd), k, Fft::FFT);
    }
    return {c.b.transpose(normalize(Ex(c.b, y), c.i64(2), s.n, 1.0), inverse_permutation(s.perm))};
  });
  // (self, dim[], normalization, last_dim_size): Hermitian input, the last dim
  // holding last_dim_size/2+1 values (others are cut off or read as zero).
  reg("_fft_c2r", [](Ctx& c) -> V {
    DType rd = c.out(0).dtype;
    Signal s = signal(c, c.b.convert(c.in(0), complex_dtype(rd)), 1);
    const int64_t k = static_cast<int64_t>(c.ints(1).size()), n = c.i64(3);
    Value x = s.moved;
    const int64_t r = x.rank(), have = x.shape().back(), want = n / 2 + 1;
    if (have > want) {
      Shape lim = x.shape();
      lim.back() = want;
      x = c.b.slice(x, Shape(r, 0), lim, Shape(r, 1));
    } else if (have < want) {
      Shape hi(r, 0);
      hi.back() = want - have;
      x = c.b.pad(x, c.b.constant(0, x.dtype()), Shape(r, 0), hi, Shape(r, 0));
    }
    x = c2c_before_last(c.b, x, k - 1, Fft::IFFT);
    Value y = c.b.fft(x, Fft::IRFFT, {n});
    double points = s.n / static_cast<double>(have) * static_cast<double>(n);
    return {c.b.transpose(normalize(Ex(c.b, y), c.i64(2), points, points),
                          inverse_permutation(s.perm))};
  });
}

}  // namespace
}  // namespace torchtpu::lower
