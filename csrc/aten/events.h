// What the runtime tells the layers above it without knowing them: Fused
// Eager subscribes, so nothing below it calls up into it.
#pragma once

namespace torchtpu::aten {

struct DeviceStorage;

// The events, each a list of subscribers called in subscription order.
enum class Event {
  ModeLeft,       // this thread left Fused Eager (reason: "mode_switch")
  SyncRequested,  // torch.tpu.synchronize() or torchtpu.flush() (reason given)
};

using EventHandler = void (*)(const char* reason);
// True: the handler keeps the storage and frees it later (free_storage).
using StorageHandler = bool (*)(DeviceStorage* st);
// Subscribe at static initialization; handlers live for the whole process.
void subscribe(Event e, EventHandler h);
void publish(Event e, const char* reason);
// A storage died (the allocator's free hook); called on every tensor free.
void subscribe_storage_freed(StorageHandler h);
// True when a handler kept the storage.
bool publish_storage_freed(DeviceStorage* st);

// Names the reason of the syncs inside its scope ("item", "cpu_fallback", ...);
// an enclosing scope's reason wins (nonzero's count is read through item()).
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

}  // namespace torchtpu::aten
