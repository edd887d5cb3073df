// Lowering op calls into one program: shared by Strict/Debug Eager (one call
// per program) and Fused Eager (a recorded graph of calls per program). A
// call's structural key, what a rule sees of the call (CallCtx), the
// program's inputs (storages, host tensors, packed scalars, RNG state) and
// the op's returns.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "aten/launch.h"
#include "aten/op_info.h"
#include "aten/runtime.h"
#include "lower/registry.h"
#include "lower/view.h"

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
  int node;            // call within the program
  int index;           // argument index
  int sub;             // element of a Tensor[] or Scalar[] argument, -1 otherwise
  DType dtype;         // the pack: F64, I64 or Bool
  bool extra = false;  // a runner-computed value (bucketed calls' geometry), number `sub`
};

// One output of a single-call program.
struct OutSpec {
  bool write;  // true: new value of storage `slot`; false: a fresh tensor
  int slot;
  DType dtype;
  std::vector<int64_t> sizes;
  bool undefined = false;  // an output the op leaves undefined (masked-off grads)
};

// A compiled program and how to feed it; `outs` and `ret_lists` describe a
// single call's results (Fused Eager's graphs keep their own).
struct ProgramEntry : Launchable {
  std::vector<InputSource> inputs;
  std::vector<ScalarSource> scalars;
  std::vector<std::pair<DType, int>> packs;
  std::vector<OutSpec> outs;   // fresh outputs first, then storage writes
  std::vector<int> ret_lists;  // per return: -1 single tensor, n = Tensor[] of n
  int64_t rng_numel = -1;
};

// What a runner supplies for one run of a ProgramEntry.
class InputFeed {
 public:
  virtual ~InputFeed() = default;
  virtual pjrt::BufferPtr storage(int slot) = 0;
  virtual pjrt::BufferPtr host(const InputSource& in) = 0;
  virtual void rng(const InputSource& in, uint64_t state[2]) = 0;
  virtual c10::Scalar scalar(const ScalarSource& s) = 0;
};
// The program's argument buffers, in the order the entry recorded them.
std::vector<pjrt::BufferPtr> gather_inputs(const ProgramEntry& entry, InputFeed& feed, int device);

// A storage as the program first sees it.
struct SlotState {
  bool has_value = false;  // false: never written, reads as zeros
  DType dtype = DType::U8;
  size_t nbytes = 0;
  bool produced = false;  // Fused: created by a call of this program
  bool donate = false;    // its input buffer may be reused for the output
};

// A program under construction.
struct Program {
  hlo::Builder b;
  std::vector<SlotState> slots;
  std::vector<hlo::Value> current;  // per slot: value after the calls lowered so far
  std::vector<InputSource> inputs;
  std::vector<ScalarSource> scalars;  // in creation order (= order within each pack)
  std::vector<int> written;           // slots written, in first-write order

  void add_slot(SlotState s) {
    slots.push_back(s);
    current.emplace_back();
  }
  // Current value of a storage slot (a parameter, zeros, or a written value).
  hlo::Value storage(int slot, DType dtype_if_empty);
  // Writes `v` through view `t` into slot `slot`'s storage.
  void write(int slot, const at::Tensor& t, hlo::Value v, const lower::Spec& spec);
  // Compiles the program returning `results` into `entry` (inputs, scalars,
  // packs, exe); when the environment variable `dump_dir` names a directory,
  // the StableHLO text is written there too (TORCHTPU_DUMP_FUSED).
  void finish(const std::vector<hlo::Value>& results, ProgramEntry& entry,
              CodegenParts parts = CodegenParts::One, const char* dump_dir = nullptr);
};

// The storage slot of a tensor argument, or -1 for a host tensor.
using SlotOf = std::function<int(const at::Tensor&)>;

// Whether a Scalar[] holds two or more values, all equal and of one kind.
bool uniform_scalars(const c10::List<c10::IValue>& l);

// The storage slot and element range [begin, end) that the tensors tile:
// contiguous views of one storage, each starting where the one before ends
// (parameters or optimizer state kept flat, torchtpu.optim.flatten).
struct Tiling {
  int slot;
  int64_t begin, end;
};
std::optional<Tiling> tiling(const c10::List<at::Tensor>& list, const SlotOf& slot_of);

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
// A boxed call of op (its `key` kernel, else the dispatcher's choice) that holds
// its own references to the arguments. torch 2.11's boxing of a kernel returning
// a tuple of references (topk.values, max_pool2d_with_indices.out, lstsq.solution)
// drops the arguments before it copies the results, so an out= tensor held only
// by the stack was freed and then released again: heap corruption that aborted at
// some later malloc.
void call_boxed_holding_args(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                             std::optional<c10::DispatchKey> key = std::nullopt);
// A meta-device copy of an argument (tensors and tensor lists; CPU tensors of
// rank > 0 stay, so device mismatches raise as in eager).
c10::IValue to_meta(const c10::IValue& v);
// Resizes out= arguments to the meta kernel's sizes (memoized per call key);
// true when any changed.
bool resize_outs(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& args,
                 size_t first, size_t n, const std::string& key);

// What a lowering rule sees of one call inside a Program.
class CallCtx final : public lower::Ctx {
 public:
  CallCtx(Program& p, int node, const OpInfo& info, const torch::jit::Stack& args, size_t first,
          const SlotOf& slot_of, const CallOutputs& outs)
      : Ctx(p.b),
        p_(p),
        node_(node),
        info_(info),
        args_(args),
        first_(first),
        slot_of_(slot_of),
        outs_(outs) {}

  const c10::IValue& arg(int i) const override { return args_[first_ + i]; }
  int num_args() const override { return static_cast<int>(info_.scalar_arg.size()); }
  const hlo::Type& out(int k) const override { return outs_.types.at(k); }
  int num_outputs() const override { return static_cast<int>(outs_.types.size()); }
  const std::string& op_name() const override { return info_.name; }
  hlo::Value in(int i) override;
  std::vector<hlo::Value> list(int i) override;
  hlo::Value flat_list(int i) override;
  bool tiles(int i) override {
    return (arg(i).isTensorList() && tiling(arg(i).toTensorList(), slot_of_).has_value()) ||
           Ctx::tiles(i);
  }
  hlo::Value scalar(int i, DType as) override { return packed(arg(i), i, -1, as); }
  hlo::Value scalar_at(int i, int e, DType as) override {
    return packed(arg(i).toList().get(e), i, e, as);
  }
  void update(int i, hlo::Value v) override {
    if (!is_none(i)) write(arg(i).toTensor(), v);
  }
  void update_at(int i, int e, hlo::Value v) override { write(arg(i).toTensorList().get(e), v); }
  hlo::Value rng_state(int64_t numel) override;

  void write(const at::Tensor& t, hlo::Value v) { p_.write(slot_of_(t), t, v, *info_.spec); }
  int64_t rng_numel() const { return rng_numel_; }
  // Tensor t (argument i, element sub of a list) as the program reads it.
  hlo::Value load(const at::Tensor& t, int i, int sub);

 private:
  // A runtime scalar (argument i, element sub) read from the program's pack.
  hlo::Value packed(const c10::IValue& v, int i, int sub, DType as);

  Program& p_;
  int node_;
  const OpInfo& info_;
  const torch::jit::Stack& args_;
  size_t first_;
  const SlotOf& slot_of_;
  const CallOutputs& outs_;
  int64_t rng_numel_ = -1;
};

// Lowers one call into `p` (node `node`): writes to aliased and mutated
// arguments go to their slots; returns the fresh outputs coerced to their
// types (invalid Values for undefined ones and aliased returns). Sets
// *rng_numel when the call draws random numbers.
std::vector<hlo::Value> lower_call(Program& p, int node, const OpInfo& info,
                                   const torch::jit::Stack& args, size_t first,
                                   const SlotOf& slot_of, const CallOutputs& outs,
                                   int64_t* rng_numel);
// The program of one call on its own: fresh outputs, then written storages.
// `donate`: slots whose input buffer the program may write its result into.
std::shared_ptr<ProgramEntry> compile_call(const c10::OperatorHandle& op, const OpInfo& info,
                                           const torch::jit::Stack& args, size_t first, size_t n,
                                           std::vector<DeviceStorage*>& storages,
                                           const std::vector<int>& donate = {});

// Appends v's bytes to a cache key.
template <typename T>
void put(std::string& k, const T& v) {
  k.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A call on the stack and its structural cache key: op, attributes, tensor
// metadata, storages numbered by first use; Scalars are keyed by kind. Throws
// the error of a failed fused graph that should have produced an argument.
struct CallKey {
  size_t n = 0, first = 0;  // number of arguments, position of the first
  std::vector<DeviceStorage*> storages;
  std::string key;
};
CallKey key_call(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& stack);
// Appends one argument's part of a call key (`scalar`: a runtime Scalar, keyed by kind).
void key_value(std::string& k, const c10::IValue& v, bool scalar,
               std::vector<DeviceStorage*>& slots);
// The slot of `s` in `storages` (appended when new).
int slot_index(std::vector<DeviceStorage*>& storages, DeviceStorage* s);

// Elements of `dtype` in a storage of `nbytes` (which must hold whole ones).
int64_t storage_elems(size_t nbytes, DType dtype);
// The value of a Scalar argument, or of a 0-dim host tensor (sub >= 0: list element).
c10::Scalar scalar_of(const c10::IValue& v, int sub);
// The call's explicit generator argument, if any.
std::optional<at::Generator> find_generator(const torch::jit::Stack& args, size_t first, size_t n);
// Uploads a host tensor argument (sub >= 0: element of a list).
pjrt::BufferPtr host_input(const c10::IValue& v, int sub, int device);
// The op's returns on the stack: aliased arguments or fresh tensors.
void push_returns(const OpInfo& info, const std::vector<int>& ret_lists,
                  c10::SmallVectorImpl<at::Tensor>& fresh, torch::jit::Stack& stack, size_t first);
// Short description of an op call for error messages: "aten::mm(f32[2, 3], f32[4, 5])".
std::string describe(const std::string& op, const torch::jit::Stack& args, size_t first, size_t n);
// A tensor's view of its storage, for lower::read_view / write_view.
inline lower::ViewGeom view_geom(const at::Tensor& t) {
  return {t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

}  // namespace torchtpu::aten
