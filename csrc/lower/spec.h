// Per-op facts the engine needs beside a lowering rule, registered next to
// the rule (inside its TPU_LOWERING block) instead of as name lists in the
// layers that use them. Keyed by the op's base name: no overload and no
// trailing `_`, so one spec covers `scatter.src`, `scatter_.value`, `scatter.reduce_out`...
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <string>
#include <vector>

namespace torchtpu::lower {

// The arguments of one call, by position or by schema name.
struct CallArgs {
  const c10::FunctionSchema& schema;
  const c10::IValue* args;  // schema.arguments().size() values
  const c10::IValue& operator[](int i) const { return args[i]; }
  const c10::IValue* named(const char* name) const {
    auto i = schema.argumentIndexWithName(name);
    return i ? &args[*i] : nullptr;
  }
};

// Debug Eager checks integer indices before the op runs: XLA clamps
// out-of-range gathers and drops out-of-range scatters silently.
struct IndexCheck {
  enum Kind : uint8_t {
    AlongDim,  // arg `index` indexes dim arg(`dim`) of arg(`self`)
    EachDim,   // Tensor?[] arg `index`: element k indexes dim k of arg(`self`)
    SizeArg,   // arg `index` indexes dim 0 of a size given by int arg `self`
  } kind;
  int self = 0, dim = 1, index = 2;
  // Negative indices count from the end (advanced indexing, index_fill); the
  // other index ops reject them, as torch does.
  bool negative = false;
};

struct Spec {
  // Scalar arguments that shape the program (a norm's order, arange's
  // bounds): baked into the program and its key instead of passed at run time.
  std::vector<int> attribute_scalars;
  // float arguments passed at run time like Scalars (a fused optimizer's
  // learning rate), so a schedule that changes them never recompiles.
  std::vector<int> runtime_floats;
  std::vector<IndexCheck> index_checks;
  // Tensor?[] argument whose boolean masks become long indices before the
  // call (one data-dependent sync, as PyTorch's index kernels do), so the
  // meta kernel and the rule see static shapes; -1 for none.
  int mask_index_list = -1;
  // In-place writes may go through an expanded view (CPU allows fills there);
  // otherwise such a write raises as in eager.
  bool writes_expanded_views = false;
  // Where PyTorch's meta kernel disagrees with its CPU kernel (the reference),
  // this fixes the meta outputs to the CPU's metadata.
  void (*fix_shapes)(const CallArgs& args, std::vector<at::Tensor>& outs) = nullptr;
  // Where PyTorch's meta kernel rejects calls its CPU kernel runs (it checks
  // CUDA's limits), the outputs' metadata (meta tensors) instead of it.
  std::vector<at::Tensor> (*meta)(const CallArgs& args) = nullptr;
};

void spec(const std::string& base, Spec s);
// The spec of base name `base` (an empty spec when none was registered).
const Spec& spec_of(const std::string& base);
// The base name of "name.overload" or "name_.overload": "name".
std::string base_name(const std::string& op);

}  // namespace torchtpu::lower
