// Fused Eager: ops are recorded into one graph per process (output metadata
// computed at once) and run as one cached program at cut points.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "aten/runtime.h"

namespace torchtpu::aten {

struct OpInfo;

// Records one op call (Mode::Fused): pushes its returns, computes nothing.
void fused_record(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack);
// Runs the recorded graph, if any; `reason` is counted per cut.
void fused_flush(const char* reason);
// Runs the graph when it involves `st`, so that its buffer is current and
// direct reads and writes of it are safe. Throws the error of a failed graph.
// `write`: the caller replaces the buffer (else it only reads it).
void fused_sync(const DeviceStorage& st, const char* reason, bool write = false);
// Names the cut reason of syncs inside its scope ("item", "cpu_fallback", ...);
// an enclosing scope's reason wins.
class SyncReason {
 public:
  explicit SyncReason(const char* why);
  ~SyncReason();
  SyncReason(const SyncReason&) = delete;
  SyncReason& operator=(const SyncReason&) = delete;
  static const char* current(const char* fallback);

 private:
  const char* prev_;
};
// True when the recorded graph reads or writes `st`.
bool fused_holds(const DeviceStorage& st);
// Allocator hook: a storage died, so its pending value is no program output.
void fused_storage_freed(DeviceStorage* st);
// Counts of graph cuts by reason.
std::vector<std::pair<std::string, int64_t>> fused_cut_report();
// Bindings hook: where in Python the current op was called (for errors and
// TORCHTPU_DEBUG_FUSION logs); returns an interned string or nullptr.
void set_location_hook(const std::string* (*hook)());

}  // namespace torchtpu::aten
