// Fused Eager: ops are recorded into one graph per device (output metadata
// computed at once) and run as one cached program at cut points. The
// recorder (fused_record.cpp) builds the graph, the policy (csrc/graph) says
// where to cut, and the runner (fused_run.cpp) lowers, compiles and launches.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "aten/op_info.h"
#include "aten/runtime.h"

namespace torchtpu::aten {

// Records one op call (Mode::Fused): pushes its returns, computes nothing.
void fused_record(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack);
// Runs the recorded graphs (one per device), if any; `reason` is counted per
// cut. Graphs of devices where another thread rank records are left to it.
void fused_flush(const char* reason);
// Runs device `device`'s graph, if any.
void fused_flush_device(int device, const char* reason);
// A thread rank records on `device` (tpu_local, while its backend lives):
// other threads' fused_flush leave that device's graph to it.
void set_rank_device(int device, bool on);
bool rank_device(int device);
// What the rank thread of `device` waits for now ("its thread waits for the
// lock of tpu:1's Fused graph ..."), or "": named when it misses a collective.
std::string rank_wait(int device);
// SPMD mode (TORCHTPU_SPMD=1, torchtpu.distributed.spmd): thread ranks record
// their collectives into their graphs (dist/local.h); on their devices,
// calls never run on the host or bucketed, so every rank records the same.
bool spmd_mode();
void set_spmd_mode(bool on);
// Runs the graph when it involves `st`, so that its buffer is current and
// direct reads and writes of it are safe. Throws the error of a failed graph.
// `write`: the caller replaces the buffer (else it only reads it).
void fused_sync(const DeviceStorage& st, const char* reason, bool write = false);
// True when the recorded graph reads or writes `st`.
bool fused_holds(const DeviceStorage& st);
// While a torch.compile graph records (this thread), no loop or read-ahead
// cuts: the graph's own ends are the cuts, so it runs as one program.
void set_compiled_graph(bool on);
bool in_compiled_graph();
// Counts of graph cuts by reason.
std::vector<std::pair<std::string, int64_t>> fused_cut_report();
// Bindings hook: where in Python the current op was called (for errors and
// TORCHTPU_DEBUG_FUSION logs); returns an interned string or nullptr.
void set_location_hook(const std::string* (*hook)());
// The hook's answer now (nullptr without a hook or a Python frame).
const std::string* caller_location();
// Bindings hook: runs `wait` (a blocking wait for the Fused graph's lock)
// without Python's GIL when this thread holds it. A C++ path that calls us
// with the GIL held (DTensor's dispatch) would otherwise deadlock with a
// graph owner that needs the GIL (a Python kernel, caller_location).
void set_wait_hook(void (*hook)(c10::function_ref<void()> wait));
// Runs `wait` through that hook (a rank of a replicated program waiting for
// the others, which may need the GIL to get there).
void run_without_gil(c10::function_ref<void()> wait);

}  // namespace torchtpu::aten
