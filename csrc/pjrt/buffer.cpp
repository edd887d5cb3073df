// Device buffers: placeholders filled by a later launch, host reads, and
// destruction off the caller's thread (see pjrt.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pjrt/call.h"
#include "pjrt/pjrt.h"

namespace torchtpu::pjrt {

using namespace detail;

// ---------------------------------------------------------------------------
// Buffer

struct Buffer::Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
};

Buffer::Buffer(std::shared_ptr<Client> client, PJRT_Buffer* buf, DType dtype,
               std::vector<int64_t> dims)
    : client_(std::move(client)), buf_(buf), dtype_(dtype), dims_(std::move(dims)) {}

namespace {

std::atomic<int64_t> direct_reads{0};

// PJRT_Buffer_Destroy blocks until every execution reading the buffer has
// finished, which would make the host wait for the device whenever a value
// is replaced. Buffers are destroyed on this thread instead. A wake-up per
// freed buffer cost the freeing thread a futex call (2% of a small model's
// training step), so small buffers wait for the reaper's own rounds: every
// 1 ms while buffers keep coming, backing off while none come, and parked
// (no rounds at all) once none came for about 250 ms. A large buffer, a full
// batch, or a buffer that finds it parked wakes it at once.
class Reaper {
 public:
  Reaper() {
    std::thread([this] { run(); }).detach();
  }
  void push(std::shared_ptr<Client> client, PJRT_Buffer* buf, size_t nbytes) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.emplace_back(std::move(client), buf);
      prompt_ = prompt_ || nbytes >= kPromptBytes;
      wake = parked_ || prompt_ || queue_.size() >= kBatch;
    }
    // Without a waiter (the reaper destroying a batch) the signal is no system call.
    if (wake) cv_.notify_one();
  }

 private:
  void run() {
    std::vector<std::pair<std::shared_ptr<Client>, PJRT_Buffer*>> batch;
    auto wait = kMinWait;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (wait > kMaxWait) {
          parked_ = true;
          cv_.wait(lock, [this] { return !queue_.empty(); });
          parked_ = false;
          wait = kMinWait;
        }
        cv_.wait_for(lock, wait, [this] { return prompt_ || queue_.size() >= kBatch; });
        prompt_ = false;
        batch.swap(queue_);
      }
      wait = batch.empty() ? wait * 2 : kMinWait;
      for (auto& [client, buf] : batch) destroy_buffer(client->api(), buf);
      batch.clear();
    }
  }
  static constexpr size_t kBatch = 64;
  static constexpr size_t kPromptBytes = size_t{1} << 20;
  static constexpr std::chrono::milliseconds kMinWait{1}, kMaxWait{128};
  std::mutex mu_;
  std::condition_variable cv_;
  bool prompt_ = false, parked_ = false;
  std::vector<std::pair<std::shared_ptr<Client>, PJRT_Buffer*>> queue_;
};

Reaper& reaper() {
  static auto* r = new Reaper();  // leaked: buffers may die during exit
  return *r;
}

// `buf`'s ready event (the caller owns it: wrap it in an Event).
PJRT_Event* ready_event(const PJRT_Api* api, PJRT_Buffer* buf) {
  auto a = TT_ARGS(Buffer_ReadyEvent);
  a.buffer = buf;
  TT_CALL(api, Buffer_ReadyEvent, a);
  return a.event;
}

// Ready events of watched buffers that died before their producer finished, with
// their tickets.
struct Dropped {
  std::mutex mu;
  std::deque<std::pair<uint64_t, std::unique_ptr<Event>>> events;  // oldest first
};
Dropped& dropped() {
  static auto* d = new Dropped();  // leaked, as the reaper
  return *d;
}

void keep_producer(const PJRT_Api* api, PJRT_Buffer* buf, uint64_t ticket) noexcept {
  try {
    auto event = std::make_unique<Event>(api, ready_event(api, buf));
    if (event->is_ready()) return;
    Dropped& d = dropped();
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.events.size() >= 256)  // a loop that never synchronizes: keep the unfinished
      std::erase_if(d.events, [](const auto& e) { return e.second->is_ready(); });
    d.events.emplace_back(ticket, std::move(event));
  } catch (...) {
    // Without an event there is nothing to wait for; the value is gone anyway.
  }
}

void await_kept(const Event& e) {
  try {
    e.await("PJRT_Event_Await (a dropped buffer's producer)");
  } catch (const Error&) {
  }
}

}  // namespace

std::shared_ptr<Buffer> Buffer::placeholder(std::shared_ptr<Client> client, DType dtype,
                                            std::vector<int64_t> dims) {
  auto b = std::make_shared<Buffer>(std::move(client), nullptr, dtype, std::move(dims));
  b->pending_ = std::make_unique<Pending>();
  return b;
}

PJRT_Buffer* Buffer::wait_filled() const {
  if (!pending_) throw Error("Buffer: no PJRT buffer (already given away)");
  std::unique_lock<std::mutex> lock(pending_->mu);
  pending_->cv.wait(lock, [&] { return pending_->done; });
  if (PJRT_Buffer* b = buf_.load(std::memory_order_acquire)) return b;
  throw Error(pending_->error);
}

void Buffer::fill(Buffer& produced) {
  if (!pending_) throw Error("Buffer::fill: not a placeholder");
  if (produced.dtype_ != dtype_ || produced.dims_ != dims_)
    return fail("Buffer::fill: the program produced " + std::string(mlir_name(produced.dtype_)) +
                " of " + std::to_string(produced.numel()) + " elements where " +
                std::string(mlir_name(dtype_)) + " of " + std::to_string(numel()) +
                " were expected");
  std::lock_guard<std::mutex> lock(pending_->mu);
  if (pending_->done) throw Error("Buffer::fill: already filled");
  buf_.store(produced.buf_.exchange(nullptr), std::memory_order_release);
  pending_->done = true;
  pending_->cv.notify_all();
}

void Buffer::fail(const std::string& why) {
  if (!pending_) throw Error("Buffer::fail: not a placeholder");
  std::lock_guard<std::mutex> lock(pending_->mu);
  if (pending_->done) return;
  pending_->error = why;
  pending_->done = true;
  pending_->cv.notify_all();
}

bool Buffer::filled() const {
  if (buf_.load(std::memory_order_acquire)) return true;
  if (!pending_) return false;
  std::lock_guard<std::mutex> lock(pending_->mu);
  return pending_->done;
}

Buffer::~Buffer() {
  PJRT_Buffer* b = buf_.load(std::memory_order_acquire);
  if (b == nullptr) return;
  if (uint64_t t = ticket_.load(std::memory_order_relaxed)) keep_producer(client_->api(), b, t);
  reaper().push(std::move(client_), b, nbytes());
}

uint64_t Buffer::watch() const {
  static std::atomic<uint64_t> next{1};
  uint64_t t = ticket_.load(std::memory_order_relaxed);
  if (t != 0) return t;
  const uint64_t mine = next.fetch_add(1, std::memory_order_relaxed);
  return ticket_.compare_exchange_strong(t, mine, std::memory_order_relaxed) ? mine : t;
}

size_t await_dropped_producers() {
  std::deque<std::pair<uint64_t, std::unique_ptr<Event>>> events;
  {
    Dropped& d = dropped();
    std::lock_guard<std::mutex> lock(d.mu);
    events.swap(d.events);
  }
  for (const auto& [ticket, e] : events) await_kept(*e);
  return events.size();
}

bool await_dropped_producer(uint64_t ticket) {
  std::unique_ptr<Event> event;
  {
    Dropped& d = dropped();
    std::lock_guard<std::mutex> lock(d.mu);
    auto it = std::find_if(d.events.begin(), d.events.end(),
                           [&](const auto& e) { return e.first == ticket; });
    if (it == d.events.end()) return false;
    event = std::move(it->second);
    d.events.erase(it);
  }
  await_kept(*event);
  return true;
}

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

void Buffer::await_ready() const {
  const PJRT_Api* api = client_->api();
  Event(api, ready_event(api, raw())).await("PJRT_Event_Await (buffer ready)");
}

bool Buffer::is_ready() const {
  if (!filled()) return false;
  const PJRT_Api* api = client_->api();
  return Event(api, ready_event(api, raw())).is_ready();
}

void Buffer::to_host(void* dst, size_t dst_bytes) const {
  if (dst_bytes != nbytes()) {
    throw Error("Buffer::to_host: destination has " + std::to_string(dst_bytes) +
                " bytes but the buffer holds " + std::to_string(nbytes()));
  }
  if (dst_bytes == 0) {
    await_ready();  // Still report a failed producer; a null dst would mean "query size".
    return;
  }
  const PJRT_Api* api = client_->api();
  // XLA:CPU's buffers are host memory: a small read copies them in place once
  // ready, where ToHostBuffer hands the copy to another thread (about 15 us of
  // waking it for a scalar). Only rank <= 1: no layout to apply.
  if (dst_bytes <= kDirectReadBytes && dims_.size() <= 1 && client_->platform_name() == "cpu") {
    if (auto* unsafe_pointer = TT_FN(api, Buffer_UnsafePointer)) {
      await_ready();
      auto p = TT_ARGS(Buffer_UnsafePointer);
      p.buffer = raw();
      call_checked(api, unsafe_pointer, &p, "PJRT_Buffer_UnsafePointer");
      std::memcpy(dst, reinterpret_cast<const void*>(p.buffer_pointer), dst_bytes);
      direct_reads.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  auto a = TT_ARGS(Buffer_ToHostBuffer);
  a.src = raw();
  a.dst = dst;
  a.dst_size = dst_bytes;
  TT_CALL(api, Buffer_ToHostBuffer, a);
  Event(api, a.event).await("PJRT_Event_Await (PJRT_Buffer_ToHostBuffer)");
}

int64_t Buffer::direct_host_reads() { return direct_reads.load(std::memory_order_relaxed); }

std::shared_ptr<Buffer> Buffer::copy_to_device(int device) const {
  const PJRT_Api* api = client_->api();
  auto a = TT_ARGS(Buffer_CopyToDevice);
  a.buffer = raw();
  a.dst_device = client_->device(device);
  TT_CALL(api, Buffer_CopyToDevice, a);
  try {
    return std::make_shared<Buffer>(client_, a.dst_buffer, dtype_, dims_);
  } catch (...) {
    destroy_buffer(api, a.dst_buffer);
    throw;
  }
}

}  // namespace torchtpu::pjrt
