// The mode is decided here, once per call: Fused Eager records, Strict and
// Debug run at once, an op without a rule raises or (when asked) runs on the
// CPU. Every failure leaves as a Python-visible error naming the call.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Scalar.h>

#include <string>
#include <utility>
#include <vector>

namespace torchtpu::aten {

// The boxed kernel of every lowered op on tpu tensors.
void run_op(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// _copy_from: between tpu tensors (recorded in Fused Eager), host to tpu, tpu to host.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking);
// _local_scalar_dense (item()): a host sync.
c10::Scalar local_scalar_dense(const at::Tensor& self);
// _assert_async(.msg): the check runs on the host after a sync (XLA has no
// device-side assert), raising like the CPU kernel when the value is zero.
void assert_async(const at::Tensor& self);
void assert_async_msg(const at::Tensor& self, c10::string_view assert_msg);

// Counts (and warns once per op about) a call run on the CPU.
void count_fallback(const std::string& name);
// Ops that ran through the CPU fallback, with counts.
std::vector<std::pair<std::string, int64_t>> fallback_report();

}  // namespace torchtpu::aten
