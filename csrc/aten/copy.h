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
// The storage's bytes on the host (a uint8 tensor; zeros when never written).
at::Tensor storage_bytes_to_host(const at::Tensor& t, const char* why);
// A CPU tensor with t's sizes, strides and offset over host storage bytes.
at::Tensor view_of_bytes(const at::Tensor& bytes, const at::Tensor& t);
// The tensor's values on the host (a sync). A view of a small storage is read
// whole and viewed on the host: no program per view geometry.
at::Tensor to_host(const at::Tensor& t, const char* why);
// dst (any view, any dtype) := src (tpu tensor broadcastable to dst).
void device_copy(const at::Tensor& src, const at::Tensor& dst);
// dst (any view) := contiguous CPU tensor of dst's sizes and dtype.
void host_to_device(const at::Tensor& src, const at::Tensor& dst);
// A new buffer holding `buf`'s values (a device-side copy).
pjrt::BufferPtr buffer_copy(const pjrt::BufferPtr& buf, int device);
// Replaces the storage's bytes with a zero-initialized allocation of `nbytes`,
// keeping the leading old contents (untyped_storage().resize_()).
void resize_storage(const c10::Storage& storage, size_t nbytes);

}  // namespace torchtpu::aten
