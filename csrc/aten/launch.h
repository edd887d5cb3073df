// The one launcher: every program (Strict's per-op programs, Fused Eager's
// graphs, copies) is found in one table, compiled through the shared compile
// cache, executed, counted and then either waited for (Debug Eager) or
// queued in flight.
#pragma once
#include <c10/util/FunctionRef.h>

#include <memory>
#include <string>
#include <vector>

#include "pjrt/pjrt.h"

namespace torchtpu::aten {

// A compiled program; runners keep their own description of its inputs and
// outputs in a derived type (program.h's ProgramEntry).
struct Launchable {
  virtual ~Launchable() = default;
  pjrt::ExecutablePtr exe;
};

// The process's program table, keyed by structural keys (each runner's keys
// start with its own letter). One bound for all: at TORCHTPU_CACHE_MEMORY_ENTRIES
// entries the table is emptied, so unused executables are released.
std::shared_ptr<const Launchable> find_program(const std::string& key);
void add_program(std::string key, std::shared_ptr<const Launchable> entry);
size_t program_table_limit();

// The executable of a program through the compile cache (memory, disk,
// shared root, or a compile); counts real compiles in metrics().
pjrt::ExecutablePtr compile_cached(const std::string& mlir,
                                   const pjrt::CompileOptions& options = {});

// Executes on `device`. Debug Eager waits for the outputs and, given `what`
// (which names the work) and TORCHTPU_CHECK_NANS=1, raises when a float output
// holds NaN or Inf; other modes queue the last output in flight.
std::vector<pjrt::BufferPtr> launch(pjrt::Executable& exe, const std::vector<pjrt::BufferPtr>& args,
                                    int device, c10::function_ref<std::string()> what = nullptr);

// Host-side limit on work in flight (TORCHTPU_MAX_INFLIGHT, default 64):
// waits for the oldest output when the queue is full.
void track_inflight(const pjrt::BufferPtr& out);
// Asks the layers above to run what they hold (Fused Eager), then waits for
// every program in flight.
void synchronize();

}  // namespace torchtpu::aten
