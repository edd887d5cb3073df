#include "aten/dispatch.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/nonzero.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "aten/copy.h"
#include "aten/events.h"
#include "aten/fused.h"
#include "aten/program.h"
#include "aten/strict.h"
#include "hlo/builder.h"

namespace torchtpu::aten {

namespace {

// Fused Eager: a copy between device tensors is one more recorded call.
void record_copy(const at::Tensor& src, const at::Tensor& dst) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  torch::jit::Stack s{dst, src, false};
  fused_record(op, op_info(op), &s);
}

}  // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  if (dst.device().is_privateuseone()) at::assert_no_internal_overlap(dst);
  const bool fused = mode() == Mode::Fused;
  if (self.device().is_privateuseone() && dst.device().is_privateuseone()) {
    if (fused && self.device() == dst.device())
      record_copy(self, dst);
    else
      device_copy(self, dst);
  } else if (dst.device().is_privateuseone()) {
    // Host -> device: convert/broadcast on the host, then one upload.
    at::Tensor src = self.to(dst.scalar_type()).expand(dst.sizes()).contiguous();
    if (fused && fused_holds(device_storage(dst.storage()))) {
      // The graph uses dst: upload to a fresh tensor and record the write.
      at::Tensor tmp = at::empty(dst.sizes(), dst.options());
      host_to_device(src, tmp);
      record_copy(tmp, dst);
    } else {
      host_to_device(src, dst);
    }
  } else {
    // Device -> host: a real sync point.
    metrics().host_syncs++;
    auto buf = dense_buffer(self, "to_cpu");
    at::Tensor host = at::empty(self.sizes(), self.options().device(c10::kCPU));
    buf->to_host(host.data_ptr(), host.nbytes());
    metrics().bytes_to_host += static_cast<int64_t>(host.nbytes());
    const_cast<at::Tensor&>(dst).copy_(host);
  }
  return dst;
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "[tpu] a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty(self.sizes(), self.options().device(c10::kCPU));
  SyncReason why("item");
  copy_from(self, host, false);
  return host.item();
}

namespace {

std::mutex fallback_mu;
std::unordered_map<std::string, int64_t>& fallback_counts() {
  static std::unordered_map<std::string, int64_t> m;
  return m;
}

}  // namespace

void count_fallback(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(fallback_mu);
    if (fallback_counts()[name]++ == 0)
      TORCH_WARN("[tpu] aten::", name,
                 " has no tpu lowering; running it on the CPU "
                 "(TORCHTPU_CPU_FALLBACK=1). This copies its inputs to the host and back.");
  }
  metrics().fallbacks++;
}

std::vector<std::pair<std::string, int64_t>> fallback_report() {
  std::lock_guard<std::mutex> lock(fallback_mu);
  return {fallback_counts().begin(), fallback_counts().end()};
}

namespace {

void cpu_fallback(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack) {
  count_fallback(info.name);
  SyncReason why("cpu_fallback");
  at::native::cpu_fallback(op, stack);
}

// Boolean masks in an index list become long indices, one per mask dimension
// (one data-dependent sync, as PyTorch's own index kernels do), so the lowering
// and the meta kernel see static shapes.
void expand_bool_indices(const OpInfo& info, torch::jit::Stack* stack, size_t first) {
  const int arg = info.spec->mask_index_list;
  if (arg < 0 || !(*stack)[first + arg].isList()) return;
  auto list = (*stack)[first + arg].toList();
  auto is_mask = [](const c10::IValue& e) {
    return e.isTensor() &&
           (e.toTensor().scalar_type() == at::kBool || e.toTensor().scalar_type() == at::kByte);
  };
  if (std::none_of(list.begin(), list.end(), [&](const c10::IValue& e) { return is_mask(e); }))
    return;
  c10::List<std::optional<at::Tensor>> out;
  for (const c10::IValue& e : list) {
    if (!is_mask(e)) {
      out.push_back(e.isTensor() ? std::optional<at::Tensor>(e.toTensor()) : std::nullopt);
      continue;
    }
    const at::Tensor& mask = e.toTensor();
    at::Tensor nz = at::nonzero(mask.scalar_type() == at::kBool ? mask : mask.ne(0));
    for (int64_t d = 0; d < mask.dim(); ++d) out.push_back(nz.select(1, d));
  }
  (*stack)[first + arg] = out;
}

}  // namespace

void run_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo& info = op_info(op);
  metrics().ops++;
  const size_t n = op.schema().arguments().size();
  try {
    if (info.rule) expand_bool_indices(info, stack, stack->size() - n);
    if (info.rule)
      return mode() == Mode::Fused ? fused_record(op, info, stack) : strict_run(op, info, stack);
  } catch (c10::Error& e) {
    e.add_context("[tpu] while running " + describe(info.name, *stack, stack->size() - n, n));
    throw;
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "[tpu] ", describe(info.name, *stack, stack->size() - n, n),
                " failed on the device: ", e.what());
  } catch (const hlo::DTypeError& e) {
    TORCH_CHECK_TYPE(false, "[tpu] ", describe(info.name, *stack, stack->size() - n, n),
                     " is not defined for these dtypes on tpu (", e.what(),
                     "); convert the inputs, e.g. with .float()");
  } catch (const hlo::BuildError& e) {
    TORCH_CHECK(false, "[tpu] ", describe(info.name, *stack, stack->size() - n, n),
                " could not be lowered: ", e.what());
  }
  if (cpu_fallback_enabled()) return cpu_fallback(op, info, stack);
  TORCH_CHECK_NOT_IMPLEMENTED(false, "[tpu] ", describe(info.name, *stack, stack->size() - n, n),
                              " has no tpu lowering. Set TORCHTPU_CPU_FALLBACK=1 to run "
                              "unsupported ops on the CPU (slow), or report the op.");
}

}  // namespace torchtpu::aten
