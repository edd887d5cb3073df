// Replay of torch.compile graphs: a compiled graph that ran as one Fused
// Eager program is captured (the program, which argument storage feeds each
// program input, which result becomes which output or argument write), and
// later calls with the same argument layout launch that program directly,
// without recording the graph's ops again (as CUDA graphs replay kernels).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torchtpu::aten {

// Starts capturing on this thread: the calling graph has just been flushed.
void capture_begin();
// Runs what the graph recorded (always) and, when it was one program that
// only `args`' storages feed and only `outs` and writes to `args` receive,
// returns a handle for replay_graph (else 0).
int64_t capture_end(at::TensorList args, at::TensorList outs);
// The captured program on new arguments: the outputs in capture order, or
// nothing when the arguments differ in layout (then run the graph).
std::optional<std::vector<at::Tensor>> replay_graph(int64_t handle, at::TensorList args);
// Why this thread's last capture_end returned 0.
const std::string& capture_refusal();
// Ends this thread's capture without capturing (the caller saw why).
void refuse_capture(const std::string& why);
// Frees a captured program (its compiled graph died).
void release_graph(int64_t handle);

}  // namespace torchtpu::aten
