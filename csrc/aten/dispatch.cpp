#include "aten/dispatch.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/conj_physical.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/neg.h>
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

// The values of a tpu tensor whose lazy conj()/neg bits are set, computed by
// device ops on its raw view (programs read storages raw).
at::Tensor resolve_bits(const at::Tensor& t) {
  at::Tensor v = t;
  if (v.is_conj()) v = at::conj_physical(v.conj());
  if (v.is_neg()) v = at::neg(v._neg_view());
  return v;
}

}  // namespace

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (dst.numel() == 0) return dst;
  // Lazy conj()/neg bits: dst's move to the source (x.conj().copy_(y) stores
  // conj(y) in x), a tpu source's are resolved on the device, a host one's on
  // the host.
  if (dst.device().is_privateuseone() && (dst.is_conj() || dst.is_neg())) {
    at::Tensor s = self, d = dst;
    if (d.is_conj()) s = s.conj(), d = d.conj();
    if (d.is_neg()) s = s._neg_view(), d = d._neg_view();
    copy_from(s, d, non_blocking);
    return dst;
  }
  if (self.device().is_privateuseone() && (self.is_conj() || self.is_neg()))
    return copy_from(resolve_bits(self), dst, non_blocking);
  if (self.is_complex() && !dst.is_complex() && dst.scalar_type() != at::kBool)
    TORCH_WARN_ONCE("Casting complex values to real discards the imaginary part");
  if (dst.device().is_privateuseone()) at::assert_no_internal_overlap(dst);
  const bool fused = mode() == Mode::Fused;
  if (self.device().is_privateuseone() && dst.device().is_privateuseone()) {
    if (fused && self.device() == dst.device())
      record_copy(self, dst);
    else
      device_copy(self, dst);
  } else if (dst.device().is_privateuseone()) {
    // Host -> device: convert/broadcast on the host, then one upload.
    at::Tensor src =
        self.resolve_conj().resolve_neg().to(dst.scalar_type()).expand(dst.sizes()).contiguous();
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
    note_host_sync();
    const_cast<at::Tensor&>(dst).copy_(to_host(self, "to_cpu"));
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

void assert_async_msg(const at::Tensor& self, c10::string_view assert_msg) {
  TORCH_CHECK(self.numel() == 1, "[tpu] _assert_async: expected a one-element tensor, got ",
              self.sizes());
  const c10::Scalar v = local_scalar_dense(self);
  const bool ok = v.isComplex()         ? v.toComplexDouble() != c10::complex<double>(0)
                  : v.isFloatingPoint() ? v.toDouble() != 0
                                        : v.toLong() != 0;
  TORCH_CHECK(ok, assert_msg.empty() ? "Expected Tensor with single nonzero value, but got zero"
                                     : std::string(assert_msg));
}

void assert_async(const at::Tensor& self) { assert_async_msg(self, ""); }

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
  thread_work().fallbacks++;
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

// Lazy conj()/neg bits reach a kernel only for the ops PyTorch lets them fall
// through to (mm, bmm, dot, ...: CPU BLAS conjugates on the fly); rules read
// storages raw, so those inputs are resolved first.
void resolve_math_bits(const c10::OperatorHandle& op, torch::jit::Stack* stack, size_t first) {
  const auto& schema = op.schema().arguments();
  for (size_t i = 0; i < schema.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (!v.isTensor()) continue;
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || !t.device().is_privateuseone() || !(t.is_conj() || t.is_neg())) continue;
    const c10::AliasInfo* alias = schema[i].alias_info();
    TORCH_CHECK(!alias || !alias->isWrite(), "[tpu] ", op.schema().name(),
                ": cannot write into a conj() or neg view; call resolve_conj() first");
    v = resolve_bits(t);
  }
}

}  // namespace

void run_op(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo& info = op_info(op);
  metrics().ops++;
  const size_t n = op.schema().arguments().size();
  try {
    if (info.rule) resolve_math_bits(op, stack, stack->size() - n);
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
