// In-process device collectives: one tensor per device of this process
// (tensor i on tpu:i), run as one replicated StableHLO program across the
// devices (XLA:CPU in-process, NCCL/ICI on accelerators): no host copies.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "pjrt/pjrt.h"

namespace torchtpu::dist {

// kind: all_reduce | all_gather | reduce_scatter | all_to_all | permute.
// reduce: sum | prod | max | min (all_reduce, reduce_scatter). dim/dim2: the
// gather or scatter dim; all_to_all's split and concat dims. pairs: permute's
// [source, target] device pairs. Returns each device's result (new tensors).
std::vector<at::Tensor> device_collective(const std::string& kind,
                                          const std::vector<at::Tensor>& tensors,
                                          const std::string& reduce, int64_t dim, int64_t dim2,
                                          const std::vector<std::vector<int64_t>>& pairs);

// The compiled program behind device_collective for one replica's tensor of
// `sizes` and `dt` (passed flat): `n` replicas, each returning one flat output
// of `out_shape`. Cached by the compile cache.
struct ReplicatedProgram {
  pjrt::ExecutablePtr exe;
  std::vector<int64_t> out_shape;                // of the first part
  std::vector<std::vector<int64_t>> out_shapes;  // one per part
};
// One replica's tensor of a multi-part program: a coalesced call runs one
// collective per part in one program (parameter i -> output i).
struct Part {
  DType dt = DType::F32;
  std::vector<int64_t> sizes;
};
// Runs a replicated program (replica i on its device) and waits for its outputs:
// one at a time in the process (see device.cpp).
std::vector<std::vector<pjrt::BufferPtr>> run_replicated(
    pjrt::Executable& exe, const std::vector<std::vector<pjrt::Buffer*>>& args);

ReplicatedProgram replicated_program(const std::string& kind, DType dt,
                                     const std::vector<int64_t>& sizes, const std::string& reduce,
                                     int64_t dim, int64_t dim2,
                                     const std::vector<std::vector<int64_t>>& pairs, int64_t n);
ReplicatedProgram replicated_program(const std::string& kind, const std::vector<Part>& parts,
                                     const std::string& reduce, int64_t dim, int64_t dim2,
                                     const std::vector<std::vector<int64_t>>& pairs, int64_t n);
// The same with replica r on tpu:devices[r] (n = devices.size()).
ReplicatedProgram replicated_program(const std::string& kind, const std::vector<Part>& parts,
                                     const std::string& reduce, int64_t dim, int64_t dim2,
                                     const std::vector<std::vector<int64_t>>& pairs,
                                     const std::vector<int>& devices);

}  // namespace torchtpu::dist
