#include "aten/events.h"

#include <vector>

namespace torchtpu::aten {

namespace {

// Function-local statics: subscribers register during static initialization.
std::vector<EventHandler>& handlers(Event e) {
  static std::vector<EventHandler> lists[2];
  return lists[static_cast<int>(e)];
}
std::vector<StorageHandler>& storage_handlers() {
  static std::vector<StorageHandler> list;
  return list;
}
thread_local const char* t_reason = nullptr;

}  // namespace

void subscribe(Event e, EventHandler h) { handlers(e).push_back(h); }
void publish(Event e, const char* reason) {
  for (EventHandler h : handlers(e)) h(reason);
}
void subscribe_storage_freed(StorageHandler h) { storage_handlers().push_back(h); }
bool publish_storage_freed(DeviceStorage* st) {
  for (StorageHandler h : storage_handlers())
    if (h(st)) return true;
  return false;
}

SyncReason::SyncReason(const char* why) : prev_(t_reason) {
  if (!t_reason) t_reason = why;
}
SyncReason::~SyncReason() { t_reason = prev_; }
const char* SyncReason::current(const char* fallback) { return t_reason ? t_reason : fallback; }

}  // namespace torchtpu::aten
