// The one launcher: every program (Strict's per-op programs, Fused Eager's
// graphs, copies) is found in one table, compiled through the shared compile
// cache, executed, counted and then either waited for (Debug Eager) or
// queued in flight.
#pragma once
#include <c10/util/FunctionRef.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "pjrt/pjrt.h"

namespace torchtpu::aten {

// A compiled program; runners keep their own description of its inputs and
// outputs in a derived type (program.h's ProgramEntry).
//
// On XLA:CPU, small programs (every loop at most a few thousand elements) and
// programs without reductions, scatters or sorts get cheaper compile settings
// for good (launch.cpp, cpu_build).
//
// Tiered compiles (opt-in, TORCHTPU_TIERED_COMPILE=1): a larger program the
// cache has no final build of is first compiled quick (XLA:CPU: the small
// programs' build; elsewhere XLA's backend at optimization level 0: slower
// loops), for less compile time, with last-bit differences from the final
// build (FMA contraction), so a cold step waits less. Once it has
// run TORCHTPU_TIER_UP_RUNS times (default 2) the optimized build is compiled
// on a background thread (after TORCHTPU_TIER_UP_QUIET_MS without foreground
// compiles) and replaces it; the cache keeps both, so the next process starts
// optimized. Under torch.use_deterministic_algorithms(True) programs are
// compiled optimized at once.
//
// Async compiles (on outside Debug Eager; TORCHTPU_ASYNC_COMPILE=0 turns them
// off): a program's first build is compiled on a pool of threads while the
// host goes on; its launches, and every launch after them, queue in order
// (async_runs.h) and return placeholder buffers of the program's result types.
struct Launchable : std::enable_shared_from_this<Launchable> {
  virtual ~Launchable() = default;
  enum State : int { Ready, Compiling, Failed };
  mutable std::atomic<int> state{Ready};  // `exe` (or compile_error) is set once not Compiling
  std::string compile_error;
  std::string what;  // names the program in errors of queued runs ("aten::mm", ...)
  std::vector<std::pair<DType, std::vector<int64_t>>> results;  // @main's result types
  pjrt::ExecutablePtr exe;  // the first build; replaced by `optimized` once that is set
  std::string quick_mlir;   // kept while a tier-up may follow
  // The tier-up's settings (XLA's default or a plain program's, launch.cpp); set with quick_mlir.
  const pjrt::CompileOptions* final_options = nullptr;
  enum Tier : int { Final, Quick, Queued, Promoted };
  mutable std::atomic<int> tier{Final};
  mutable std::atomic<int> runs{0};
  mutable pjrt::ExecutablePtr optimized;  // written once, before tier becomes Promoted
  // A replicated program (SPMD collectives of one group, hlo::Builder::replicate):
  // the group's tag (-1: an ordinary program) and a hash of its text, the
  // same on every rank that built it.
  int64_t replica_group = -1;
  uint64_t replica_key = 0;
  bool replica_single = false;  // the program is one collective and nothing else
};

// Thrown by the replicated runner, on every rank and before anything ran, when
// the ranks brought different programs (rank-specific calls recorded between
// their collectives); what() is the report naming each rank's program. Ranks
// that each brought one collective alone and differ get a DistBackendError.
struct ProgramsDiffer : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A replicated program's part for one device: set by the distributed layer,
// which meets the group's other ranks and runs the program once for all.
using ReplicatedRunner = std::vector<pjrt::BufferPtr> (*)(const Launchable& entry,
                                                          const std::vector<pjrt::BufferPtr>& args,
                                                          int device, const std::string& what);
void set_replicated_runner(ReplicatedRunner runner);
// Compile options that run replica r on tpu:devices[r] (devices 0..n-1 keep
// the plugin's default assignment, and with it their cache keys).
pjrt::CompileOptions replica_options(const std::vector<int64_t>& devices);

// The process's program table, keyed by structural keys (each runner's keys
// start with its own letter). One bound for all, TORCHTPU_CACHE_MEMORY_ENTRIES
// entries: programs unused for the longest are released first (two
// generations, launch.cpp), so a loop's programs stay loaded.
std::shared_ptr<const Launchable> find_program(const std::string& key);
void add_program(std::string key, std::shared_ptr<const Launchable> entry);
size_t program_table_limit();

// The executable of a program through the compile cache (memory, disk,
// shared root, or a compile); counts real compiles in metrics().
pjrt::ExecutablePtr compile_cached(const std::string& mlir,
                                   const pjrt::CompileOptions& options = {});
// How XLA:CPU splits a program's LLVM module for codegen: per-op programs in
// one part (several of them compile at once on the async threads, where XLA's
// parallel parts only add work), graphs in XLA's parts (one large compile can
// use every core).
enum class CodegenParts { One, Xla };
// Sets `entry.exe` to the optimized build when a cache tier has it, else
// (tiered compiles on) to a quick build marked for a later tier-up.
void compile_program(const std::string& mlir, Launchable& entry,
                     CodegenParts parts = CodegenParts::One);
// Waits until no tier-up is queued or compiling (tests, benchmarks).
void wait_tier_ups();

// Executes on `device` (a replicated program: this device's replica, through
// the replicated runner). Debug Eager waits for the outputs and, given `what`
// (which names the work) and TORCHTPU_CHECK_NANS=1, raises when a float output
// holds NaN or Inf; other modes queue the last output in flight.
// Runs the entry's current build (and counts runs toward its tier-up).
std::vector<pjrt::BufferPtr> launch(const Launchable& entry,
                                    const std::vector<pjrt::BufferPtr>& args, int device,
                                    c10::function_ref<std::string()> what = nullptr);

// Host-side limit on work in flight (TORCHTPU_MAX_INFLIGHT, default 64): when
// the queue is full, waits for its oldest run (through that run's kept ready
// event when its output is gone), counted in metrics().inflight_waits.
void track_inflight(const pjrt::BufferPtr& out);
// Asks the layers above to run what they hold (Fused Eager), then waits for
// every program in flight.
void synchronize();

}  // namespace torchtpu::aten
