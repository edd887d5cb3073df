// The key-value callbacks handed to PJRT_Client_Create, driven as a plugin
// drives them, against an in-memory store.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "pjrt/pjrt.h"

namespace torchtpu::pjrt {
namespace {

constexpr int kDeadlineExceeded = 4;  // PJRT_Error_Code values
constexpr int kUnavailable = 14;

class MemoryStore : public KeyValueStore {
 public:
  void put(std::string_view key, std::string_view value) override {
    if (key == "explode") throw std::runtime_error("connection reset by peer");
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[std::string(key)] = std::string(value);
    }
    cv_.notify_all();
  }
  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    std::string k(key);
    if (!cv_.wait_for(lock, timeout, [&] { return values_.count(k) > 0; })) {
      throw KvTimeout("timed out after " + std::to_string(timeout.count()) + " ms");
    }
    return values_[k];
  }
  std::optional<std::string> try_get(std::string_view key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(std::string(key));
    if (it == values_.end()) return std::nullopt;
    return it->second;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

TEST(KvCallbacks, PutThenGetReturnsTheBytes) {
  MemoryStore store;
  std::string value("topo\0logy", 9);  // Binary values keep embedded NULs.
  kv_callback_put(store, "node:0", value);
  EXPECT_EQ(kv_callback_get(store, "node:0", 1000), value);
  EXPECT_EQ(kv_callback_try_get(store, "node:0"), value);
}

TEST(KvCallbacks, GetBlocksUntilAnotherThreadPuts) {
  MemoryStore store;
  auto start = std::chrono::steady_clock::now();
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kv_callback_put(store, "late", "here");
  });
  EXPECT_EQ(kv_callback_get(store, "late", 10000), "here");
  writer.join();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(90));
}

TEST(KvCallbacks, TimeoutIsDeadlineExceededNamingTheKey) {
  MemoryStore store;
  try {
    kv_callback_get(store, "never", 50);
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), kDeadlineExceeded);
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("timed out after 50 ms"), std::string::npos) << e.what();
  }
}

TEST(KvCallbacks, TryGetOfMissingKeyIsNotFoundNotAnError) {
  MemoryStore store;
  EXPECT_EQ(kv_callback_try_get(store, "absent"), std::nullopt);
}

TEST(KvCallbacks, StoreExceptionBecomesUnavailableWithItsMessage) {
  MemoryStore store;
  try {
    kv_callback_put(store, "explode", "x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), kUnavailable);
    EXPECT_NE(std::string(e.what()).find("connection reset by peer"), std::string::npos);
  }
}

}  // namespace
}  // namespace torchtpu::pjrt
