// StableHLO text builder: typed SSA values and op emitters. No torch, no Python.
// A Builder makes one module with a single `func.func public @main`.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/dtype.h"

namespace torchtpu::hlo {

using Shape = std::vector<int64_t>;

struct Type {
  DType dtype = DType::F32;
  Shape shape;  // empty = rank 0
  int64_t rank() const { return static_cast<int64_t>(shape.size()); }
  int64_t numel() const;
  std::string str() const;  // "tensor<2x3xf32>", "tensor<f32>"
  bool operator==(const Type&) const = default;
};

struct Value {
  // Results of multi-result ops get their own ids and print as %v<k>#<i>.
  int id = -1;  // SSA number: printed as %v<id> (parameters as %arg<n>)
  Type type;
  const Shape& shape() const { return type.shape; }
  DType dtype() const { return type.dtype; }
  int64_t rank() const { return type.rank(); }
  bool valid() const { return id >= 0; }
};

// Thrown on malformed requests (rank/shape mismatch); message names the op.
class BuildError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An op asked for element types StableHLO does not define it on (exponential
// of integers, subtract of booleans): the request, not the builder, is wrong.
class DTypeError : public BuildError {
 public:
  using BuildError::BuildError;
};

// How a float32 (or complex64) dot or convolution may round its products:
// stablehlo's precision_config. XLA:CPU computes in float32 at any setting;
// XLA:GPU takes DEFAULT as leave to use TF32 and HIGHEST as float32 proper.
enum class Precision { Default, High, Highest };
struct FloatPrecision {
  Precision dot = Precision::Highest;
  Precision conv = Precision::Highest;
  bool operator==(const FloatPrecision&) const = default;
};
// Process-wide, read as programs are built (the aten layer sets it from
// torch's float32 matmul and cuDNN TF32 settings); other dtypes emit DEFAULT.
void set_float_precision(FloatPrecision p);
FloatPrecision float_precision();
// The `precision_config = [...]` attribute of a dot or convolution whose
// operands are `operands`: `p` for F32/C64, DEFAULT otherwise.
std::string precision_config(DType operands, Precision p);

enum class Cmp { EQ, NE, LT, LE, GT, GE };
// stablehlo.fft kinds; the inverse ones (IFFT, IRFFT) divide by the length.
enum class Fft { FFT, IFFT, RFFT, IRFFT };
enum class Reducer { Add, Mul, Max, Min, And, Or, Xor };
// "sum", "prod", "max", "min", "band", "bor", "bxor"; BuildError otherwise.
Reducer reducer_named(const std::string& name);

class Builder {
 public:
  // Adds a @main parameter. `donate` marks it `jax.buffer_donor = true`.
  Value param(const Type& type, bool donate = false);
  // A rank-0 program input of dtype `d` that arrives packed: all scalars of a
  // dtype come in one rank-1 parameter, after the param()s, so a program with
  // hundreds of scalars takes a few buffers instead of hundreds.
  Value packed_scalar(DType d);
  // The packs' dtypes in parameter order and their sizes.
  std::vector<std::pair<DType, int>> packs() const;
  // Sets @main's results. Must be called exactly once, after all ops.
  void ret(const std::vector<Value>& results);
  // The complete module text.
  std::string module() const;

  // --- constants and generators
  Value constant(double v, DType dtype);       // rank-0 scalar
  Value constant_int(int64_t v, DType dtype);  // exact for 64-bit ints
  Value splat(double v, const Type& type);     // broadcast scalar constant
  Value iota(const Type& type, int64_t dim);

  // --- elementwise. `op` is the StableHLO name without prefix ("add", "exponential").
  // Operands must already have identical shapes (use broadcast_in_dim first).
  Value unary(const char* op, Value x);
  Value binary(const char* op, Value a, Value b);
  Value compare(Cmp dir, Value a, Value b);  // compare type picked from dtype
  Value select(Value pred, Value on_true, Value on_false);
  Value clamp(Value lo, Value x, Value hi);
  // No-op when dtype already matches; complex -> real keeps the real part.
  Value convert(Value x, DType to);
  // stablehlo.complex: a C64/C128 value from f32/f64 parts of one shape.
  Value complex(Value re, Value im);
  // A CHLO op ("lgamma", "digamma", "polygamma", "zeta", ...) that the plugin
  // legalizes to StableHLO itself; operands of identical shapes.
  Value chlo(const char* op, const std::vector<Value>& args, const Type& out);
  // chlo.top_k: the k largest along the last dim, in descending order, ties by
  // lower index; (values, I32 indices). XLA:CPU runs F32 as a partial sort.
  std::pair<Value, Value> top_k(Value x, int64_t k);
  Value bitcast_convert(Value x, DType to);  // same itemsize only
  // Reinterprets the bytes of a rank-1 value as another dtype (any element
  // sizes; bool is read as one byte per element; complex as its interleaved
  // real and imaginary parts). Length scales accordingly.
  Value reinterpret_flat(Value x, DType to);

  // --- shape
  Value reshape(Value x, const Shape& shape);  // no-op when shape matches
  Value broadcast_in_dim(Value x, const Shape& shape, const std::vector<int64_t>& dims);
  Value transpose(Value x, const std::vector<int64_t>& perm);
  // x with dims a and b exchanged (x itself when a == b; its own inverse).
  Value swap_dims(Value x, int64_t a, int64_t b);
  Value slice(Value x, const Shape& start, const Shape& limit, const Shape& strides);
  Value dynamic_slice(Value x, const std::vector<Value>& starts, const Shape& sizes);
  Value dynamic_update_slice(Value x, Value update, const std::vector<Value>& starts);
  Value concatenate(const std::vector<Value>& xs, int64_t dim);
  // Whether `v` was made by a concatenate op (not folded into a slice).
  bool is_join(const Value& v) const { return joined_.count(v.id) > 0; }
  Value pad(Value x, Value pad_value, const Shape& lo, const Shape& hi, const Shape& interior);
  Value reverse(Value x, const std::vector<int64_t>& dims);

  // --- reductions
  Value reduce(Value x, Value init, const std::vector<int64_t>& dims, Reducer r);
  // One variadic reduce of same-shaped values (XLA makes one kernel of it
  // where a reduce per value makes one each, or two after its tree split).
  std::vector<Value> reduce_each(const std::vector<Value>& xs, Value init,
                                 const std::vector<int64_t>& dims, Reducer r);

  // Cross-replica collectives (builder_collective.cpp): `groups` lists replica ids,
  // every group the same size; programs are compiled with num_replicas = all ids.
  using Groups = std::vector<std::vector<int64_t>>;
  Value all_reduce(Value x, Reducer r, const Groups& groups);
  Value all_gather(Value x, int64_t dim, const Groups& groups);
  Value reduce_scatter(Value x, int64_t dim, Reducer r, const Groups& groups);
  Value all_to_all(Value x, int64_t split_dim, int64_t concat_dim, const Groups& groups);
  // Sends x from replica pairs[i][0] to pairs[i][1]; replicas receiving nothing get zeros.
  Value collective_permute(Value x, const Groups& pairs);
  // The runtime's replica set of a program whose collectives span a group:
  // `tag` names the group to the runtime, replica r runs on devices[r]. One
  // per program (BuildError on a second, different one); tag -1 = none.
  struct Replication {
    int64_t tag = -1;
    std::vector<int64_t> devices;
  };
  void replicate(int64_t tag, std::vector<int64_t> devices);
  const Replication& replication() const { return replication_; }
  // Variadic reduce returning (max/min value, index) along one dim; index dtype I64.
  // Ties pick the smallest index; NaN wins (as torch.argmax).
  std::pair<Value, Value> reduce_arg(Value x, int64_t dim, bool is_max);
  Value reduce_window(Value x, Value init, Reducer r, const Shape& window, const Shape& strides,
                      const Shape& pad_lo, const Shape& pad_hi);

  // --- linear algebra
  Value dot_general(Value lhs, Value rhs, const std::vector<int64_t>& lhs_batch,
                    const std::vector<int64_t>& rhs_batch, const std::vector<int64_t>& lhs_contract,
                    const std::vector<int64_t>& rhs_contract, DType out);

  // Solves op(a) x = b (left) or x op(a) = b for triangular a [..., n, n]
  // (batch dims equal to b's); op transposes when `transpose_a`.
  Value triangular_solve(Value a, Value b, bool left_side, bool lower, bool unit_diagonal,
                         bool transpose_a);
  // Cholesky factor of a [..., n, n]; only the chosen triangle is defined.
  Value cholesky(Value a, bool lower);

  // --- convolution, windows and FFT (builder_conv.cpp)
  // stablehlo.convolution on NC(D)HW input, OI(D)HW kernel, NC(D)HW output.
  // Empty strides/dilations mean 1, empty padding 0 (padding may be negative).
  Value convolution(Value lhs, Value rhs, const std::vector<int64_t>& window_strides,
                    const std::vector<std::pair<int64_t, int64_t>>& padding,
                    const std::vector<int64_t>& lhs_dilation,
                    const std::vector<int64_t>& rhs_dilation, int64_t feature_group_count,
                    int64_t batch_group_count, DType out);
  // stablehlo.fft over x's trailing lengths.size() dims (1 to 3). RFFT takes a
  // real x and halves the last dim to n/2+1; IRFFT takes that many complex
  // values and returns lengths.back() real ones.
  Value fft(Value x, Fft type, const Shape& lengths);
  // reduce_window with window dilations (empty = 1).
  Value reduce_window_dilated(Value x, Value init, Reducer r, const Shape& window,
                              const Shape& strides, const Shape& dilations, const Shape& pad_lo,
                              const Shape& pad_hi);
  // Windowed max of x with the `idx` (I64, x's shape) of the element that won,
  // as torch's CPU max pooling: the first max in window order (smaller idx),
  // and NaN wins (the last NaN). Padding reads as -inf with idx INT64_MAX.
  std::pair<Value, Value> reduce_window_argmax(Value x, Value idx, const Shape& window,
                                               const Shape& strides, const Shape& dilations,
                                               const Shape& pad_lo, const Shape& pad_hi);

  // --- indexing. Simple forms cover torch's index ops:
  // gather_rows: out[i..., j...] = x[idx[i...], j...] along `dim` (idx integer, any rank).
  Value take_along(Value x, Value idx, int64_t dim);    // torch.gather semantics, idx same rank
  Value index_select(Value x, Value idx, int64_t dim);  // idx rank 1
  // scatter of `updates` (same rank as idx) into x along dim (torch.scatter / scatter_add).
  Value scatter_along(Value x, Value idx, Value updates, int64_t dim, bool add);
  // Inverse of index_select: whole slices of `updates` (x's shape with idx.numel() at dim)
  // go to the positions idx (rank 1) along dim. One index per slice, not per element.
  Value scatter_slices(Value x, Value idx, Value updates, int64_t dim, bool add);
  // Point gather/scatter on a flat rank-1 x with integer positions of any shape.
  Value gather_flat(Value x, Value positions);
  Value scatter_flat(Value x, Value positions, Value updates, bool add);

  // --- control flow
  using Body = std::function<std::vector<Value>(const std::vector<Value>&)>;
  // stablehlo.while over loop-carried `init`: `cond` maps the carried values
  // to a tensor<i1>, `body` to their next values (same types). The regions may
  // use values defined outside.
  std::vector<Value> while_loop(const std::vector<Value>& init,
                                const std::function<Value(const std::vector<Value>&)>& cond,
                                const Body& body);

  // --- other
  // Sort along dim; returns the sorted operands (first is the key). Stable unless
  // `stable` is false. Float keys order NaN above everything (below when descending).
  std::vector<Value> sort(const std::vector<Value>& xs, int64_t dim, bool descending,
                          bool stable = true);
  // Stable sort of x along dim with each element's original index there (I64), as
  // torch.sort(stable=True): NaN counts largest, -0.0 equals 0.0.
  std::pair<Value, Value> sort_indexed(Value x, int64_t dim, bool descending);
  // An order-preserving unsigned key of x (U32 up to 32 bits, U64 for 64-bit values):
  // keys compare as torch compares values, -0.0 equal to 0.0, every NaN equal and
  // above +inf.
  Value order_key(Value x);
  // The k-th smallest along dim (0-based; k I64 of x's shape with 1 at dim), in that
  // order, and the first index holding it, dim kept at size 1.
  std::pair<Value, Value> kth_smallest(Value x, int64_t dim, Value k);
  // stablehlo.rng_bit_generator, algorithm PHILOX; state is tensor<2xui64>.
  // Returns (new_state, bits) with bits of `type` (ui32 or ui64 element type).
  std::pair<Value, Value> rng_bit_generator(Value state, const Type& type);

  // --- a backend's own kernel: stablehlo.custom_call of `target` (XLA:GPU's
  // cuDNN attention), `config` its backend_config; operands row-major, results
  // in the minor-to-major `result_layouts` (one per result).
  std::vector<Value> custom_call(const std::string& target, const std::vector<Value>& args,
                                 const std::vector<Type>& results, const std::string& config,
                                 const std::vector<std::vector<int64_t>>& result_layouts);

  // --- functions from another producer (a JAX export). `text` holds
  // `func.func private` definitions, the first named `callee`; added once per
  // callee. A module holding any is marked `torchtpu.external`, so the compile
  // step knows to re-serialize it for the plugin's StableHLO version.
  void add_functions(const std::string& callee, const std::string& text);
  std::vector<Value> call(const std::string& callee, const std::vector<Value>& args,
                          const std::vector<Type>& results);
  bool has_functions() const { return !functions_.empty(); }
  // Whether a module text from module() holds such functions (its mark).
  static bool marks_external(std::string_view text) {
    return text.rfind("module @m attributes {torchtpu.external", 0) == 0;
  }

  int num_params() const { return static_cast<int>(params_.size()); }

 private:
  Value emit(const std::string& rhs_and_type, const Type& type);  // appends "%vN = ..."
  std::string name(const Value& v) const;
  std::vector<std::pair<Type, bool>> params_;
  std::vector<std::pair<DType, std::vector<std::string>>> packs_;  // names of packed scalars
  std::vector<std::string> lines_;
  std::vector<std::pair<std::string, std::string>> functions_;  // callee, text
  std::vector<Type> results_;
  std::string ret_line_;
  int next_id_ = 0;
  // Provenance, so the builder folds what a caller undoes: a reshape back to
  // a value's source shape is the source, and a rank-1 concatenation of
  // adjacent slices of one value is that value (or one slice of it).
  struct Piece {
    Value of;
    int64_t begin, end;
  };
  std::unordered_map<int, Value> reshape_src_;
  std::unordered_map<int, Piece> piece_;
  std::unordered_set<int> joined_;  // values a concatenate op made
  Replication replication_;

  // --- additive private helpers (builder.cpp / builder_index.cpp)
  Value new_value(std::string name, const Type& type);
  std::vector<Value> emit_multi(const std::string& rhs, const std::vector<Type>& types);
  // Generic form: "stablehlo.<op>"(args) <region> {attrs} : (arg types) -> results.
  std::string generic(const char* op, const std::vector<Value>& args, const std::string& attrs,
                      const std::vector<Type>& results, const std::string& region = {}) const;
  Value op(const char* op, const std::vector<Value>& args, const std::string& attrs,
           const Type& out, const std::string& region = {});
  // A one-block region whose body is built with this builder's own emitters.
  std::string region(const std::vector<Type>& args, const Body& body);
  // The reducer as its one op (collectives: XLA recognizes their reduction by it).
  std::string reducer_region(Reducer r, DType dtype, size_t n = 1);
  // The reducer of reduce and reduce_window: float max and min as compare and
  // select (builder_index.cpp says why).
  std::string fold_region(Reducer r, DType dtype, size_t n = 1);
  Value coords(Value idx, int64_t dim, int64_t rank);  // idx.shape + [rank] i64 coordinates
  Value gather(Value x, Value idx, const std::vector<int64_t>& offset_dims,
               const std::vector<int64_t>& dims, int64_t index_vector_dim, const Shape& slice_sizes,
               const Type& out);
  Value scatter(const char* who, Value x, Value idx, Value updates,
                const std::vector<int64_t>& dims, int64_t index_vector_dim, bool add,
                const std::vector<int64_t>& window_dims = {});
  static std::string arr(const std::vector<int64_t>& v);   // array<i64: 1, 0>
  static std::string list(const std::vector<int64_t>& v);  // [1, 0]
  [[noreturn]] static void fail(const char* op, const std::string& what);
  static void check_dims(const char* op, const std::vector<int64_t>& dims, int64_t rank);
  std::vector<std::string> names_;  // by id
  std::vector<Type> types_;         // by id
  bool has_ret_ = false;
};

}  // namespace torchtpu::hlo
