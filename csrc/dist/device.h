// In-process device collectives: one tensor per device of this process
// (tensor i on tpu:i), run as one replicated StableHLO program across the
// devices (XLA:CPU in-process, NCCL/ICI on accelerators): no host copies.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torchtpu::dist {

// kind: all_reduce | all_gather | reduce_scatter | all_to_all | permute.
// reduce: sum | prod | max | min (all_reduce, reduce_scatter). dim/dim2: the
// gather or scatter dim; all_to_all's split and concat dims. pairs: permute's
// [source, target] device pairs. Returns each device's result (new tensors).
std::vector<at::Tensor> device_collective(const std::string& kind,
                                          const std::vector<at::Tensor>& tensors,
                                          const std::string& reduce, int64_t dim, int64_t dim2,
                                          const std::vector<std::vector<int64_t>>& pairs);

}  // namespace torchtpu::dist
