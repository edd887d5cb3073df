// Process-wide device runtime: the PJRT client, device storages, eager mode,
// metrics. The torch-facing glue for csrc/pjrt.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/dtype.h"
#include "pjrt/pjrt.h"

namespace torchtpu::aten {

// Multi-process setup for the client, supplied by csrc/dist (which knows the
// c10d store of torchrun): the key-value store handed to the plugin, and this
// process's node_id among num_nodes. Only the CUDA plugin receives node_id /
// num_nodes as create options; any platform receives the kv callbacks.
struct ClientKv {
  std::shared_ptr<pjrt::KeyValueStore> store;
  int64_t node_id = 0;
  int64_t num_nodes = 1;
  std::string where;  // e.g. "c10d TCPStore 127.0.0.1:29500 prefix torchtpu/pjrt/0/"
};
// Called once by make_client with the platform name; nullopt: single process.
using ClientKvProvider = std::optional<ClientKv> (*)(const std::string& platform);
void set_client_kv_provider(ClientKvProvider provider);
// The ClientKv the running client was created with (nullopt: none, or no client yet).
std::optional<ClientKv> client_kv();
// The NVIDIA libraries preloaded for TORCHTPU_PLATFORM=cuda (empty otherwise).
std::vector<std::string> cuda_library_report();

// The PJRT client, created on first use. Throws c10::Error (with the plugin's
// message and an install hint) when no plugin can be loaded.
pjrt::Client& client();
pjrt::ClientPtr client_ptr();
bool runtime_started() noexcept;  // whether client() has succeeded; starts nothing
// TORCHTPU_SMALL_QUICK=0: every XLA:CPU program compiles with XLA's defaults
// (no small or plain-loop builds, launch.cpp).
bool small_builds_off();
// Whether XLA_FLAGS got the small programs' LLVM options (runtime.cpp): every
// other XLA:CPU build then clears them (launch.cpp).
bool small_llvm_flags();
// Runs an empty backward on each tpu autograd device thread and waits for it, so the
// threads have released every earlier task (call without the GIL; see _shutdown.py).
void drain_autograd_device_thread();
// Number of devices; 0 when the plugin cannot load (never throws).
int device_count() noexcept;
int current_device();
void set_current_device(int index);
void check_device(int index);  // c10::Error naming the valid range

// DataPtr context of every tpu storage. PJRT buffers are immutable, so a
// storage owns a handle to its *current* buffer, swapped by in-place writes.
struct DeviceStorage {
  int device = 0;
  size_t nbytes = 0;
  pjrt::BufferPtr buffer;   // rank-1; null until first written (reads as zeros)
  DType dtype = DType::U8;  // element type of `buffer` (or of the pending value)
  // Fused Eager: the recorded graph holds a newer value, not computed yet.
  bool pending = false;
  // Set when the graph that should have produced the value failed.
  std::shared_ptr<const std::string> error;
  // A size of this value came from tensor values (nonzero's count, ...):
  // Fused Eager runs calls that read it op by op, so graph keys stay static.
  bool value_sized = false;
  // A bucketed call's result (bucketed.h): bytes of real elements, before the
  // padding up to the bucket's capacity; valid while `buffer` is `real_of`.
  size_t real_bytes = 0;
  const void* real_of = nullptr;
  bool has_value() const { return buffer || pending; }
  // The buffer is the one a bucketed call wrote (at its bucket's capacity).
  bool bucketed() const { return buffer && real_of == buffer.get(); }
};

DeviceStorage& device_storage(const c10::Storage& storage);
// Releases a dead storage: at its free, or later when a storage-freed handler
// kept it (events.h).
void free_storage(DeviceStorage* s);
c10::Allocator* allocator();
// Bytes the allocator hands out per device: TORCHTPU_MEMORY_LIMIT, else the
// host's physical memory.
int64_t memory_limit();
// Allocator statistics of one device, as torch.cuda's allocator reports them. Only
// the "all" pool is kept: every storage is its own allocation, segment and active
// block, and nothing is cached (reserved == allocated).
c10::CachingDeviceAllocator::DeviceStats memory_stats(int device);
void reset_peak_memory(int device);
void reset_accumulated_memory(int device);
// Accounts a storage's size change (resize_).
void storage_resized(DeviceStorage& st, size_t nbytes);
// Host <-> device transfers, counted in metrics() and traced for the profiler.
pjrt::BufferPtr upload(const void* data, DType dtype, std::span<const int64_t> dims, int device);
// A new CPU tensor with `like`'s sizes and options holding `buf` (a host sync).
at::Tensor download(const pjrt::Buffer& buf, const at::Tensor& like);
// Zero-initialized storage buffer of `nbytes` with element type `dtype`.
pjrt::BufferPtr zeros_buffer(DType dtype, int64_t n, int device);
// New contiguous tpu tensor on `device` with an empty storage (no dispatch).
at::Tensor empty_on_device(c10::IntArrayRef sizes, c10::ScalarType dtype, int device);
// New contiguous tpu tensor owning `buf` (rank-1, numel elements).
at::Tensor wrap_buffer(pjrt::BufferPtr buf, c10::IntArrayRef sizes, c10::ScalarType dtype,
                       int device);

// Eager modes: strict (async, default), debug (waits on every op, checks),
// fused (records ops into a graph, runs it at cut points).
enum class Mode { Strict, Debug, Fused };
const char* mode_name(Mode m);
Mode parse_mode(const std::string& name);  // c10::Error on an unknown name
Mode mode();                               // this thread's (context manager) or the global one
Mode global_mode();
void set_mode(Mode m);  // global
// Innermost-wins thread-local modes (also seen by autograd's backward threads).
void push_thread_mode(Mode m);
void pop_thread_mode();
bool check_nans();
// An integer setting from the environment; `fallback` when unset or empty.
int env_int(const char* name, int fallback);
// A feature that is on unless the variable `name` is "0".
bool env_default_on(const char* name);
bool cpu_fallback_enabled();

struct Metrics {
  std::atomic<int64_t> ops{0}, compiles{0}, cache_hits{0}, fallbacks{0}, host_syncs{0};
  std::atomic<int64_t> bytes_to_device{0}, bytes_to_host{0}, executions{0};
  std::atomic<int64_t> compile_ns{0}, bytes_in_use{0}, peak_bytes{0};
  // Fused Eager: ops recorded, graphs run, graph cache hits; bytes of donated
  // inputs (Fused graphs and Strict in-place calls); values materialized (live
  // tensors only).
  std::atomic<int64_t> fused_ops{0}, fused_graphs{0}, fused_cache_hits{0}, donated_bytes{0},
      fused_outputs{0};
  // torch.compile: ATen graphs handed to the tpu backend, and runs of their
  // captured programs (replay.h) that skipped recording the graph's ops.
  std::atomic<int64_t> compiled_graphs{0}, graph_replays{0};
  // PyTorch meta kernel runs (output metadata of a call signature not seen before).
  std::atomic<int64_t> meta_calls{0};
  // Tiered compiles (launch.h): programs first compiled quick, optimized builds
  // swapped in, and the background compiles that made them (not in `compiles`).
  std::atomic<int64_t> quick_compiles{0}, tier_ups{0}, tier_up_compiles{0}, tier_up_ns{0};
  // Strict calls run at bucket sizes (bucketed.h).
  std::atomic<int64_t> bucketed_calls{0};
  // Launches that waited for the in-flight bound's oldest unfinished run (launch.h).
  std::atomic<int64_t> inflight_waits{0};
};
Metrics& metrics();
// A device-to-host read (a sync point): counted in metrics and in the calling
// thread's own count, whose reads mark the steps of its loop (bucketed.cpp).
void note_host_sync();
int64_t thread_host_syncs();
// This thread's own share of some counters: a capture (replay.h) is whole when,
// between its begin and end, its thread ran no program, no CPU fallback and no
// host op, and its graph holds every op the thread recorded; other threads'
// work (thread ranks, a data loader) does not spoil it.
struct ThreadWork {
  int64_t executions = 0, fallbacks = 0, host_ops = 0, fused_ops = 0;
};
ThreadWork& thread_work();
// New programs per op: call signatures the program table had not seen (each lowered,
// then compiled or loaded from the compile cache), so a shape that changes every step
// names its op. Strict counts "add.Tensor"; Fused Eager "fused graph of N ops: a .. b".
void count_program(const std::string& what);
std::vector<std::pair<std::string, int64_t>> program_report();
void reset_program_report();

// A torch.profiler range (a RecordFunction user scope). `name` may be a callable
// returning the name: it runs only while a profiler listens, so an idle profiler
// costs one thread-local check. `value` >= 0 (bytes moved, ops in a graph) becomes
// the event's input, shown with record_shapes=True.
class TraceScope {
 public:
  template <class Name>
  explicit TraceScope(Name&& name, int64_t value = -1) {
    auto callbacks = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE);
    if (C10_LIKELY(!callbacks)) return;
    rf_.emplace(std::move(*callbacks));
    if constexpr (std::is_invocable_v<Name>)
      begin(std::string(name()), value);
    else
      begin(std::string(name), value);
  }

 private:
  void begin(const std::string& name, int64_t value);
  std::optional<at::RecordFunction> rf_;
};

}  // namespace torchtpu::aten
