// Op registration: the kernels every PrivateUse1 backend must provide
// (allocation, views, copies, scalars) and one boxed kernel for everything
// else, which runs lowering rules (or the CPU fallback when asked).
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>

#include "aten/executor.h"
#include "aten/fused.h"
#include "hlo/builder.h"
#include "lower/types.h"

namespace torchtpu::aten {

namespace {

constexpr c10::DispatchKeySet kTpuKeys(c10::DispatchKey::PrivateUse1);

c10::Device tpu_device(std::optional<c10::Device> d) {
  c10::Device dev = d.value_or(c10::Device(c10::DeviceType::PrivateUse1, current_device()));
  int index = dev.has_index() ? dev.index() : current_device();
  check_device(index);
  return {c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)};
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin, std::optional<c10::MemoryFormat> fmt) {
  c10::Device dev = tpu_device(device);
  auto st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  lower::to_dtype(st);  // rejects dtypes the device lacks
  c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(size, allocator(), kTpuKeys, st, fmt);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin) {
  c10::Device dev = tpu_device(device);
  auto st = dtype.value_or(c10::get_default_dtype_as_scalartype());
  lower::to_dtype(st);
  c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(size, stride, allocator(), kTpuKeys, st);
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

at::Tensor unfold(const at::Tensor& self, int64_t dim, int64_t size, int64_t step) {
  return at::native::unfold(self, dim, size, step);
}

void maybe_grow(const at::Tensor& self) {
  size_t needed = at::detail::computeStorageNbytes(self.sizes(), self.strides(),
                                                   self.element_size(), self.storage_offset());
  if (needed > self.storage().nbytes()) resize_storage(self.storage(), needed);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> fmt) {
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() == size && !fmt) return self;
  impl->set_sizes_contiguous(size);
  if (fmt && *fmt != c10::MemoryFormat::Contiguous) impl->empty_tensor_restride(*fmt);
  maybe_grow(self);
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset,
                        c10::IntArrayRef size, c10::IntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty())
    impl->set_sizes_contiguous(size), impl->set_storage_offset(offset);
  else
    impl->set_sizes_and_strides(size, stride, offset);
  maybe_grow(self);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.element_size());
  return set_storage(self, std::move(source), 0, {n}, {1});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& src) {
  if (self.is_same(src)) return self;
  return set_storage(self, src.storage(), src.storage_offset(), src.sizes(), src.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage s(c10::Storage::use_byte_size_t(), 0, allocator(), true);
  return set_storage(self, s, 0, {0}, {1});
}

// Fused Eager: a copy between device tensors is one more recorded call.
void record_copy(const at::Tensor& src, const at::Tensor& dst) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
  torch::jit::Stack s{dst, src, false};
  run_lowered(op, op_info(op), &s);
}

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

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "[tpu] a Tensor with ", self.numel(),
              " elements cannot be converted to Scalar");
  at::Tensor host = at::empty(self.sizes(), self.options().device(c10::kCPU));
  SyncReason why("item");
  copy_from(self, host, false);
  return host.item();
}

// module.to("tpu") swaps parameter data in place (keeping tied weights tied)
// only when CPU and tpu tensors count as shallow-copy compatible.
bool compatible_shallow_copy(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.is_cpu() || t.device().is_privateuseone());
  };
  if (dense(self) && dense(from)) return true;
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set());
}

// ---- the boxed path

std::string op_name(const c10::FunctionSchema& s) {
  std::string name = s.name();
  if (name.rfind("aten::", 0) == 0) name = name.substr(6);
  return s.overload_name().empty() ? name : name + "." + s.overload_name();
}

bool is_scalar_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::NumberType) return true;
  if (auto o = t->cast<c10::OptionalType>())
    return o->getElementType()->kind() == c10::TypeKind::NumberType;
  return false;
}

// The functional overload whose arguments are this out= op's non-out ones
// (out arguments are kwarg-only and last, so positions agree), if it has a rule.
std::optional<c10::OperatorHandle> functional_twin(const c10::FunctionSchema& s) {
  std::vector<std::string> want;
  for (const auto& a : s.arguments())
    if (!a.is_out()) want.push_back(a.type()->str());
  for (const std::string& cand : lower::registered_ops()) {
    std::string base = cand.substr(0, cand.find('.'));
    if ("aten::" + base != s.name()) continue;
    std::string overload =
        cand.find('.') == std::string::npos ? "" : cand.substr(cand.find('.') + 1);
    auto h = c10::Dispatcher::singleton().findSchema({s.name(), overload});
    if (!h) continue;
    std::vector<std::string> got;
    for (const auto& a : h->schema().arguments()) got.push_back(a.type()->str());
    if (got == want) return h;
  }
  return std::nullopt;
}

std::unique_ptr<OpInfo> make_info(const c10::FunctionSchema& s) {
  auto info = std::make_unique<OpInfo>();
  info->name = op_name(s);
  for (const auto& a : s.arguments()) {
    info->scalar_arg.push_back(is_scalar_type(a.type()) ? 1 : 0);
    info->is_out |= a.is_out();
  }
  for (const auto& r : s.returns()) {
    int alias = -1;
    if (r.alias_info() && r.alias_info()->isWrite()) {
      for (size_t i = 0; i < s.arguments().size(); ++i) {
        const auto* ai = s.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets())
          alias = static_cast<int>(i);
      }
    }
    info->ret_alias_arg.push_back(alias);
  }
  info->rule = lower::find_rule(info->name);
  std::string base = s.name().substr(6);
  if (!info->rule && !base.empty() && base.back() == '_' && !info->is_out) {
    std::string f = base.substr(0, base.size() - 1);
    if (!s.overload_name().empty()) f += "." + s.overload_name();
    info->rule = lower::find_rule(f);
  }
  if (info->is_out) info->functional = functional_twin(s);
  if (!info->rule && info->functional)
    info->rule = lower::find_rule(op_name(info->functional->schema()));
  if (!info->rule && base.rfind("_foreach_", 0) == 0) {
    info->foreach = foreach_op(s, info->scalar_arg);
    if (info->foreach) info->rule = foreach_rule(*info->foreach);
    // In place (`self`) or out= (`out`): the first written list gets the results.
    for (size_t i = 0; info->foreach && s.returns().empty() && i < s.arguments().size(); ++i) {
      const auto* a = s.arguments()[i].alias_info();
      if (a && a->isWrite()) {
        info->list_write_arg = static_cast<int>(i);
        break;
      }
    }
  }
  std::string stem = base.size() > 1 && base.back() == '_' ? base.substr(0, base.size() - 1) : base;
  for (int i : lower::attribute_scalars_of(stem))
    if (i < static_cast<int>(info->scalar_arg.size())) info->scalar_arg[i] = 0;
  return info;
}

}  // namespace

const OpInfo& op_info(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpInfo>> infos;
  const c10::FunctionSchema* key = &op.schema();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = infos[key];
  if (!slot) slot = make_info(op.schema());
  return *slot;
}

bool has_lowering(const std::string& qualified) {
  const size_t dot = qualified.find('.');
  const std::string name = qualified.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : qualified.substr(dot + 1);
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  return h && op_info(*h).rule != nullptr;
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
  const std::string base = info.name.substr(0, info.name.find('.'));
  static const std::set<std::string> indexing = {
      "index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"};
  if (!indexing.count(base) || !(*stack)[first + 1].isList()) return;
  auto list = (*stack)[first + 1].toList();
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
  (*stack)[first + 1] = out;
}

void tpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const OpInfo& info = op_info(op);
  metrics().ops++;
  const size_t n = op.schema().arguments().size();
  try {
    if (info.rule) expand_bool_indices(info, stack, stack->size() - n);
    if (info.rule) return run_lowered(op, info, stack);
  } catch (c10::Error& e) {
    e.add_context("[tpu] while running " + describe(info.name, *stack, stack->size() - n, n));
    throw;
  } catch (const pjrt::Error& e) {
    TORCH_CHECK(false, "[tpu] ", describe(info.name, *stack, stack->size() - n, n),
                " failed on the device: ", e.what());
  } catch (const hlo::BuildError& e) {
    TORCH_CHECK(false, "[tpu] ", describe(info.name, *stack, stack->size() - n, n),
                " could not be lowered: ", e.what());
  }
  if (cpu_fallback_enabled()) return cpu_fallback(op, info, stack);
  TORCH_CHECK_NOT_IMPLEMENTED(false, "[tpu] ", describe(info.name, *stack, stack->size() - n, n),
                              " has no tpu lowering. Set TORCHTPU_CPU_FALLBACK=1 to run "
                              "unsupported ops on the CPU (slow), or report the op.");
}

}  // namespace

void register_foreach_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                          c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    auto& d = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : d.getAllOpNames()) {
      if (name.name.rfind("aten::_foreach_", 0) != 0) continue;
      auto h = d.findOp(name);
      if (!h || !op_info(*h).rule) continue;
      std::string op = name.name.substr(6);
      if (!name.overload_name.empty()) op += "." + name.overload_name;
      lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
    }
  });
}

std::vector<std::pair<std::string, int64_t>> fallback_report() {
  std::lock_guard<std::mutex> lock(fallback_mu);
  return {fallback_counts().begin(), fallback_counts().end()};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_has_compatible_shallow_copy_type", compatible_shallow_copy);
}

// convolution and convolution_backward have CompositeExplicitAutograd kernels
// that route PrivateUse1 to convolution_overrideable (no meta kernel, so it
// cannot be lowered); registering the boxed kernel sends them to their rules.
// index.Tensor's structured kernel runs its meta function on the real
// arguments first, which turns a boolean mask into indices on the device (one
// host sync) before index.Tensor_out does it again; taken directly, the mask
// is expanded once (expand_bool_indices). mode.values' composite kernel
// accepts only CPU, CUDA and XPU tensors; taken directly it is mode's rule.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
}

// Autocast on tpu: no per-op policies yet, so ops run in their own dtypes.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

}  // namespace torchtpu::aten
