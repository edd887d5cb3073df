// Names that changed between torch 2.11 (the GPU image) and 2.13 (what the
// sources are written for). CMakeLists force-includes this header into the
// module's sources when it builds against torch < 2.13.
#pragma once
#include <torch/version.h>

#include <torch/csrc/distributed/c10d/Types.hpp>

#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
namespace c10d {
// 2.13 dropped the NCCL prefix; the fields (double_factor, tensor_factor) are the same.
using PreMulSumSupplement = NCCLPreMulSumSupplement;
}  // namespace c10d
#endif
