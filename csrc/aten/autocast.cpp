// Autocast on tpu (the AutocastPrivateUse1 key): PyTorch's own policy lists
// (ATen/autocast_mode.h, the lists CUDA registers) wrapped with its cast
// templates, so `torch.autocast("tpu")` casts exactly the ops CUDA casts.
// Ops in no list fall through and run in their inputs' dtypes.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace torchtpu::aten {

namespace {

// PyTorch's list of ops redispatched with an appended dtype names these unqualified.
#if __has_include(<ATen/core/Dimname.h>)
using at::DimnameList;  // torch < 2.13 still lists norm.names_ScalarOpt_dim
#endif
using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

// CUDA bans binary_cross_entropy under autocast (its float16 inputs saturate);
// here it runs in float32, as CPU autocast runs it.
at::Tensor binary_cross_entropy_fp32(const at::Tensor& self, const at::Tensor& target,
                                     const std::optional<at::Tensor>& weight, int64_t reduction) {
  return ::at::autocast::WrapFunction<
      ::at::autocast::CastPolicy::fp32, c10::DeviceType::PrivateUse1,
      decltype(ATEN_FN(binary_cross_entropy)), decltype(ATEN_FN(binary_cross_entropy)),
      &ATEN_FN(binary_cross_entropy)>::type::call(self, target, weight, reduction);
}

// The TPU convention: bfloat16 unless the user sets another dtype (PyTorch's
// PrivateUse1 default is float16). The dtype is per thread; this sets it for
// the thread importing torchtpu, and autograd's threads inherit it.
struct DefaultDtype {
  DefaultDtype() { at::autocast::set_autocast_dtype(c10::DeviceType::PrivateUse1, at::kBFloat16); }
} default_dtype;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define TPU_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define TPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define TPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define TPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(TPU_LOWER_PRECISION)
  AT_FORALL_FP32(TPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(TPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(TPU_PROMOTE)
#undef TPU_LOWER_PRECISION
#undef TPU_FP32
#undef TPU_FP32_SET_OPT_DTYPE
#undef TPU_PROMOTE
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_fp32));
}

}  // namespace

}  // namespace torchtpu::aten
