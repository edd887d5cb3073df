#include "aten/strict.h"

#include <ATen/ops/full.h>
#include <ATen/ops/max.h>
#include <ATen/ops/min.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <string>

#include "aten/bucketed.h"
#include "aten/fused.h"
#include "aten/generator.h"
#include "aten/host_ops.h"
#include "aten/program.h"
#include "lower/types.h"

namespace torchtpu::aten {

namespace {

// Debug Eager: integer indices must be in range before the op runs (XLA
// clamps out-of-range gathers silently).
void check_index(const std::string& op, const at::Tensor& idx, int64_t size, int64_t dim,
                 bool negative) {
  if (!idx.defined() || idx.numel() == 0 || !c10::isIntegralType(idx.scalar_type(), false)) return;
  at::Tensor h = idx.to(c10::kCPU);
  int64_t lo = h.min().item<int64_t>(), hi = h.max().item<int64_t>();
  TORCH_CHECK_INDEX(lo >= (negative ? -size : 0) && hi < size, "[tpu] aten::", op, ": index ",
                    hi >= size ? hi : lo, " is out of bounds for dimension ", dim, " with size ",
                    size);
}

void debug_index_checks(const OpInfo& info, const torch::jit::Stack& args, size_t first) {
  auto arg = [&](int i) -> const c10::IValue& { return args[first + i]; };
  for (const lower::IndexCheck& c : info.spec->index_checks) {
    switch (c.kind) {
      case lower::IndexCheck::AlongDim: {
        const at::Tensor& self = arg(c.self).toTensor();
        int64_t dim =
            c10::maybe_wrap_dim(arg(c.dim).toInt(), std::max<int64_t>(self.dim(), 1), true);
        check_index(info.name, arg(c.index).toTensor(), self.dim() ? self.size(dim) : 1, dim,
                    c.negative);
        break;
      }
      case lower::IndexCheck::EachDim: {
        const at::Tensor& self = arg(c.self).toTensor();
        auto list = arg(c.index).toList();
        for (size_t k = 0; k < list.size() && static_cast<int64_t>(k) < self.dim(); ++k) {
          c10::IValue e = list.get(k);
          if (e.isTensor())
            check_index(info.name, e.toTensor(), self.size(k), static_cast<int64_t>(k), c.negative);
        }
        break;
      }
      case lower::IndexCheck::SizeArg:
        check_index(info.name, arg(c.index).toTensor(), arg(c.self).toInt(), 0, c.negative);
        break;
    }
  }
}

// Installs the outputs: new buffers of written storages, fresh tensors, and
// the op's returns (aliased arguments for in-place/out= ops) on the stack.
void push_results(const ProgramEntry& entry, const OpInfo& info,
                  const std::vector<pjrt::BufferPtr>& outs,
                  const std::vector<DeviceStorage*>& storages, int device, torch::jit::Stack& stack,
                  size_t first) {
  c10::SmallVector<at::Tensor, 4> fresh;
  size_t next = 0;
  for (const OutSpec& o : entry.outs) {
    if (o.undefined) {
      fresh.emplace_back();
    } else if (o.write) {
      DeviceStorage* st = storages[o.slot];
      st->buffer = outs[next++];
      st->dtype = o.dtype;
    } else {
      fresh.push_back(wrap_buffer(outs[next++], o.sizes, lower::to_scalar_type(o.dtype), device));
    }
  }
  push_returns(info, entry.ret_lists, fresh, stack, first);
}

// A fill of a whole storage (zeros_like's, torch.full's) uploads its value
// instead of compiling one program per shape: a cold optimizer step's state
// is one program per parameter shape otherwise (59 in MobileNetV3-Small). On
// XLA:CPU device memory is host memory, so the upload costs about what the
// program's run would; elsewhere only fills of up to 64 KiB upload. Not
// counted in bytes_to_device: no user data moves.
bool fill_on_host(const OpInfo& info, torch::jit::Stack& stack, size_t first) {
  const bool zero = info.name == "zero_";
  if ((!zero && info.name != "fill_.Scalar") || spmd_mode()) return false;
  const at::Tensor self = stack[first].toTensor();
  if (!self.is_privateuseone() || self.storage_offset() != 0 ||
      !self.is_non_overlapping_and_dense())
    return false;
  DeviceStorage& st = device_storage(self.storage());
  const int64_t n = self.numel();
  const size_t nbytes = static_cast<size_t>(n) * self.element_size();
  constexpr size_t kSmallUpload = 64 << 10;
  if (n == 0 || nbytes != st.nbytes || (nbytes > kSmallUpload && client().platform_name() != "cpu"))
    return false;
  fused_sync(st, "fill", /*write=*/true);
  at::Tensor host = at::full({n}, zero ? c10::Scalar(0) : stack[first + 1].toScalar(),
                             self.options().device(c10::kCPU));
  const DType dtype = lower::to_dtype(self.scalar_type());
  st.buffer = client().buffer_from_host(host.data_ptr(), dtype, {&n, 1}, st.device);
  st.dtype = dtype;
  torch::jit::drop(stack, zero ? 1 : 2);
  stack.emplace_back(self);
  return true;
}

// Compiles the call's program (`donate`: slots whose input buffer it writes its
// result into) and keeps it under `key`; `what` names it in traces and reports.
std::shared_ptr<const ProgramEntry> compile_and_keep(const c10::OperatorHandle& op,
                                                     const OpInfo& info,
                                                     const torch::jit::Stack& stack, CallKey& call,
                                                     const std::string& key,
                                                     const std::string& what,
                                                     const std::vector<int>& donate = {}) {
  TraceScope trace([&] { return "torchtpu::compile " + what; });
  auto made = compile_call(op, info, stack, call.first, call.n, call.storages, donate);
  made->what = what;
  count_program(info.name);
  add_program(key, made);
  note_exact_program(key);
  return made;
}

// TORCHTPU_STRICT_DONATE=0 turns donation off (to compare memory and speed).
bool donation() {
  static const bool on = env_default_on("TORCHTPU_STRICT_DONATE");
  return on;
}

// The program of an in-place or out= call that writes its result into the
// buffers of the storages it writes, where nobody else holds them. XLA:CPU
// allocates a fresh output otherwise, and a large one is fresh pages: `mul_`
// of four 16 MiB tensors took 8-18 ms that way and 3 ms in place. Only
// storages of at least kDonateBytes: below that the allocator reuses freed
// memory, and each donating program is one more compile.
std::shared_ptr<const ProgramEntry> donating(const c10::OperatorHandle& op, const OpInfo& info,
                                             const torch::jit::Stack& stack, CallKey& call,
                                             const ProgramEntry& plain) {
  constexpr size_t kDonateBytes = 256 << 10;
  if (!donation() || spmd_mode()) return nullptr;
  std::vector<int> slots;
  int64_t nbytes = 0;
  for (const InputSource& in : plain.inputs) {
    if (in.kind != InputSource::Storage) continue;  // a whole overwrite reads no input
    auto written = [&](const OutSpec& o) { return o.write && o.slot == in.index; };
    if (std::none_of(plain.outs.begin(), plain.outs.end(), written)) continue;
    const DeviceStorage& st = *call.storages[in.index];
    if (st.buffer && st.nbytes >= kDonateBytes &&
        st.buffer.use_count() - st.buffer->queued_uses() == 1) {
      slots.push_back(in.index);
      nbytes += static_cast<int64_t>(st.nbytes);
    }
  }
  if (slots.empty()) return nullptr;
  std::string key = call.key + "|donate";
  for (int slot : slots) put(key, static_cast<int32_t>(slot));
  auto entry = std::static_pointer_cast<const ProgramEntry>(find_program(key));
  if (!entry)
    entry =
        compile_and_keep(op, info, stack, call, key, "aten::" + info.name + " (in place)", slots);
  metrics().donated_bytes += nbytes;  // once the program is in hand: a failed compile donates none
  return entry;
}

}  // namespace

StackFeed::StackFeed(const ProgramEntry& e, const CallKey& call, const torch::jit::Stack& stack,
                     int device, std::vector<int64_t> extras)
    : e_(e), call_(call), stack_(stack), device_(device), extras_(std::move(extras)) {}

pjrt::BufferPtr StackFeed::storage(int slot) {
  // The key records which storages were unwritten; those never become inputs.
  TORCH_INTERNAL_ASSERT(call_.storages[slot]->buffer);
  return call_.storages[slot]->buffer;
}

pjrt::BufferPtr StackFeed::host(const InputSource& in) {
  return host_input(stack_[call_.first + in.index], in.sub, device_);
}

void StackFeed::rng(const InputSource&, uint64_t state[2]) {
  philox_take(find_generator(stack_, call_.first, call_.n), device_, e_.rng_numel, state);
}

c10::Scalar StackFeed::scalar(const ScalarSource& s) {
  if (s.extra) return extras_.at(s.sub);
  return scalar_of(stack_[call_.first + s.index], s.sub);
}

void strict_run(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack) {
  if (fill_on_host(info, *stack, stack->size() - op.schema().arguments().size())) return;
  CallKey call = key_call(op, info, *stack);
  const size_t n = call.n, first = call.first;
  // Another thread's fused graph may hold newer values of these storages.
  for (DeviceStorage* st : call.storages) fused_sync(*st, "strict_op");
  const bool debug = mode() == Mode::Debug;
  if (debug) debug_index_checks(info, *stack, first);

  auto entry = std::static_pointer_cast<const ProgramEntry>(find_program(call.key));
  if (entry) {
    metrics().cache_hits++;
  } else {
    // out= tensors of the wrong size are resized first (then the key changes).
    if (info.is_out && resize_outs(op, info, *stack, first, n, call.key))
      return strict_run(op, info, stack);
    const NewShape ns = new_shape(info, *stack, first, n, call.storages, call.key);
    if (ns == NewShape::Host) return run_on_host(op, info, stack, first, n, call.storages);
    if (run_bucketed(op, info, stack, call)) return;
    if (ns == NewShape::BucketedElseHost)
      return run_on_host(op, info, stack, first, n, call.storages);
    entry = compile_and_keep(op, info, *stack, call, call.key, "aten::" + info.name);
  }
  if (auto in_place = donating(op, info, *stack, call, *entry)) entry = std::move(in_place);
  const int device = call.storages.empty() ? current_device() : call.storages[0]->device;
  StackFeed feed(*entry, call, *stack, device);
  std::vector<pjrt::BufferPtr> outs;
  {
    TraceScope trace([&] { return "torchtpu::execute aten::" + info.name; });
    outs = launch(*entry, gather_inputs(*entry, feed, device), device,
                  [&] { return describe(info.name, *stack, first, n); });
  }
  std::vector<DeviceStorage*> read;
  const bool value_sized = value_sized_call(call.storages);
  if (value_sized) read = read_storages(op, *stack, first, n);
  push_results(*entry, info, outs, call.storages, device, *stack, first);
  if (value_sized) mark_value_sized_outputs(*stack, op.schema().returns().size(), read);
}

}  // namespace torchtpu::aten
