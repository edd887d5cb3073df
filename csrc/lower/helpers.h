// Small shared helpers for lowering rules (torch semantics on hlo values).
#pragma once
#include "lower/registry.h"

namespace torchtpu::lower {

// Right-aligned (numpy/torch) broadcast of x to `shape`.
Value broadcast_to(Builder& b, Value x, const Shape& shape);
// Converts and broadcasts x to exactly `t`.
Value coerce(Builder& b, Value x, const Type& t);
// Rotates x by `shift` along dim (torch.roll: element i moves to i + shift).
Value roll_dim(Builder& b, Value x, int64_t shift, int64_t dim);
// Integer index as i64 with negative entries counted from the end of `size`.
Value wrap_index(Builder& b, Value idx, int64_t size);
// Constant of type t filled with v.
inline Value full(Builder& b, double v, const Type& t) { return b.splat(v, t); }
// The permutation that undoes `perm` (transpose by perm, then by this).
std::vector<int64_t> inverse_permutation(const std::vector<int64_t>& perm);
// Wraps a possibly negative dim into [0, rank).
int64_t wrap_dim(int64_t dim, int64_t rank);
// Dims list (int[] arg, possibly empty = all dims) wrapped and sorted.
std::vector<int64_t> reduce_dims(const std::vector<int64_t>& dims, int64_t rank);
// Shape after removing (keepdim=false) or setting to 1 (keepdim=true) `dims`.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);
// Elementwise binary op computed in `compute` dtype, on operands broadcast to `shape`.
Value elementwise(Builder& b, const char* op, Value x, Value y, const Shape& shape, DType compute);
// Identity element for a reduction in dtype.
Value reduce_init(Builder& b, hlo::Reducer r, DType dtype);
// Sum over dims keeping rank (keepdim) or not.
Value reduce_sum(Builder& b, Value x, const std::vector<int64_t>& dims, bool keepdim);
// Sums of same-shaped values over the same dims as variadic reduces: one or
// two XLA kernels for all of them (separate sums take one or two each). Over
// more than 1024 elements in two stages of about sqrt(n) elements each, so
// rounding stays near XLA's own split of a single large sum. Short sums down
// columns stay separate reduces (faster there).
std::vector<Value> reduce_sums(Builder& b, const std::vector<Value>& xs, std::vector<int64_t> dims);
// Matmul with torch.matmul broadcasting for rank >= 1 operands, result in `out` dtype.
Value matmul(Builder& b, Value x, Value y, DType out);

}  // namespace torchtpu::lower

// ---- Additions for the op rule files (elementwise, reduce, nn, index, shape, creation).
namespace torchtpu::lower {

// Dtype to do math in: f16/bf16 compute in f32 (as torch CPU does), others as is.
constexpr DType compute_dtype(DType t) {
  return t == DType::F16 || t == DType::BF16 ? DType::F32 : t;
}
// numpy/torch broadcast of two shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b);

// torch.result_type over operands; kind: 0 = tensor with dims, 1 = 0-dim
// tensor, 2 = Python scalar (a float scalar counts as the default float32).
struct Operand {
  DType dtype;
  int kind;
};
DType result_type(const std::vector<Operand>& ops);
// Operand for a tensor value (0-dim tensors promote like scalars).
inline Operand operand(const Value& v) { return {v.dtype(), v.rank() == 0 ? 1 : 0}; }
// Operand for a Scalar argument.
Operand scalar_operand(const c10::IValue& s);

// Arithmetic sugar: broadcasting ops on values of one dtype; plain numbers
// become constants of the other operand's type.
struct Ex {
  Builder* b;
  Value v;
  Ex(Builder& builder, Value value) : b(&builder), v(value) {}
  operator Value() const { return v; }
  Ex k(double c) const { return Ex(*b, b->splat(c, v.type)); }  // constant like this
  Ex un(const char* op) const { return Ex(*b, b->unary(op, v)); }
  Ex to(DType t) const { return Ex(*b, b->convert(v, t)); }
  Ex bin(const char* op, const Ex& o) const;
  Ex cmp(hlo::Cmp c, const Ex& o) const;  // bool result
};
Ex operator+(const Ex& x, const Ex& y);
Ex operator-(const Ex& x, const Ex& y);
Ex operator*(const Ex& x, const Ex& y);
Ex operator/(const Ex& x, const Ex& y);
Ex operator-(const Ex& x);
inline Ex operator+(const Ex& x, double c) { return x + x.k(c); }
inline Ex operator-(const Ex& x, double c) { return x - x.k(c); }
inline Ex operator*(const Ex& x, double c) { return x * x.k(c); }
inline Ex operator/(const Ex& x, double c) { return x / x.k(c); }
inline Ex operator+(double c, const Ex& x) { return x.k(c) + x; }
inline Ex operator-(double c, const Ex& x) { return x.k(c) - x; }
inline Ex operator*(double c, const Ex& x) { return x.k(c) * x; }
inline Ex operator/(double c, const Ex& x) { return x.k(c) / x; }
Ex maximum(const Ex& x, const Ex& y);
Ex minimum(const Ex& x, const Ex& y);
// Broadcasting select; pred is bool.
Ex where(const Ex& pred, const Ex& x, const Ex& y);
// Scalar constant with the given dtype, rank 0.
inline Ex scalar(Builder& b, double c, DType t) { return Ex(b, b.constant(c, t)); }
// Matrix helpers (dims may count from the end when negative).
// The index along `dim` of every element of shape s (i64).
Ex iota_along(Builder& b, const Shape& s, int64_t dim);
// Sum over `dim`, kept as size 1.
Ex sum_keep(const Ex& x, int64_t dim);
// x with its last two dims swapped.
Ex swap_last(const Ex& x);
// The batch dims followed by `tail`.
Shape with_batch(const Shape& batch, std::initializer_list<int64_t> tail);

// Contracts x's dim `d` with m's dim `md` (a matrix applied along one axis),
// keeping x's dim order: the result has m's free dim at position d.
Value contract(Builder& b, Value x, int64_t d, Value m, int64_t md);

// Complex conjugate; real values pass unchanged (complex.cpp).
Ex conj(const Ex& z);

// Singular values of a [..., m, n], descending, in a's dtype (linalg_eig.cpp).
Ex singular_values(const Ex& a);

// Argument i converted to t.
inline Ex in_as(Ctx& c, int i, DType t) { return Ex(c.b, c.b.convert(c.in(i), t)); }
// Tensor or Scalar argument i as a value of dtype t.
inline Ex arg_as(Ctx& c, int i, DType t) {
  if (c.arg(i).isTensor()) return Ex(c.b, c.b.convert(c.in(i), t));
  return Ex(c.b, c.scalar(i, t));
}
// The dtype an op computes in: its output's, widened for half types.
inline DType math_dtype(Ctx& c, int k = 0) { return compute_dtype(c.out(k).dtype); }

}  // namespace torchtpu::lower
