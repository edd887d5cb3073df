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

// Capture regions (torch.tpu.graph, as torch.cuda.graph): everything this
// thread records on the current device between begin and end runs as one
// program; the region keeps the storages it read, and a replay launches the
// program again on their current buffers and writes its results to the
// storages it wrote that are still alive. Host values (Python scalars, CPU
// tensors) are those of the capture; random numbers are drawn anew.
void region_begin();
// Runs what the region recorded; returns a handle for region_replay, or
// throws (naming why) when it was not one program of recorded calls. `outs`
// are returned by each replay: those the region made as new tensors per
// replay (their results are not written back), others as views of their
// storage.
int64_t region_end(at::TensorList outs);
// Ends a region without capturing (an exception left it); runs what it recorded.
void region_abort();
std::vector<at::Tensor> region_replay(int64_t handle);
void region_release(int64_t handle);
bool region_capturing();

}  // namespace torchtpu::aten
