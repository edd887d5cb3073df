#include "aten/runtime.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/AutogradState.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <dlfcn.h>
#include <torch/csrc/autograd/autograd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <type_traits>
#include <unordered_map>

#include "aten/events.h"

namespace torchtpu::aten {

namespace {

// Site-packages dirs to search for plugins: next to torch (same venv) and any
// TORCHTPU_PLUGIN_PATH entries.
std::vector<std::string> plugin_search_dirs() {
  std::vector<std::string> dirs;
  if (const char* extra = std::getenv("TORCHTPU_PLUGIN_PATH")) {
    std::string s(extra);
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t next = s.find(':', pos);
      if (next == std::string::npos) next = s.size();
      if (next > pos) dirs.push_back(s.substr(pos, next - pos));
      pos = next + 1;
    }
  }
  // libc10.so lives in <site-packages>/torch/lib.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&c10::GetAllocator), &info) && info.dli_fname) {
    namespace fs = std::filesystem;
    dirs.push_back(fs::path(info.dli_fname).parent_path().parent_path().parent_path().string());
  }
  return dirs;
}

struct ClientState {
  std::once_flag once;
  pjrt::ClientPtr client;
  std::string error;
  std::atomic<bool> started{false};
};

// Leaked on purpose: tensors may die after static destructors run at exit,
// and their buffers need a live client.
ClientState& state() {
  static auto* s = new ClientState();
  return *s;
}

bool small_llvm_flags_set = false;  // Written once, before the plugin loads.

// PyTorch's maximum/minimum/clamp return NaN when either operand is NaN; XLA:CPU's
// default "fast" min/max drops a NaN in one operand. Read when the plugin
// compiles, so it is set before the plugin loads (a user's own setting wins).
void xla_flag_defaults() {  // XLA:CPU only
  const char* v = std::getenv("XLA_FLAGS");
  std::string flags = v ? v : "";
  auto add = [&flags](const char* flag) {
    flags += (flags.empty() ? "" : " ") + std::string(flag);
  };
  if (flags.find("xla_cpu_enable_fast_min_max") == std::string::npos)
    add("--xla_cpu_enable_fast_min_max=false");
  // LLVM without loop unrolling or vectorization, for small programs' builds
  // (launch.cpp): a program's options can clear this map but not set it.
  if (flags.find("xla_backend_extra_options") == std::string::npos && !small_builds_off()) {
    add("--xla_backend_extra_options=xla_cpu_disable_loop_unrolling,xla_cpu_optimize_for_size");
    small_llvm_flags_set = true;
  }
  ::setenv("XLA_FLAGS", flags.c_str(), 1);
}

std::atomic<ClientKvProvider> kv_provider{nullptr};
std::optional<ClientKv> used_kv;            // Written once, inside make_client.
std::vector<std::string> cuda_libs_report;  // Idem.

pjrt::ClientPtr make_client() {
  std::string platform =
      std::getenv("TORCHTPU_PLATFORM") ? std::getenv("TORCHTPU_PLATFORM") : "cpu";
  if (platform == "cpu") xla_flag_defaults();
  std::vector<std::string> dirs = plugin_search_dirs();
  std::string path = pjrt::find_plugin(dirs);
  // jax's CUDA plugin dlopens the NVIDIA libraries by soname; its RPATH only
  // finds them when it sits in the same site-packages as the nvidia wheels.
  if (platform == "cuda") cuda_libs_report = pjrt::preload_cuda_libraries(path, dirs);
  auto plugin = pjrt::Plugin::load(path);
  pjrt::CreateOptions opts;
  std::shared_ptr<pjrt::KeyValueStore> kv;
  if (ClientKvProvider provider = kv_provider.load()) {
    if (std::optional<ClientKv> setup = provider(platform)) {
      kv = setup->store;
      if (platform == "cuda") {
        opts["node_id"] = setup->node_id;
        opts["num_nodes"] = setup->num_nodes;
      }
      used_kv = std::move(setup);
    }
  }
  if (platform == "cpu") {
    // Under torchrun each process sees one device per local rank, so that
    // set_device(LOCAL_RANK) works as on CUDA.
    const char* n = std::getenv("TORCHTPU_NUM_DEVICES");
    if (!n) n = std::getenv("LOCAL_WORLD_SIZE");
    opts["cpu_device_count"] = std::max<int64_t>(1, n ? std::atoll(n) : 1);
  } else if (platform == "cuda") {
    // Leave GPU memory to PyTorch and others: no 75% preallocation.
    opts["preallocate"] = false;
  }
  return pjrt::Client::create(plugin, opts, std::move(kv));
}

thread_local int tls_device = 0;
// The context manager's mode lives in PyTorch's thread-local debug info, which
// the autograd engine carries to its device threads: a backward() inside
// `with eager_mode("fused")` is recorded too.
constexpr std::string_view kModeInfoName = "TORCHTPU_EAGER_MODE";
template <class Kind>
Kind mode_info_kind() {
  if constexpr (std::is_enum_v<Kind>) {
    // torch < 2.13: a closed enum. The slots are a list keyed by value, so an
    // unused value is ours.
    return static_cast<Kind>(0xE7);
  } else {
    return Kind(&kModeInfoName);
  }
}
const c10::DebugInfoKind kModeInfo = mode_info_kind<c10::DebugInfoKind>();
struct ModeInfo final : c10::DebugInfoBase {
  explicit ModeInfo(Mode m) : mode(m) {}
  Mode mode;
};

bool env_true(const char* n) {
  const char* v = std::getenv(n);
  return v && std::string(v) != "0" && std::string(v) != "";
}

Mode initial_mode() {
  const char* m = std::getenv("TORCHTPU_EAGER");
  if ((m && std::string(m) == "debug") || env_true("TPU_LAUNCH_BLOCKING")) return Mode::Debug;
  if ((m && std::string(m) == "fused") || env_true("TORCH_TPU_DEFER_AND_FUSE")) return Mode::Fused;
  return Mode::Strict;
}
std::atomic<int> global_mode_value{static_cast<int>(initial_mode())};

}  // namespace

pjrt::ClientPtr client_ptr() {
  auto& s = state();
  std::call_once(s.once, [&] {
    try {
      s.client = make_client();
      s.started = true;
    } catch (const std::exception& e) {
      s.error = e.what();
    }
  });
  TORCH_CHECK(s.client, "[tpu] cannot start the PJRT runtime: ", s.error);
  return s.client;
}

pjrt::Client& client() { return *client_ptr(); }

void set_client_kv_provider(ClientKvProvider provider) { kv_provider.store(provider); }

std::optional<ClientKv> client_kv() {
  if (!runtime_started()) return std::nullopt;
  return used_kv;
}

std::vector<std::string> cuda_library_report() {
  if (!runtime_started()) return {};
  return cuda_libs_report;
}

bool runtime_started() noexcept { return state().started; }

bool small_builds_off() {
  static const bool off = !env_default_on("TORCHTPU_SMALL_QUICK");
  return off;
}

bool small_llvm_flags() {
  client();
  return small_llvm_flags_set;
}

void drain_autograd_device_thread() {
  if (!runtime_started()) return;
  // Tensors made here have no Python objects, and nothing is computed: the
  // finished task holds nothing whose release needs the GIL.
  // PyTorch runs one device thread per device index. The importing thread runs
  // its own backward passes (torchtpu/__init__.py); this one must reach the
  // device threads that other threads' passes used.
  c10::AutogradState& state = c10::AutogradState::get_tls_state();
  const bool was = state.get_multithreading_enabled();
  state.set_multithreading_enabled(true);
  struct Restore {
    c10::AutogradState& s;
    bool v;
    ~Restore() { s.set_multithreading_enabled(v); }
  } restore{state, was};
  for (int i = 0; i < device_count(); ++i) {
    auto opts = at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, i));
    at::Tensor x = at::empty({}, opts).requires_grad_(true);
    torch::autograd::backward({x.view({1})}, {at::empty({1}, opts)});
  }
}

int device_count() noexcept {
  try {
    return client_ptr()->device_count();
  } catch (...) {
    return 0;
  }
}

void check_device(int index) {
  int n = device_count();
  TORCH_CHECK_INDEX(index >= 0 && index < n, "[tpu] device index ", index,
                    " is out of range: this process has ", n, " tpu device(s) (valid: 0..", n - 1,
                    "); set TORCHTPU_NUM_DEVICES for more CPU devices");
}

int current_device() { return tls_device; }
void set_current_device(int index) {
  check_device(index);
  tls_device = index;
}

Mode mode() {
  if (auto* info = static_cast<ModeInfo*>(c10::ThreadLocalDebugInfo::get(kModeInfo)))
    return info->mode;
  return static_cast<Mode>(global_mode_value.load());
}
Mode global_mode() { return static_cast<Mode>(global_mode_value.load()); }
// Leaving Fused Eager is published, so what was recorded runs and the new
// mode sees real values.
namespace {
void left(Mode before) {
  if (before == Mode::Fused && mode() != Mode::Fused) publish(Event::ModeLeft, "mode_switch");
}
}  // namespace
void set_mode(Mode m) {
  Mode before = mode();
  global_mode_value = static_cast<int>(m);
  left(before);
}
void push_thread_mode(Mode m) {
  Mode before = mode();
  c10::ThreadLocalDebugInfo::_push(kModeInfo, std::make_shared<ModeInfo>(m));
  left(before);
}
void pop_thread_mode() {
  Mode before = mode();
  c10::ThreadLocalDebugInfo::_pop(kModeInfo);
  left(before);
}

const char* mode_name(Mode m) {
  return m == Mode::Debug ? "debug" : m == Mode::Fused ? "fused" : "strict";
}
Mode parse_mode(const std::string& s) {
  for (Mode m : {Mode::Strict, Mode::Debug, Mode::Fused})
    if (s == mode_name(m)) return m;
  TORCH_CHECK(false, "[tpu] unknown eager mode '", s, "'; expected 'strict', 'debug' or 'fused'");
}

static bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}
bool check_nans() { return env_flag("TORCHTPU_CHECK_NANS"); }
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
bool cpu_fallback_enabled() { return env_flag("TORCHTPU_CPU_FALLBACK"); }
bool env_default_on(const char* name) {
  const char* v = std::getenv(name);
  return !v || std::string(v) != "0";
}

Metrics& metrics() {
  static Metrics m;
  return m;
}

namespace {
thread_local int64_t this_thread_syncs = 0;
}
void note_host_sync() {
  metrics().host_syncs++;
  this_thread_syncs++;
}
int64_t thread_host_syncs() { return this_thread_syncs; }
ThreadWork& thread_work() {
  thread_local ThreadWork w;
  return w;
}

void TraceScope::begin(const std::string& name, int64_t value) {
  if (value < 0) return rf_->before(name);
  const c10::IValue in(value);
  rf_->before(name, c10::ArrayRef<const c10::IValue>(&in, 1));
}

// --- storage and allocator

// Device memory the allocator hands out: TORCHTPU_MEMORY_LIMIT bytes, else the
// host's physical memory (the XLA:CPU plugin allocates there).
int64_t memory_limit() {
  static int64_t limit = [] {
    if (const char* v = std::getenv("TORCHTPU_MEMORY_LIMIT"))
      return static_cast<int64_t>(std::atoll(v));
    return static_cast<int64_t>(sysconf(_SC_PAGE_SIZE)) *
           static_cast<int64_t>(sysconf(_SC_PHYS_PAGES));
  }();
  return limit;
}

namespace {

using c10::CachingDeviceAllocator::DeviceStats;
constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);

// Leaked, like the client: storages may be freed after static destructors ran.
std::mutex& memory_mu() {
  static auto* m = new std::mutex();
  return *m;
}
std::unordered_map<int, DeviceStats>& device_stats() {  // under memory_mu()
  static auto* m = new std::unordered_map<int, DeviceStats>();
  return *m;
}

// Every statistic the allocator keeps (block counts, then byte counts).
auto stat_arrays(DeviceStats& st) {
  return std::array{&st.allocation,     &st.segment,      &st.active,         &st.allocated_bytes,
                    &st.reserved_bytes, &st.active_bytes, &st.requested_bytes};
}

// Byte counts of a live storage: allocated == reserved == active == requested.
void add_bytes(DeviceStats& st, int64_t delta) {
  for (auto* a : {&st.allocated_bytes, &st.reserved_bytes, &st.active_bytes, &st.requested_bytes}) {
    if (delta >= 0)
      (*a)[kAll].increase(static_cast<size_t>(delta));
    else
      (*a)[kAll].decrease(static_cast<size_t>(-delta));
  }
}

void add_bytes_in_use(int64_t delta) {
  auto& m = metrics();
  int64_t now = (m.bytes_in_use += delta);
  int64_t peak = m.peak_bytes.load();
  while (now > peak && !m.peak_bytes.compare_exchange_weak(peak, now)) {
  }
}

void delete_storage(void* ctx) {
  auto* s = static_cast<DeviceStorage*>(ctx);
  if (!publish_storage_freed(s)) free_storage(s);
}

// Counts the allocation of `n` bytes on `dev`, or raises OutOfMemoryError when
// the device's limit would be passed.
void take_memory(size_t n, int dev) {
  const int64_t limit = memory_limit();
  int64_t in_use = 0;
  {
    std::lock_guard<std::mutex> lock(memory_mu());
    DeviceStats& st = device_stats()[dev];
    in_use = st.allocated_bytes[kAll].current;
    if (static_cast<int64_t>(n) <= limit - in_use) {
      add_bytes(st, static_cast<int64_t>(n));
      for (auto* a : {&st.allocation, &st.segment, &st.active}) (*a)[kAll].increase(1);
      st.num_device_alloc++;
      in_use = -1;
    } else {
      st.num_ooms++;
    }
  }
  TORCH_CHECK_WITH(
      OutOfMemoryError, in_use < 0, "[tpu] out of memory on tpu:", dev, ": tried to allocate ", n,
      " bytes with ", in_use, " bytes in use of ", limit,
      " available. Free tensors, use smaller batches, or raise TORCHTPU_MEMORY_LIMIT.");
  add_bytes_in_use(static_cast<int64_t>(n));
}

class TpuAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    int dev = current_device();
    take_memory(n, dev);
    auto* s = new DeviceStorage();
    s->device = dev;
    s->nbytes = n;
    // The data pointer is the context itself: a unique, never-dereferenced id.
    return {s, s, &delete_storage, c10::Device(c10::DeviceType::PrivateUse1, dev)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, size_t) const override {
    TORCH_CHECK(false, "[tpu] raw device copies are not supported; use tensor.copy_()");
  }
  bool initialized() override { return true; }
  // Nothing is cached: a storage's buffer is released when the storage dies.
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  DeviceStats getDeviceStats(c10::DeviceIndex d) override { return memory_stats(d); }
  void resetAccumulatedStats(c10::DeviceIndex d) override { reset_accumulated_memory(d); }
  void resetPeakStats(c10::DeviceIndex d) override { reset_peak_memory(d); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    const int64_t limit = memory_limit();
    const int64_t used = memory_stats(d).allocated_bytes[kAll].current;
    return {static_cast<size_t>(std::max<int64_t>(0, limit - used)), static_cast<size_t>(limit)};
  }
};

TpuAllocator g_allocator;

}  // namespace

void free_storage(DeviceStorage* s) {
  {
    std::lock_guard<std::mutex> lock(memory_mu());
    DeviceStats& st = device_stats()[s->device];
    add_bytes(st, -static_cast<int64_t>(s->nbytes));
    for (auto* a : {&st.allocation, &st.segment, &st.active}) (*a)[kAll].decrease(1);
    st.num_device_free++;
  }
  metrics().bytes_in_use -= static_cast<int64_t>(s->nbytes);
  delete s;
}

c10::Allocator* allocator() { return &g_allocator; }

DeviceStats memory_stats(int device) {
  std::lock_guard<std::mutex> lock(memory_mu());
  return device_stats()[device];
}

void reset_peak_memory(int device) {
  std::lock_guard<std::mutex> lock(memory_mu());
  DeviceStats& st = device_stats()[device];
  for (auto* a : stat_arrays(st)) (*a)[kAll].reset_peak();
  metrics().peak_bytes = metrics().bytes_in_use.load();
}

void reset_accumulated_memory(int device) {
  std::lock_guard<std::mutex> lock(memory_mu());
  DeviceStats& st = device_stats()[device];
  for (auto* a : stat_arrays(st)) (*a)[kAll].reset_accumulated();
  st.num_device_alloc = st.num_device_free = st.num_ooms = 0;
}

void storage_resized(DeviceStorage& st, size_t nbytes) {
  const int64_t delta = static_cast<int64_t>(nbytes) - static_cast<int64_t>(st.nbytes);
  {
    std::lock_guard<std::mutex> lock(memory_mu());
    add_bytes(device_stats()[st.device], delta);
  }
  add_bytes_in_use(delta);
  st.nbytes = nbytes;
}

pjrt::BufferPtr upload(const void* data, DType dtype, std::span<const int64_t> dims, int device) {
  int64_t nbytes = itemsize(dtype);
  for (int64_t d : dims) nbytes *= d;
  metrics().bytes_to_device += nbytes;
  TraceScope trace("torchtpu::to_device", nbytes);
  return client().buffer_from_host(data, dtype, dims, device);
}

at::Tensor download(const pjrt::Buffer& buf, const at::Tensor& like) {
  at::Tensor host = at::empty(like.sizes(), like.options().device(c10::kCPU));
  TraceScope trace("torchtpu::to_host", static_cast<int64_t>(host.nbytes()));
  buf.to_host(host.data_ptr(), host.nbytes());
  metrics().bytes_to_host += static_cast<int64_t>(host.nbytes());
  return host;
}

pjrt::BufferPtr zeros_buffer(DType dtype, int64_t n, int device) {
  std::vector<unsigned char> zeros(static_cast<size_t>(n) * itemsize(dtype), 0);
  int64_t dims[1] = {n};
  return upload(zeros.data(), dtype, dims, device);
}

at::Tensor empty_on_device(c10::IntArrayRef sizes, c10::ScalarType dtype, int device) {
  // Allocated directly, not through at::empty's dispatch: one per op output.
  std::optional<c10::DeviceGuard> guard;
  if (device != current_device())
    guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  return at::detail::empty_generic(
      sizes, allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype, std::nullopt);
}

at::Tensor wrap_buffer(pjrt::BufferPtr buf, c10::IntArrayRef sizes, c10::ScalarType dtype,
                       int device) {
  at::Tensor t = empty_on_device(sizes, dtype, device);
  auto& st = device_storage(t.storage());
  st.dtype = buf->dtype();
  st.buffer = std::move(buf);
  return t;
}

DeviceStorage& device_storage(const c10::Storage& storage) {
  void* ctx = storage.data_ptr().get_context();
  TORCH_CHECK(ctx && storage.data_ptr().get_deleter() == &delete_storage,
              "[tpu] tensor storage was not allocated by the tpu allocator");
  return *static_cast<DeviceStorage*>(ctx);
}

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

}  // namespace torchtpu::aten
