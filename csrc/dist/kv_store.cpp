#include "dist/kv_store.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

namespace torchtpu::dist {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

class C10dKvStore final : public pjrt::KeyValueStore {
 public:
  C10dKvStore(c10::intrusive_ptr<c10d::Store> store, std::string where)
      : store_(std::move(store)), where_(std::move(where)) {}

  void put(std::string_view key, std::string_view value) override {
    store_->set(std::string(key), std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::string get(std::string_view key, std::chrono::milliseconds timeout) override {
    std::string k(key);
    try {
      store_->wait({k}, timeout);
    } catch (const c10::DistStoreError& e) {
      throw pjrt::KvTimeout("timed out after " + std::to_string(timeout.count()) +
                            " ms waiting for it in " + where_ +
                            "; another rank did not publish it (did every rank start and "
                            "reach the first tpu operation?): " +
                            e.what_without_backtrace());
    }
    std::vector<uint8_t> v = store_->get(k);
    return std::string(v.begin(), v.end());
  }

  std::optional<std::string> try_get(std::string_view key) override {
    std::string k(key);
    if (!store_->check({k})) return std::nullopt;
    std::vector<uint8_t> v = store_->get(k);
    return std::string(v.begin(), v.end());
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string where_;
};

std::optional<aten::ClientKv> provider(const std::string& platform) {
  return torchrun_client_kv(platform);
}

// Installed when the module loads: aten's make_client asks through this seam
// (aten cannot include dist).
[[maybe_unused]] const bool kRegistered = (aten::set_client_kv_provider(&provider), true);

}  // namespace

std::optional<aten::ClientKv> torchrun_client_kv(const std::string& platform) {
  std::string force = env("TORCHTPU_KV_STORE");
  const bool forced = force == "1";
  if (force == "0" || (!forced && platform != "cuda")) return std::nullopt;
  std::string rank = env("RANK"), world = env("WORLD_SIZE"), addr = env("MASTER_ADDR"),
              port = env("MASTER_PORT");
  if (rank.empty() || world.empty() || addr.empty() || port.empty()) {
    TORCH_CHECK(!forced,
                "[tpu] TORCHTPU_KV_STORE=1 needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT "
                "(run under torchrun), got RANK='",
                rank, "' WORLD_SIZE='", world, "' MASTER_ADDR='", addr, "' MASTER_PORT='", port,
                "'");
    return std::nullopt;
  }
  const int64_t node_id = std::atoll(rank.c_str()), num_nodes = std::atoll(world.c_str());
  if (num_nodes <= 1 && !forced) return std::nullopt;
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(std::atoi(port.c_str()));
  opts.isServer = false;
  opts.waitWorkers = false;
  std::string timeout_s = env("TORCHTPU_KV_TIMEOUT_S");
  opts.timeout = std::chrono::seconds(timeout_s.empty() ? 300 : std::atoll(timeout_s.c_str()));
  // A restarted job must not read the previous attempt's keys.
  std::string restart = env("TORCHELASTIC_RESTART_COUNT");
  std::string prefix = "torchtpu/pjrt/" + (restart.empty() ? std::string("0") : restart);
  std::string where = "c10d TCPStore " + addr + ":" + port + " prefix " + prefix + "/";
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::PrefixStore>(prefix,
                                                   c10::make_intrusive<c10d::TCPStore>(addr, opts));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "[tpu] cannot connect to torchrun's store at ", addr, ":", port,
                " for the PJRT key-value store: ", e.what());
  }
  aten::ClientKv kv;
  kv.store = std::make_shared<C10dKvStore>(std::move(store), where);
  kv.node_id = node_id;
  kv.num_nodes = num_nodes;
  kv.where = where;
  return kv;
}

}  // namespace torchtpu::dist
