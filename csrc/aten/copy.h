// Copies between host and device and between device views, and storage
// resizes: small internal programs run through the launcher.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

#include "pjrt/pjrt.h"

namespace torchtpu::aten {

// The tensor's values as a dense row-major buffer of its dtype (runs a
// program when the tensor is a strided view). `why` names the Fused cut.
pjrt::BufferPtr dense_buffer(const at::Tensor& t, const char* why = "read");
// dst (any view, any dtype) := src (tpu tensor broadcastable to dst).
void device_copy(const at::Tensor& src, const at::Tensor& dst);
// dst (any view) := contiguous CPU tensor of dst's sizes and dtype.
void host_to_device(const at::Tensor& src, const at::Tensor& dst);
// Replaces the storage's bytes with a zero-initialized allocation of `nbytes`,
// keeping the leading old contents (untyped_storage().resize_()).
void resize_storage(const c10::Storage& storage, size_t nbytes);

}  // namespace torchtpu::aten
