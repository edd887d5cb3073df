// The compile cache every mode gets its executables through: an in-process
// tier (one compile per key, shared by concurrent requesters), a host disk
// tier (TORCHTPU_CACHE_DIR) and an optional shared root
// (TORCHTPU_SHARED_CACHE_DIR). Depends only on csrc/pjrt and the standard library.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/disk_store.h"
#include "cache/pack.h"
#include "pjrt/pjrt.h"
#include "pjrt/tuning.h"

namespace torchtpu::cache {

struct Config {
  std::string local_dir;   // empty: no disk tier
  std::string shared_dir;  // empty: no shared tier
  int64_t max_bytes = int64_t{2} << 30;
  double lock_timeout_s = 300.0;  // wait for another process's compile of the same key
  // Executables kept loaded by the memory tier (least recently used go first;
  // each loaded executable holds a few memory mappings, and a process has ~65k).
  int64_t memory_entries = 2048;
  std::vector<std::string> packs;  // read-only kernel packs, first match wins
  // TORCHTPU_CACHE_DIR (default ~/.cache/torchtpu, "off" disables),
  // TORCHTPU_CACHE_MAX_BYTES, TORCHTPU_SHARED_CACHE_DIR, TORCHTPU_CACHE_LOCK_TIMEOUT,
  // TORCHTPU_CACHE_MEMORY_ENTRIES, TORCHTPU_CACHE_PACKS (paths separated by ':').
  static Config from_env();
};

struct Stats {
  int64_t requests = 0, memory_hits = 0, disk_hits = 0, shared_hits = 0, pack_hits = 0;
  int64_t pack_entries = 0;  // usable entries of the packs (known once they are opened)
  int64_t pack_refused = 0;  // pack entries compiled for another runtime, never loaded
  int64_t misses = 0;        // compiles
  int64_t errors = 0;        // bad entries or failed cache I/O, ignored and recompiled
  int64_t evictions = 0;
  int64_t unloaded = 0;        // executables the memory tier dropped (over memory_entries)
  double compile_seconds = 0;  // spent compiling misses
  double saved_seconds = 0;    // original compile time of the hits
  double load_seconds = 0;     // spent reading and deserializing disk/shared hits
};

// Where a request's executable came from.
enum class Source { Memory, Pack, Disk, Shared, Compiled };

class CompileCache {
 public:
  using CompileFn =
      std::function<pjrt::ExecutablePtr(const std::string&, const pjrt::CompileOptions&)>;
  // `compile` defaults to client->compile (tests inject slow or failing ones).
  CompileCache(pjrt::ClientPtr client, Config config, CompileFn compile = nullptr);
  CompileCache(const CompileCache&) = delete;
  CompileCache& operator=(const CompileCache&) = delete;

  // The executable of `mlir_text`: from memory, disk, the shared root, or a
  // compile. Rethrows a failed compile to every requester (never cached).
  pjrt::ExecutablePtr get(const std::string& mlir_text, const pjrt::CompileOptions& options = {},
                          Source* source = nullptr);
  // The executable if some tier already holds it (waiting for a compile in
  // flight); null instead of compiling.
  pjrt::ExecutablePtr find(const std::string& mlir_text, const pjrt::CompileOptions& options = {},
                           Source* source = nullptr);
  Digest key(const std::string& mlir_text, const pjrt::CompileOptions& options) const;
  Stats stats() const;
  const Config& config() const { return config_; }
  const Digest& identity() const { return identity_; }
  // Entries and bytes of the local disk tier (zero when disabled).
  Usage disk_usage() const;
  const pjrt::Client* client() const { return client_.get(); }

 private:
  struct Loaded {
    pjrt::ExecutablePtr exe;
    StoredEntry entry;
  };
  struct Tier {
    std::optional<DiskStore> store;
    std::string name;
    std::atomic<bool> readable{true}, writable{true};  // cleared by degrade()
    std::once_flag warned;
  };
  struct PackRef {
    const PackFile* file;
    size_t index;
  };
  void open_packs();  // once, at the first lookup
  pjrt::ExecutablePtr load_pack(const Digest& key, const pjrt::CompileOptions& options);
  pjrt::ExecutablePtr produce(const Digest& key, const std::string& mlir,
                              const pjrt::CompileOptions& options, Source* source);
  pjrt::ExecutablePtr load_stored(const Digest& key, const pjrt::CompileOptions& options,
                                  Source* source);
  std::optional<Loaded> load(Tier& tier, const Digest& key, const pjrt::CompileOptions& options);
  pjrt::ExecutablePtr compile_and_store(const Digest& key, const std::string& mlir,
                                        const pjrt::CompileOptions& options);
  void store(Tier& tier, const Digest& key, const StoredEntry& entry);
  void degrade(Tier& tier, const std::string& why, bool reads_too);
  void add_seconds(std::atomic<int64_t>& counter, double seconds);
  // `build` with `options` less the tuning overrides the plugin lacks, learned
  // from its errors (pjrt::TuningOverrides). Keys keep the options asked for.
  pjrt::ExecutablePtr with_known_overrides(
      const pjrt::CompileOptions& options,
      const std::function<pjrt::ExecutablePtr(const pjrt::CompileOptions&)>& build);

  pjrt::ClientPtr client_;
  Config config_;
  CompileFn compile_;
  pjrt::TuningOverrides tuning_;
  Digest identity_;  // plugin file, versions and (on CPU) host CPU features
  Tier local_, shared_;
  std::once_flag packs_opened_;
  std::vector<std::shared_ptr<PackFile>> packs_;
  std::unordered_map<std::string, PackRef> pack_index_;  // filled once, then read-only
  std::atomic<int64_t> writes_{0}, approx_bytes_{0};     // local tier size estimate

  struct Resident {
    std::shared_future<pjrt::ExecutablePtr> exe;
    std::list<std::string>::iterator use;  // position in lru_
  };
  void trim_memory();  // under mu_
  // Makes `exe` the memory tier's entry of `mkey`, most recently used (under mu_).
  void remember(const std::string& mkey, std::shared_future<pjrt::ExecutablePtr> exe);

  std::mutex mu_;
  std::unordered_map<std::string, Resident> memory_;
  std::list<std::string> lru_;  // most recently used first

  std::atomic<int64_t> requests_{0}, memory_hits_{0}, disk_hits_{0}, shared_hits_{0}, misses_{0},
      errors_{0}, evictions_{0}, unloaded_{0}, pack_hits_{0}, pack_entries_{0}, pack_refused_{0};
  std::atomic<int64_t> compile_ns_{0}, saved_ns_{0}, load_ns_{0};
};

// Digest of what makes a serialized executable loadable: the plugin file
// (size and its first and last MiB), its attributes, the platform name and
// version, and on the CPU platform the host CPU's model and feature flags.
Digest runtime_identity(const pjrt::Client& client);

// The process-wide cache for `client`, configured from the environment on
// first use (a different client gets a fresh one).
CompileCache& process_cache(const pjrt::ClientPtr& client);
// Stats of the process-wide cache; all zero before its first use.
Stats process_stats();
// Its configuration, or the environment's before its first use.
Config process_config();

// Rewrites a program just before it compiles (never on a hit, so the key is
// always the text): a program that inlines another producer's functions goes
// to the plugin re-serialized for its StableHLO version. nullopt: as is.
using SourceTranslator = std::function<std::optional<std::string>(const std::string&)>;
void set_source_translator(SourceTranslator fn);

}  // namespace torchtpu::cache
