#include "aten/launch.h"

#include <ATen/Context.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/isfinite.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "aten/async_runs.h"
#include "aten/events.h"
#include "aten/runtime.h"
#include "cache/compile_cache.h"
#include "hlo/builder.h"
#include "hlo/work.h"
#include "lower/types.h"

namespace torchtpu::aten {

namespace {

// Two generations of about half the limit each: a hit in the old one moves
// to the young one, and a full young one replaces the old (whose programs are
// released). A program used since the last turn survives it, so a loop's
// programs stay while others come and go.
struct ProgramTable {
  using Map = std::unordered_map<std::string, std::shared_ptr<const Launchable>>;
  Map young, old;
};
std::mutex table_mu;
ProgramTable& table() {
  static auto* t = new ProgramTable();
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
// A run in flight: its last output, held weakly (a queued buffer must not count as
// a holder, it would veto donation), and that output's watch ticket, which finds
// the run's kept ready event once the output is gone.
struct Inflight {
  std::weak_ptr<pjrt::Buffer> out;
  uint64_t ticket;
};
std::deque<Inflight>& inflight_queue() {
  static auto* q = new std::deque<Inflight>();
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
void trace_cache_tier(cache::Source source) {
  TraceScope mark([&] {
    const char* tier = source == cache::Source::Memory   ? "memory_hit"
                       : source == cache::Source::Disk   ? "disk_hit"
                       : source == cache::Source::Shared ? "shared_hit"
                       : source == cache::Source::Pack   ? "pack_hit"
                                                         : "miss";
    return std::string("torchtpu::compile_cache ") + tier;
  });
}

// Which programs compile quick first and tier up in the background
// (TORCHTPU_TIERED_COMPILE). All of them only on request, as cudnn.benchmark
// is: which build runs a step depends on when the background compile finishes
// and on what the cache held, and the builds of a program with reductions or
// transcendental functions differ in the last bit (Adam magnifies that in
// weights whose gradients are near zero). By default only the XLA:CPU
// programs whose two builds agree bit for bit (hlo::ModuleWork::exact:
// AdamW's foreach ops, most pointwise ops), so results never depend on it.
enum class Tiers { None, Exact, All };
Tiers tiers() {
  static const Tiers t = [] {
    const char* v = std::getenv("TORCHTPU_TIERED_COMPILE");
    if (!v || !*v) return Tiers::Exact;
    return std::string(v) == "0" ? Tiers::None : Tiers::All;
  }();
  return t;
}

// When the foreground last compiled: tier-ups wait for a quiet spell so they
// never slow a cold step's own compiles.
std::atomic<int64_t> last_foreground_compile_ns{0};
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// XLA:CPU's elemental emitter: the newer fusion emitters build an MLIR context
// per fusion, most of the compile of a program of plain loops, and emit the same
// loops (a MobileNetV3 step's programs, AdamW's foreach ops: 2x less compile
// time, steps as fast). Graphs with reductions, scatters and sorts run faster
// from the fusion emitters (GPT and CNN Fused steps: 8-13%), so those keep them.
const pjrt::CompileOptions& loop_options() {
  static const pjrt::CompileOptions o{.overrides = {{"xla_cpu_use_fusion_emitters", false}}};
  return o;
}

// Tiered quick builds on XLA:CPU: the elemental emitter and LLVM at level 1.
// (Level 0 with the elemental emitter compiles faster still, but lost part of
// amax's gradient after a gelu in test_compile's masked reductions.)
const pjrt::CompileOptions& cpu_quick_options() {
  static const pjrt::CompileOptions o{.overrides = {{"xla_backend_optimization_level", int64_t{1}},
                                                    {"xla_cpu_use_fusion_emitters", false}}};
  return o;
}

// `o` with its LLVM module in one part (CodegenParts::One).
pjrt::CompileOptions one_part(pjrt::CompileOptions o) {
  o.overrides.push_back({"xla_cpu_parallel_codegen_split_count", int64_t{1}});
  return o;
}

// Small programs' build: the quick build (about 1.5x faster to compile, loops
// as fast at these sizes), its LLVM module in one part: XLA's parallel parts
// cost more than they save on a module this small (about 15% of the compile).
const pjrt::CompileOptions& small_options() {
  static const pjrt::CompileOptions o = one_part(cpu_quick_options());
  return o;
}

// XLA's own settings: no overrides.
const pjrt::CompileOptions& default_options() {
  static const pjrt::CompileOptions o;
  return o;
}

// Per-op programs' full builds (CodegenParts::One).
const pjrt::CompileOptions& loop_options_one_part() {
  static const pjrt::CompileOptions o = one_part(loop_options());
  return o;
}
const pjrt::CompileOptions& default_options_one_part() {
  static const pjrt::CompileOptions o = one_part(default_options());
  return o;
}

// What XLA gets for a build: small programs and quick builds keep the LLVM
// options XLA_FLAGS gives them (no loop unrolling or vectorization: about 1.7x
// less compile time at these sizes); every other build clears them.
pjrt::CompileOptions xla_build(const pjrt::CompileOptions& o) {
  if (&o == &small_options() || &o == &cpu_quick_options() || !small_llvm_flags()) return o;
  pjrt::CompileOptions full = o;
  full.overrides.push_back({"xla_backend_extra_options", std::string()});
  return full;
}

cache::CompileCache& program_cache() { return cache::process_cache(client_ptr()); }

bool cpu_builds_on() {
  static const bool on = !small_builds_off() && client().platform_name() == "cpu";
  return on;
}

// A tiered program's first build: the quick build on XLA:CPU (a per-op
// program's in one part, as small programs are built), XLA's level 0 elsewhere.
const pjrt::CompileOptions& quick_options(CodegenParts parts) {
  static const pjrt::CompileOptions level0{
      .overrides = {{"xla_backend_optimization_level", int64_t{0}}}};
  if (!cpu_builds_on()) return level0;
  return parts == CodegenParts::One ? small_options() : cpu_quick_options();
}

// Limits for a program whose loops are too small for optimized code to pay
// (hlo::ModuleWork): loops of at most 2048 elements, dots and convolutions on
// at most 16384 (a small gemv).
constexpr int64_t kSmallLoopElements = 2048;
constexpr int64_t kSmallDotElements = 16384;

// The build a program gets for good on XLA:CPU, or null for XLA's default:
// small_options() when its loops are too short for the optimized build's speed
// to show (a cold start is mostly such compiles: a decode step's ops, a bias's
// gradient), loop_options() when it has no reduction, scatter or sort. Decided
// by the program text alone, so a program always gets the same build, in every
// mode and run (tiered compiles build a plain program quick first, then this
// one); `parts` only splits the LLVM module, the code is the same.
// TORCHTPU_SMALL_QUICK=0 compiles every program with XLA's default.
const pjrt::CompileOptions* cpu_build(const hlo::ModuleWork& work, CodegenParts parts) {
  if (!cpu_builds_on()) return nullptr;
  if (work.loop <= kSmallLoopElements && work.dot <= kSmallDotElements) return &small_options();
  if (parts == CodegenParts::Xla) return work.regions ? nullptr : &loop_options();
  return work.regions ? &default_options_one_part() : &loop_options_one_part();
}

// Background compiles of optimized builds. Workers hold entries weakly: a
// program dropped from the table is not compiled. At exit the workers finish
// the compile in hand and stop before the runtime is torn down.
class TierUps {
 public:
  static TierUps& get() {
    static auto* t = new TierUps();
    return *t;
  }
  void request(const Launchable& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (threads_.empty()) {
      int n = env_int("TORCHTPU_COMPILE_THREADS",
                      std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1));
      for (int i = 0; i < std::max(1, n); ++i) threads_.emplace_back([this] { work(); });
      std::atexit([] { get().stop(); });
    }
    queue_.push_back(e.weak_from_this());
    cv_.notify_one();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return queue_.empty() && busy_ == 0; });
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      queue_.clear();
    }
    cv_.notify_all();
    quiet_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void work() {
    for (;;) {
      std::shared_ptr<const Launchable> e;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) return;
        e = queue_.front().lock();
        queue_.pop_front();
        busy_++;
      }
      if (e && wait_for_quiet()) promote(*e);
      std::lock_guard<std::mutex> lock(mu_);
      busy_--;
      if (queue_.empty() && busy_ == 0) idle_.notify_all();
    }
  }
  // False when the process is exiting (nothing more is compiled).
  bool wait_for_quiet() {
    static const int64_t quiet_ns = int64_t{env_int("TORCHTPU_TIER_UP_QUIET_MS", 300)} * 1000000;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (stopping_) return false;
      int64_t left = last_foreground_compile_ns.load() + quiet_ns - now_ns();
      if (left <= 0) return true;
      quiet_.wait_for(lock, std::chrono::nanoseconds(left));
    }
  }
  static void promote(const Launchable& e) {
    try {
      cache::Source source;
      auto t0 = std::chrono::steady_clock::now();
      pjrt::ExecutablePtr exe =
          program_cache().get(e.quick_mlir, xla_build(*e.final_options), &source);
      if (source == cache::Source::Compiled) {
        metrics().tier_up_compiles++;
        metrics().tier_up_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                    std::chrono::steady_clock::now() - t0)
                                    .count();
      }
      e.optimized = std::move(exe);
      e.tier.store(Launchable::Promoted, std::memory_order_release);
      metrics().tier_ups++;
    } catch (const std::exception& err) {
      // The quick build stays: the same program, with slower loops.
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr, "[tpu] an optimized recompile failed; keeping the quick build: %s\n",
                     err.what());
      });
      e.tier.store(Launchable::Final, std::memory_order_release);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_, quiet_;
  std::deque<std::weak_ptr<const Launchable>> queue_;
  std::vector<std::thread> threads_;
  int busy_ = 0;
  bool stopping_ = false;
};

// The build a run uses; a quick one counts the run toward its tier-up.
pjrt::Executable& current_build(const Launchable& e) {
  switch (e.tier.load(std::memory_order_acquire)) {
    case Launchable::Promoted: return *e.optimized;
    case Launchable::Quick: {
      static const int after = std::max(1, env_int("TORCHTPU_TIER_UP_RUNS", 2));
      int expected = Launchable::Quick;
      if (e.runs.fetch_add(1, std::memory_order_relaxed) + 1 >= after &&
          e.tier.compare_exchange_strong(expected, Launchable::Queued))
        TierUps::get().request(e);
      return *e.exe;
    }
    default: return *e.exe;
  }
}

}  // namespace

size_t program_table_limit() {
  static const size_t n = static_cast<size_t>(cache::process_config().memory_entries);
  return n;
}

namespace {
void add_young(ProgramTable& t, std::string key, std::shared_ptr<const Launchable> entry) {
  if (t.young.size() >= std::max<size_t>(1, program_table_limit() / 2)) {
    t.old = std::move(t.young);
    t.young.clear();
  }
  t.young.insert_or_assign(std::move(key), std::move(entry));
}
}  // namespace

namespace {
// PyTorch's own float32 settings decide what our f32 dots and convolutions may
// do, as they decide for its CUDA kernels: TF32 where the CUDA matmul or conv
// setting allows it (torch.set_float32_matmul_precision("high"),
// torch.backends.cuda.matmul.fp32_precision, cudnn.allow_tf32: on by default
// for convolutions), IEEE float32 elsewhere. Read through the per-backend API,
// which answers whichever API set it (float32MatmulPrecision() throws once the
// newer API was used). Only XLA:GPU differs by setting. Programs built under
// another setting are dropped when it changes (read on every lookup); one whose
// build was in flight then still lands with the setting it started under.
hlo::FloatPrecision torch_float_precision() {
  const at::Context& ctx = at::globalContext();
  auto tf32 = [&](at::Float32Op op) {
    return ctx.float32Precision(at::Float32Backend::CUDA, op) == at::Float32Precision::TF32
               ? hlo::Precision::Default
               : hlo::Precision::Highest;
  };
  return {tf32(at::Float32Op::MATMUL), tf32(at::Float32Op::CONV)};
}

void sync_float_precision() {
  const hlo::FloatPrecision p = torch_float_precision();
  if (p == hlo::float_precision()) return;
  std::lock_guard<std::mutex> lock(table_mu);
  hlo::set_float_precision(p);
  table().young.clear();
  table().old.clear();
}
}  // namespace

std::shared_ptr<const Launchable> find_program(const std::string& key) {
  sync_float_precision();
  std::lock_guard<std::mutex> lock(table_mu);
  ProgramTable& t = table();
  if (auto it = t.young.find(key); it != t.young.end()) return it->second;
  auto it = t.old.find(key);
  if (it == t.old.end()) return nullptr;
  auto node = t.old.extract(it);
  std::shared_ptr<const Launchable> entry = node.mapped();
  add_young(t, std::move(node.key()), std::move(node.mapped()));
  return entry;
}

void add_program(std::string key, std::shared_ptr<const Launchable> entry) {
  std::lock_guard<std::mutex> lock(table_mu);
  table().old.erase(key);
  add_young(table(), std::move(key), std::move(entry));
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

namespace {

// Counts a compile (and its time) only when this request compiled.
pjrt::ExecutablePtr counted(cache::Source source, pjrt::ExecutablePtr exe,
                            std::chrono::steady_clock::time_point t0) {
  trace_cache_tier(source);
  if (source == cache::Source::Compiled) {
    last_foreground_compile_ns = now_ns();
    metrics().compiles++;
    metrics().compile_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
  }
  return exe;
}

}  // namespace

pjrt::ExecutablePtr compile_cached(const std::string& mlir, const pjrt::CompileOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  cache::Source source;
  pjrt::ExecutablePtr exe = program_cache().get(mlir, xla_build(options), &source);
  return counted(source, std::move(exe), t0);
}

namespace {

// A quick or small build through the cache, counted apart.
pjrt::ExecutablePtr quick_build(const std::string& mlir, const pjrt::CompileOptions& options,
                                std::chrono::steady_clock::time_point t0) {
  cache::Source source;
  pjrt::ExecutablePtr exe = program_cache().get(mlir, xla_build(options), &source);
  if (source == cache::Source::Compiled) metrics().quick_compiles++;
  return counted(source, std::move(exe), t0);
}

}  // namespace

namespace {

void compile_now(const std::string& mlir, Launchable& entry, CodegenParts parts) {
  auto t0 = std::chrono::steady_clock::now();
  const hlo::ModuleWork work = cpu_builds_on() ? hlo::module_work(mlir) : hlo::ModuleWork{};
  const pjrt::CompileOptions* build = cpu_build(work, parts);
  // Under torch.use_deterministic_algorithms a program keeps one build.
  const Tiers t = at::globalContext().deterministicAlgorithms() ? Tiers::None : tiers();
  const bool tiered = t == Tiers::All || (t == Tiers::Exact && build && work.exact);
  if (build == &small_options() || (build && !tiered)) {
    entry.exe = build == &default_options_one_part() ? compile_cached(mlir, *build)
                                                     : quick_build(mlir, *build, t0);
    return;
  }
  if (!tiered) {
    entry.exe = compile_cached(mlir);
    return;
  }
  const pjrt::CompileOptions& final_options = build ? *build : default_options();
  cache::Source source;
  if (pjrt::ExecutablePtr exe = program_cache().find(mlir, xla_build(final_options), &source)) {
    entry.exe = counted(source, std::move(exe), t0);
    return;
  }
  entry.exe = quick_build(mlir, quick_options(parts), t0);
  entry.quick_mlir = mlir;
  entry.final_options = &final_options;
  entry.tier.store(Launchable::Quick, std::memory_order_release);
}

}  // namespace

void compile_program(const std::string& mlir, Launchable& entry, CodegenParts parts) {
  if (!async_runs::enabled()) return compile_now(mlir, entry, parts);
  // The result types let a launch queued later (behind another compile) hand out placeholders.
  std::optional<std::vector<hlo::Type>> results = hlo::module_results(mlir);
  if (results)
    for (hlo::Type& t : *results) entry.results.emplace_back(t.dtype, std::move(t.shape));
  std::shared_ptr<Launchable> self = entry.weak_from_this().lock();
  // External functions (JAX) may pass through a Python translator, which needs
  // the GIL that a waiting host thread holds: those compile here.
  const bool external = hlo::Builder::marks_external(mlir);
  // Under torch.profiler the compile stays inside the op's range (its cache
  // tier mark is recorded on this thread).
  const bool profiled = at::getStepCallbacksUnlessEmpty(at::RecordScope::USER_SCOPE).has_value();
  if (!results || !self || external || profiled || mode() == Mode::Debug)
    return compile_now(mlir, entry, parts);
  entry.state.store(Launchable::Compiling, std::memory_order_release);
  async_runs::submit_compile([self = std::move(self), mlir, parts] {
    try {
      compile_now(mlir, *self, parts);
      self->state.store(Launchable::Ready, std::memory_order_release);
    } catch (const std::exception& e) {
      self->compile_error = e.what();
      self->state.store(Launchable::Failed, std::memory_order_release);
    }
  });
}

void wait_tier_ups() {
  async_runs::wait_idle();
  TierUps::get().wait_idle();
}

namespace {
std::atomic<ReplicatedRunner> g_replicated{nullptr};
}

void set_replicated_runner(ReplicatedRunner runner) { g_replicated = runner; }

pjrt::CompileOptions replica_options(const std::vector<int64_t>& devices) {
  pjrt::CompileOptions options{.num_replicas = static_cast<int>(devices.size())};
  for (size_t i = 0; i < devices.size(); ++i)
    if (devices[i] != static_cast<int64_t>(i)) {
      for (int64_t d : devices) options.replica_devices.push_back(client().device_id(int(d)));
      break;
    }
  return options;
}

namespace {

// Runs the entry's current build now (PJRT only enqueues it).
std::vector<pjrt::BufferPtr> run_now(const Launchable& entry,
                                     const std::vector<pjrt::BufferPtr>& args, int device) {
  pjrt::Executable& exe = current_build(entry);
  pjrt::Buffer* small[16];
  std::vector<pjrt::Buffer*> big;
  pjrt::Buffer** raw = small;
  if (args.size() > 16) {
    big.resize(args.size());
    raw = big.data();
  }
  for (size_t i = 0; i < args.size(); ++i) raw[i] = args[i].get();
  return exe.execute({raw, args.size()}, device);
}

}  // namespace

std::vector<pjrt::BufferPtr> launch(const Launchable& entry,
                                    const std::vector<pjrt::BufferPtr>& args, int device,
                                    c10::function_ref<std::string()> what) {
  const bool ready = entry.state.load(std::memory_order_acquire) == Launchable::Ready;
  if (!ready || async_runs::busy()) {
    if (entry.replica_group < 0 && mode() != Mode::Debug && !entry.results.empty()) {
      // Behind a compile: queued in the host's order; placeholders stand for the outputs.
      metrics().executions++;
      thread_work().executions++;
      std::vector<pjrt::BufferPtr> outs =
          async_runs::enqueue(entry.shared_from_this(), args, device, run_now);
      if (!outs.empty()) track_inflight(outs.back());
      return outs;
    }
    // Runs now: after everything queued, once its build is there.
    async_runs::wait_idle();
    TORCH_CHECK(entry.state.load(std::memory_order_acquire) != Launchable::Failed,
                "[tpu] compiling ", what ? what() : std::string("a program"),
                " failed: ", entry.compile_error);
  }
  if (entry.replica_group >= 0) {
    ReplicatedRunner run = g_replicated;
    TORCH_CHECK(run,
                "[tpu] a program with SPMD collectives runs only on thread ranks "
                "(torchtpu.distributed.run_on_devices)");
    std::vector<pjrt::BufferPtr> outs = run(entry, args, device, what ? what() : "");
    metrics().executions++;
    thread_work().executions++;
    return outs;
  }
  std::vector<pjrt::BufferPtr> outs = run_now(entry, args, device);
  metrics().executions++;
  thread_work().executions++;
  if (mode() == Mode::Debug) {
    for (const auto& o : outs) o->await_ready();
    if (what && check_nans()) check_finite(outs, what);
  } else if (!outs.empty()) {
    track_inflight(outs.back());
  }
  return outs;
}

void track_inflight(const pjrt::BufferPtr& out) {
  // Watched: synchronize() waits for the run even if its outputs are dropped.
  Inflight run{out, out->watch()};
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    auto& inflight = inflight_queue();
    inflight.push_back(std::move(run));
    if (inflight.size() <= max_inflight()) return;
    run = std::move(inflight.front());
    inflight.pop_front();
  }
  // Errors surface where the value is read; the queue only bounds progress. An
  // oldest run whose outputs were all dropped is waited for through its own kept
  // ready event (none is kept when it had finished), never another run's.
  try {
    if (auto b = run.out.lock()) {
      if (!b->is_ready()) {
        metrics().inflight_waits++;
        b->await_ready();
      }
    } else if (pjrt::await_dropped_producer(run.ticket)) {
      metrics().inflight_waits++;
    }
  } catch (...) {
  }
}

void synchronize() {
  TraceScope trace("torchtpu::synchronize");
  publish(Event::SyncRequested, "synchronize");
  async_runs::wait_idle();
  std::deque<Inflight> pending;
  {
    std::lock_guard<std::mutex> lock(inflight_mu);
    pending.swap(inflight_queue());
  }
  for (auto& run : pending)
    if (auto b = run.out.lock()) b->await_ready();
  pjrt::await_dropped_producers();
}

}  // namespace torchtpu::aten
