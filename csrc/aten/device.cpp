// PrivateUse1 integration points: device guard, hooks, generator.
#include <ATen/EmptyTensor.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "aten/copy.h"
#include "aten/generator.h"
#include "aten/launch.h"
#include "aten/runtime.h"

namespace torchtpu::aten {

namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// Streams are ordering ids only: a PJRT client runs one device queue, so
// record/block reduce to host-side synchronization.
struct TpuEvent {
  std::chrono::steady_clock::time_point when;
};

struct TpuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kTpu; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override {
    return {kTpu, static_cast<c10::DeviceIndex>(current_device())};
  }
  void setDevice(c10::Device d) const override {
    if (d.index() >= 0) set_current_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      setDevice(d);
    } catch (...) {
    }
  }
  c10::Stream getStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::DEFAULT, d.index() < 0 ? getDevice() : d);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return getStream(d); }
  c10::Stream getNewStream(c10::Device d, int) const override {
    static std::atomic<int64_t> next{1};
    return c10::Stream(c10::Stream::UNSAFE, d.index() < 0 ? getDevice() : d, next++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override { return getStream(s.device()); }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void record(void** event, const c10::Stream&, const c10::DeviceIndex,
              const c10::EventFlag) const override {
    if (!*event) *event = new TpuEvent();
    static_cast<TpuEvent*>(*event)->when = std::chrono::steady_clock::now();
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    synchronize();
    return true;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<TpuEvent*>(event);
  }
  bool queryStream(const c10::Stream&) const override {
    synchronize();
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override { synchronize(); }
  void synchronizeEvent(void*) const override { synchronize(); }
  void synchronizeDevice(const c10::DeviceIndex) const override { synchronize(); }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    TORCH_CHECK(a && b, "[tpu] elapsed_time needs two recorded events");
    auto d = static_cast<TpuEvent*>(b)->when - static_cast<TpuEvent*>(a)->when;
    return std::chrono::duration<double, std::milli>(d).count();
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TpuGuardImpl)

// Philox counter-based generator: state is [seed u64 | offset u64].
struct TpuGenerator final : public c10::GeneratorImpl {
  explicit TpuGenerator(int device)
      : c10::GeneratorImpl(c10::Device(kTpu, static_cast<c10::DeviceIndex>(device)),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    auto s = c10::detail::getNonDeterministicRandom(true);
    set_current_seed(s);
    return s;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                "[tpu] RNG state must be a uint8 tensor of 16 bytes [seed | offset]");
    const auto* p = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    at::Tensor t = at::detail::empty_cpu({16}, c10::ScalarType::Byte, std::nullopt, std::nullopt,
                                         std::nullopt, std::nullopt);
    auto* p = static_cast<uint8_t*>(t.data_ptr());
    std::memcpy(p, &seed_, 8);
    std::memcpy(p + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  TpuGenerator* clone_impl() const override {
    auto* g = new TpuGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

std::mutex gen_mu;
std::vector<at::Generator>& default_generators() {
  static auto* g = new std::vector<at::Generator>();
  return *g;
}

// Pinned host memory: page-aligned host allocations, registered with the
// plugin for direct transfers where it supports that (GPU plugins page-lock
// them), and tracked so that is_pinned() is true for them (DDP's reducer
// asserts it).
class PinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    constexpr size_t kPage = 4096;
    size_t bytes = (std::max<size_t>(n, 1) + kPage - 1) / kPage * kPage;
    void* p = nullptr;
    TORCH_CHECK_WITH(OutOfMemoryError, posix_memalign(&p, kPage, bytes) == 0,
                     "[tpu] pin_memory: cannot allocate ", bytes, " bytes of host memory");
    bool mapped = client().dma_map(p, bytes);
    {
      std::lock_guard<std::mutex> lock(mu());
      blocks()[reinterpret_cast<uintptr_t>(p)] = {bytes, mapped};
    }
    return {p, p, &release, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  static bool holds(const void* ptr) {
    auto at = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mu());
    auto it = blocks().upper_bound(at);
    if (it == blocks().begin()) return false;
    --it;
    return at < it->first + it->second.bytes;
  }

 private:
  struct Block {
    size_t bytes;
    bool mapped;
  };
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::map<uintptr_t, Block>& blocks() {
    static auto* b = new std::map<uintptr_t, Block>();  // outlives exit-time frees
    return *b;
  }
  static void release(void* p) {
    bool mapped = false;
    {
      std::lock_guard<std::mutex> lock(mu());
      auto it = blocks().find(reinterpret_cast<uintptr_t>(p));
      if (it != blocks().end()) {
        mapped = it->second.mapped;
        blocks().erase(it);
      }
    }
    if (mapped && runtime_started()) client().dma_unmap(p);
    std::free(p);
  }
};

PinnedAllocator& pinned_allocator() {
  static PinnedAllocator a;
  return a;
}

struct TpuHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    return default_generator(d < 0 ? current_device() : d);
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return new_generator(d < 0 ? current_device() : d);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    return {kTpu, static_cast<c10::DeviceIndex>(static_cast<DeviceStorage*>(data)->device)};
  }
  bool isPinnedPtr(const void* p) const override { return PinnedAllocator::holds(p); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator(); }
  bool hasPrimaryContext(c10::DeviceIndex d) const override { return d >= 0 && d < device_count(); }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }
  void setCurrentDevice(c10::DeviceIndex d) const override { set_current_device(d); }
  c10::DeviceIndex getCurrentDevice() const override {
    return static_cast<c10::DeviceIndex>(current_device());
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    auto old = getCurrentDevice();
    if (d >= 0) set_current_device(d);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage(storage, newsize);
  }
};

struct HooksRegistrar {
  HooksRegistrar() { at::RegisterPrivateUse1HooksInterface(new TpuHooks()); }
} hooks_registrar;

}  // namespace

at::Generator new_generator(int device) {
  check_device(device);
  return at::make_generator<TpuGenerator>(device);
}

const at::Generator& default_generator(int device) {
  std::lock_guard<std::mutex> lock(gen_mu);
  auto& gens = default_generators();
  if (gens.empty()) {
    int n = device_count();
    for (int i = 0; i < n; ++i) gens.push_back(at::make_generator<TpuGenerator>(i));
  }
  TORCH_CHECK_INDEX(device >= 0 && device < static_cast<int>(gens.size()), "[tpu] device index ",
                    device, " is out of range (", gens.size(), " devices)");
  return gens[device];
}

void philox_take(const std::optional<at::Generator>& gen, int device, int64_t numel,
                 uint64_t state[2]) {
  at::Generator g = gen && gen->defined() ? *gen : default_generator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  auto* impl = static_cast<TpuGenerator*>(g.unsafeGetGeneratorImpl());
  state[0] = impl->seed_;
  state[1] = impl->offset_;
  // Offsets advance in multiples of 4 (one Philox block), as DTensor expects.
  impl->offset_ += static_cast<uint64_t>((numel + 3) / 4 * 4);
}

}  // namespace torchtpu::aten
