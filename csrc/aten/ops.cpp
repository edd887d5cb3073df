// Op registration, and nothing else: the kernels every PrivateUse1 backend
// must provide (allocation, views, set_, resize_; copies and item() come from
// dispatch.h) and one boxed kernel (dispatch.h's run_op) for every other op.
#include "aten/ops.h"

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
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>

#include "aten/copy.h"
#include "aten/dispatch.h"
#include "aten/op_info.h"
#include "aten/runtime.h"
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

// Complex <-> (real, imaginary) pairs: views of the same storage in another
// dtype; programs read them through lower::read_view like any view.
at::Tensor view_as_real(const at::Tensor& self) { return at::native::view_as_real(self); }
at::Tensor view_as_complex(const at::Tensor& self) { return at::native::view_as_complex(self); }

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

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
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

}  // namespace

// Nothing to record: a storage's buffer stays alive while any queued program
// uses it (PJRT buffers are reference counted), whichever stream freed it.
void record_stream(at::Tensor& self, c10::Stream s) {
  TORCH_CHECK(s.device_type() == self.device().type(), "[tpu] record_stream: tensor on ",
              self.device(), " but stream on ", s.device());
}

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
      lib->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunction<&run_op>());
    }
  });
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("unfold", unfold);
  m.impl("view_as_real", view_as_real);
  m.impl("view_as_complex", view_as_complex);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("_assert_async", assert_async);
  m.impl("_assert_async.msg", assert_async_msg);
  m.impl("_has_compatible_shallow_copy_type", compatible_shallow_copy);
  m.impl("record_stream", record_stream);
}

// convolution and convolution_backward have CompositeExplicitAutograd kernels
// that route PrivateUse1 to convolution_overrideable (no meta kernel, so it
// cannot be lowered); registering the boxed kernel sends them to their rules.
// index.Tensor's structured kernel runs its meta function on the real
// arguments first, which turns a boolean mask into indices on the device (one
// host sync) before index.Tensor_out does it again; taken directly, the mask
// is expanded once (expand_bool_indices). mode.values' composite kernel
// accepts only CPU, CUDA and XPU tensors; taken directly it is mode's rule.
// _grouped_mm's composite kernel reads the group offsets on the host and runs a
// matmul per group at data-dependent sizes; its rule keeps the shapes static.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_grouped_mm", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  m.impl("index.Tensor", torch::CppFunction::makeFromBoxedFunction<&run_op>());
  m.impl("mode.values", torch::CppFunction::makeFromBoxedFunction<&run_op>());
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_op>());
}

// Copies resolve lazy conj()/neg bits themselves (dispatch.cpp's copy_from):
// PyTorch's fallback for those bits would clone the source, and a clone
// copies through _copy_from again.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torchtpu::aten
