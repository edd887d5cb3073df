// Strict/Debug Eager: every ATen op on tpu tensors becomes one cached
// executable built from its lowering rule.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>

#include "aten/runtime.h"
#include "lower/registry.h"
#include "lower/view.h"

namespace torchtpu::aten {

struct ForeachOp;  // foreach.cpp

// How an op maps onto a rule: the rule of its own name, or of its functional
// twin (in-place `foo_` -> `foo`, out= -> the overload with the same inputs).
struct OpInfo {
  std::string name;                   // "add_.Tensor"
  const lower::Rule* rule = nullptr;  // rule run for this op (maybe the functional twin's)
  bool is_out = false;                // has out= arguments
  std::vector<uint8_t> scalar_arg;    // per argument: 1 = Scalar (a runtime input)
  std::vector<int> ret_alias_arg;     // per return: index of the argument it writes, or -1
  // In-place foreach ops (`_foreach_add_`) return nothing: the functional
  // twin's k-th result is written into element k of this Tensor(a!)[] argument.
  int list_write_arg = -1;
  const ForeachOp* foreach = nullptr;  // set for `_foreach_*` ops lowered per element
  // An out= op's functional overload (same non-out arguments), when it has a rule.
  std::optional<c10::OperatorHandle> functional;
};
const OpInfo& op_info(const c10::OperatorHandle& op);
// Whether the op "aten::name.overload" exists and has a rule (its own or its twin's).
bool has_lowering(const std::string& qualified);
// How a `_foreach_*` op lowers: the rule of its per-element op (`add.Tensor`
// for `_foreach_add.List`) on each element of its lists. Sets scalar_arg for
// Scalar[] arguments the element op takes at run time. Null when no element
// op with a rule matches.
const ForeachOp* foreach_op(const c10::FunctionSchema& s, std::vector<uint8_t>& scalar_arg);
const lower::Rule* foreach_rule(const ForeachOp& f);
// Registers the tpu kernel for every `_foreach_*` op with a rule (PyTorch's
// composite per-tensor loop would otherwise run first, one call per tensor).
void register_foreach_kernels();
// Counts (and warns once per op about) a call run on the CPU.
void count_fallback(const std::string& name);

// Runs `op` through info.rule, writing in-place results into their storages.
void run_lowered(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack);

// New contiguous tpu tensor owning `buf` (rank-1, numel elements).
at::Tensor wrap_buffer(pjrt::BufferPtr buf, c10::IntArrayRef sizes, c10::ScalarType dtype,
                       int device);
// The tensor's values as a dense row-major buffer of its dtype (runs a
// program when the tensor is a strided view).
pjrt::BufferPtr dense_buffer(const at::Tensor& t, const char* why = "read");
// dst (any view, any dtype) := src (tpu tensor broadcastable to dst).
void device_copy(const at::Tensor& src, const at::Tensor& dst);
// dst (any view) := contiguous CPU tensor of dst's sizes and dtype.
void host_to_device(const at::Tensor& src, const at::Tensor& dst);
// A tensor's view of its storage, for lower::read_view / write_view.
inline lower::ViewGeom view_geom(const at::Tensor& t) {
  return {t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}
// Short description of an op call for error messages: "aten::mm(f32[2, 3], f32[4, 5])".
std::string describe(const std::string& op, const torch::jit::Stack& args, size_t first, size_t n);
// The executable of a program through the compile cache (memory, disk,
// shared root, or a compile); counts real compiles in metrics().
pjrt::ExecutablePtr compile_cached(const std::string& mlir);
// How many programs a per-process table keeps (TORCHTPU_CACHE_MEMORY_ENTRIES):
// a table over it is emptied, so unused executables are released.
size_t program_table_limit();
// Ops that ran through the CPU fallback, with counts.
std::vector<std::pair<std::string, int64_t>> fallback_report();
// Zero-initialized storage buffer of `nbytes` with element type `dtype`.
pjrt::BufferPtr zeros_buffer(DType dtype, int64_t n, int device);

}  // namespace torchtpu::aten
