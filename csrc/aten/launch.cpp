#include "aten/launch.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/isfinite.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <deque>
#include <mutex>
#include <unordered_map>

#include "aten/events.h"
#include "aten/runtime.h"
#include "cache/compile_cache.h"
#include "lower/types.h"

namespace torchtpu::aten {

namespace {

std::mutex table_mu;
std::unordered_map<std::string, std::shared_ptr<const Launchable>>& table() {
  static auto* t = new std::unordered_map<std::string, std::shared_ptr<const Launchable>>();
  return *t;
}

void check_finite(const std::vector<pjrt::BufferPtr>& outs, c10::function_ref<std::string()> what) {
  for (const auto& o : outs) {
    if (!is_float(o->dtype()) || o->numel() == 0) continue;
    // Host-side scan: Debug Eager only.
    std::vector<unsigned char> host(o->nbytes());
    o->to_host(host.data(), host.size());
    at::Tensor t = at::from_blob(host.data(), {o->numel()},
                                 c10::TensorOptions().dtype(lower::to_scalar_type(o->dtype())));
    TORCH_CHECK(t.isfinite().all().item<bool>(), "[tpu] TORCHTPU_CHECK_NANS: ", what(),
                " produced NaN or Inf");
  }
}

std::mutex programs_mu;
std::unordered_map<std::string, int64_t>& programs_by_op() {
  static auto* m = new std::unordered_map<std::string, int64_t>();
  return *m;
}

std::mutex inflight_mu;
// Weak: a queued buffer must not count as a holder (it would veto donation);
// a buffer freed before it is awaited no longer bounds anything.
std::deque<std::weak_ptr<pjrt::Buffer>>& inflight_queue() {
  static auto* q = new std::deque<std::weak_ptr<pjrt::Buffer>>();
  return *q;
}
size_t max_inflight() {
  static size_t n = [] {
    const char* v = std::getenv("TORCHTPU_MAX_INFLIGHT");
    return v ? std::max<size_t>(1, std::atoll(v)) : 64;
  }();
  return n;
}

// A profiler mark naming the compile cache tier that served a compile request.
void trace_cache_tier(const cache::Stats& a, const cache::Stats& b) {
  TraceScope mark([&] {
    const char* tier = b.memory_hits > a.memory_hits   ? "memory_hit"
                       : b.disk_hits > a.disk_hits     ? "disk_hit"
                       : b.shared_hits > a.shared_hits ? "shared_hit"
                                                       : "miss";
    return std::string("torchtpu::compile_cache ") + tier;
  });
}

}  // namespace

size_t program_table_limit() {
  static const size_t n = static_cast<size_t>(cache::process_config().memory_entries);
  return n;
}

std::shared_ptr<const Launchable> find_program(const std::string& key) {
  std::lock_guard<std::mutex> lock(table_mu);
  auto it = table().find(key);
  return it == table().end() ? nullptr : it->second;
}

void add_program(std::string key, std::shared_ptr<const Launchable> entry) {
  std::lock_guard<std::mutex> lock(table_mu);
  if (table().size() >= program_table_limit()) table().clear();
  table().insert_or_assign(std::move(key), std::move(entry));
}

void count_program(const std::string& what) {
  std::lock_guard<std::mutex> lock(programs_mu);
  ++programs_by_op()[what];
}

std::vector<std::pair<std::string, int64_t>> program_report() {
  std::lock_guard<std::mutex> lock(programs_mu);
  return {programs_by_op().begin(), programs_by_op().end()};
}

void reset_program_report() {
  std::lock_guard<std::mutex> lock(programs_mu);
  programs_by_op().clear();
}

pjrt::ExecutablePtr compile_cached(const std::string& mlir, const pjrt::CompileOptions& options) {
  auto& cc = cache::process_cache(client_ptr());
  const cache::Stats before = cc.stats();
  auto t0 = std::chrono::steady_clock::now();
  pjrt::ExecutablePtr exe = cc.get(mlir, options);
  auto dt = std::chrono::steady_clock::now() - t0;
  trace_cache_tier(before, cc.stats());
  const int64_t misses = before.misses;
  // Disk and shared hits load a serialized executable: only misses compile.
  if (cc.stats().misses > misses) {
    metrics().compiles++;
    metrics().compile_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count();
  }
  return exe;
}

std::vector<pjrt::BufferPtr> launch(pjrt::Executable& exe, const std::vector<pjrt::BufferPtr>& args,
                                    int device, c10::function_ref<std::string()> what) {
  pjrt::Buffer* small[16];
  std::vector<pjrt::Buffer*> big;
  pjrt::Buffer** raw = small;
  if (args.size() > 16) {
    big.resize(args.size());
    raw = big.data();
  }
  for (size_t i = 0; i < args.size(); ++i) raw[i] = args[i].get();
  std::vector<pjrt::BufferPtr> outs = exe.execute({raw, args.size()}, device);
  metrics().executions++;
  if (mode() == Mode::Debug) {
    for (const auto& o : outs) o->await_ready();
    if (what && check_nans()) check_finite(outs, what);
  } else if (!outs.empty()) {
    track_inflight(outs.back());
  }
  return outs;
}

void track_inflight(const pjrt::BufferPtr& out) {
  std::weak_ptr<pjrt::Buffer> oldest;
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    auto& inflight = inflight_queue();
    inflight.push_back(out);
    if (inflight.size() <= max_inflight()) return;
    oldest = std::move(inflight.front());
    inflight.pop_front();
  }
  // Errors surface where the value is read; the queue only bounds progress.
  try {
    if (auto b = oldest.lock()) b->await_ready();
  } catch (...) {
  }
}

void synchronize() {
  TraceScope trace("torchtpu::synchronize");
  publish(Event::SyncRequested, "synchronize");
  std::deque<std::weak_ptr<pjrt::Buffer>> pending;
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    pending.swap(inflight_queue());
  }
  for (auto& w : pending)
    if (auto b = w.lock()) b->await_ready();
}

}  // namespace torchtpu::aten
