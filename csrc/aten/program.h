// Lowering op calls into one program: shared by Strict/Debug Eager (one call
// per program) and Fused Eager (a recorded graph of calls per program).
// Internal to csrc/aten.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <string>
#include <vector>

#include "aten/executor.h"

namespace torchtpu::aten {

// Where each program input comes from at run time.
struct InputSource {
  enum Kind : uint8_t { Storage, Host, Rng } kind;
  int node;   // call within the program (0 for single-call programs)
  int index;  // storage slot (Storage) or argument index
  int sub;    // element of a Tensor[] argument, -1 otherwise
  DType dtype;
  int64_t n;  // storage elements (Storage)
};

// A scalar program input: a Scalar argument or the value of a 0-dim host
// tensor (Python numbers reach ops as such "wrapped numbers"). Scalars travel
// packed, one rank-1 buffer per dtype (hlo::Builder::packed_scalar).
struct ScalarSource {
  int node;     // call within the program
  int index;    // argument index
  int sub;      // element of a Tensor[] or Scalar[] argument, -1 otherwise
  DType dtype;  // the pack: F64, I64 or Bool
};

// A storage as the program first sees it.
struct SlotState {
  bool has_value = false;  // false: never written, reads as zeros
  DType dtype = DType::U8;
  size_t nbytes = 0;
  bool produced = false;  // Fused: created by a call of this program
  bool donate = false;    // Fused: its input buffer may be reused for the output
};

// A program under construction.
struct Program {
  hlo::Builder b;
  std::vector<SlotState> slots;
  std::vector<hlo::Value> current;  // per slot: value after the calls lowered so far
  std::vector<InputSource> inputs;
  std::vector<ScalarSource> scalars;  // in creation order (= order within each pack)
  std::vector<int> written;           // slots written, in first-write order
  std::vector<int> param_of_slot;

  void add_slot(SlotState s) {
    slots.push_back(s);
    current.emplace_back();
    param_of_slot.push_back(-1);
  }
  // Current value of a storage slot (a parameter, zeros, or a written value).
  hlo::Value storage(int slot, DType dtype_if_empty);
  // Writes `v` through view `t` into slot `slot`'s storage.
  void write(int slot, const at::Tensor& t, hlo::Value v, const std::string& op);
};

// The storage slot of a tensor argument, or -1 for a host tensor.
using SlotOf = std::function<int(const at::Tensor&)>;

// Output metadata of one call (from PyTorch's meta kernel).
struct CallOutputs {
  std::vector<hlo::Type> types;
  std::vector<bool> undefined;  // outputs the op leaves undefined (masked-off grads)
  std::vector<int> ret_lists;   // per return: -1 single tensor, n = Tensor[] of n
};
CallOutputs call_outputs(const c10::OperatorHandle& op, const OpInfo& info,
                         const torch::jit::Stack& args, size_t first, size_t n);
// A foreach call's outputs from its element op's meta kernel, run per element
// (PyTorch's foreach meta kernels skip the element ops' checks and promotion).
CallOutputs foreach_outputs(const ForeachOp& f, const OpInfo& info, const torch::jit::Stack& args,
                            size_t first);
// A meta-device copy of an argument (tensors and tensor lists; CPU tensors of
// rank > 0 stay, so device mismatches raise as in eager).
c10::IValue to_meta(const c10::IValue& v);

// Lowers one call into `p` (node `node`): writes to aliased and mutated
// arguments go to their slots; returns the fresh outputs coerced to their
// types (invalid Values for undefined ones and aliased returns). Sets
// *rng_numel when the call draws random numbers.
std::vector<hlo::Value> lower_call(Program& p, int node, const OpInfo& info,
                                   const torch::jit::Stack& args, size_t first,
                                   const SlotOf& slot_of, const CallOutputs& outs,
                                   int64_t* rng_numel);

// A call on the stack and its structural cache key: op, attributes, tensor
// metadata, storages numbered by first use; Scalars are keyed by kind. Throws
// the error of a failed fused graph that should have produced an argument.
struct CallKey {
  size_t n = 0, first = 0;  // number of arguments, position of the first
  std::vector<DeviceStorage*> storages;
  std::string key;
};
CallKey key_call(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& stack);
// Elements of `dtype` in a storage of `nbytes` (which must hold whole ones).
int64_t storage_elems(size_t nbytes, DType dtype);
// The pack a scalar of `d` travels in.
DType pack_dtype(DType d);
// The value of a Scalar argument, or of a 0-dim host tensor (sub >= 0: list element).
c10::Scalar scalar_of(const c10::IValue& v, int sub);
// The packed scalar buffers of one run, in `packs` order (memoized by content).
std::vector<pjrt::BufferPtr> scalar_packs(const std::vector<ScalarSource>& scalars,
                                          const std::vector<std::pair<DType, int>>& packs,
                                          const std::function<c10::Scalar(const ScalarSource&)>& of,
                                          int device);
// The call's explicit generator argument, if any.
std::optional<at::Generator> find_generator(const torch::jit::Stack& args, size_t first, size_t n);
// Uploads a host tensor argument (sub >= 0: element of a list).
pjrt::BufferPtr host_input(const c10::IValue& v, int sub, int device);
// Resizes out= arguments to the meta kernel's sizes (memoized per call key);
// true when any changed.
bool resize_outs(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& args,
                 size_t first, size_t n, const std::string& key);
// The op's returns on the stack: aliased arguments or fresh tensors.
void push_returns(const OpInfo& info, const std::vector<int>& ret_lists,
                  std::vector<at::Tensor>& fresh, torch::jit::Stack& stack, size_t first);

}  // namespace torchtpu::aten
