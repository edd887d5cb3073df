// One table of lowering rules: ATen op ("name.overload") -> StableHLO emitter.
// A rule is written once, for the functional form; in-place and out= variants
// are derived from the op schema by the dispatcher (csrc/aten/dispatch.cpp).
#pragma once
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "hlo/builder.h"
#include "lower/spec.h"

namespace torchtpu::lower {

using hlo::Builder;
using hlo::Shape;
using hlo::Type;
using hlo::Value;

// What a rule sees: the builder, its arguments (tensors already loaded as
// values in their own dtype and logical shape) and the output metadata that
// PyTorch's meta kernel computed for this call.
class Ctx {
 public:
  virtual ~Ctx() = default;
  Builder& b;
  explicit Ctx(Builder& builder) : b(builder) {}

  // Arguments by schema position.
  virtual const c10::IValue& arg(int i) const = 0;
  virtual int num_args() const = 0;
  // None, or an undefined tensor (autograd passes those for absent Tensor?).
  bool is_none(int i) const {
    const c10::IValue& v = arg(i);
    return v.isNone() || (v.isTensor() && !v.toTensor().defined());
  }
  // Tensor (or Tensor?) argument as a value; throws when absent.
  virtual Value in(int i) = 0;
  // Tensor[] / Tensor?[] argument; absent entries of Tensor?[] are invalid Values.
  virtual std::vector<Value> list(int i) = 0;
  // Tensor[] argument i flattened: its tensors' values, each flattened, one
  // after the other (rank 1). The runner gives a storage range directly when
  // the tensors tile one (foreach ops over flat parameters).
  virtual Value flat_list(int i);
  // Whether flat_list(i) needs no concatenation: the tensors are adjacent
  // slices of one value, or (the runner's answer) tile one storage range.
  virtual bool tiles(int i) { return !b.is_join(flat_list(i)); }
  // A Scalar argument (or a float one its spec lists in runtime_floats),
  // passed to the program at run time (so a changing learning rate never
  // recompiles), converted to `as`.
  virtual Value scalar(int i, DType as) = 0;
  // Element e of a Scalar[] argument, passed at run time like `scalar`.
  virtual Value scalar_at(int i, int e, DType as) = 0;
  // Attributes (baked into the program and its cache key).
  int64_t i64(int i) const { return arg(i).toInt(); }
  double f64(int i) const { return arg(i).toDouble(); }
  bool flag(int i) const { return arg(i).toBool(); }
  std::vector<int64_t> ints(int i) const { return arg(i).toIntVector(); }
  std::optional<int64_t> opt_i64(int i) const {
    return arg(i).isNone() ? std::nullopt : std::optional<int64_t>(arg(i).toInt());
  }

  // Writes `v` into mutable tensor argument i (a `Tensor(a!)` the op updates
  // without returning it, e.g. BatchNorm's running stats); no-op when absent.
  virtual void update(int i, Value v) = 0;
  // Writes `v` into element e of mutable Tensor[] argument i (a fused
  // optimizer's parameters and states).
  virtual void update_at(int i, int e, Value v) = 0;
  // The real size of tensor argument i along `dim` (an i64 scalar) when the
  // call runs at bucket sizes (aten/bucketed.h) and in(i) is padded along it;
  // nullopt when in(i) has its real size. Padding holds no neutral value for
  // a rule that asks: it must mask the positions past the size itself.
  virtual std::optional<Value> runtime_size(int, int64_t) { return std::nullopt; }
  // Output k as PyTorch's meta kernel computed it (dtype and sizes).
  virtual const Type& out(int k) const = 0;
  virtual int num_outputs() const = 0;
  // Philox state tensor<2xui64> = [seed, offset] for this call; the host
  // advances the device generator by `numel` values.
  virtual Value rng_state(int64_t numel) = 0;
  // Op name for error messages.
  virtual const std::string& op_name() const = 0;
};

// A rule returns one value per op output (any dtype/shape that converts and
// reshapes to out(k)); the executor casts to out(k).dtype.
using Rule = std::function<std::vector<Value>(Ctx&)>;

// `loc` is where the rule was registered (see rule_location).
void register_rule(const std::string& op, Rule rule,
                   std::source_location loc = std::source_location::current());
const Rule* find_rule(const std::string& op);
std::vector<std::string> registered_ops();
// Source file (as the compiler saw it) and line that registered `rule`, a
// pointer from find_rule; nullopt for a rule not in the table (a foreach op's).
std::optional<std::pair<std::string, int>> rule_location(const Rule* rule);

// Registers rules at static-initialization time:
//   TPU_LOWERING(relu) { reg("relu", [](Ctx& c) -> std::vector<Value> { ... }); }
struct Registrar {
  explicit Registrar(void (*fn)()) { fn(); }
};
#define TPU_LOWERING(tag)                                                       \
  static void tpu_lowering_##tag();                                             \
  static ::torchtpu::lower::Registrar tpu_registrar_##tag(&tpu_lowering_##tag); \
  static void tpu_lowering_##tag()

inline void reg(const std::string& op, Rule r,
                std::source_location loc = std::source_location::current()) {
  register_rule(op, std::move(r), loc);
}
// For helpers that register rules named by their caller (`binary("add", ...)`):
// they take a defaulted `loc` too and pass it here, so the rule points at the
// line that names its op.
inline void reg_at(std::source_location loc, const std::string& op, Rule r) {
  register_rule(op, std::move(r), loc);
}

}  // namespace torchtpu::lower
