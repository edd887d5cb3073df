#include "cache/compile_cache.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

namespace torchtpu::cache {

namespace {

using Clock = std::chrono::steady_clock;

std::mutex translator_mu;
SourceTranslator& translator() {
  static auto* t = new SourceTranslator();
  return *t;
}

std::optional<std::string> translate_source(const std::string& mlir) {
  SourceTranslator fn;
  {
    std::lock_guard<std::mutex> lock(translator_mu);
    fn = translator();
  }
  return fn ? fn(mlir) : std::nullopt;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

// "1073741824", "512M", "2G" (binary units); nullopt when malformed.
std::optional<int64_t> parse_bytes(const std::string& s) {
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || v < 0) return std::nullopt;
  std::string unit(end);
  int shift = unit.empty()                 ? 0
              : unit == "K" || unit == "k" ? 10
              : unit == "M" || unit == "m" ? 20
              : unit == "G" || unit == "g" ? 30
                                           : -1;
  if (shift < 0) return std::nullopt;
  return static_cast<int64_t>(v) << shift;
}

// Size and the first and last MiB of the plugin file: cheap, and different
// for every build that could produce incompatible executables.
std::string file_fingerprint(const std::string& path) {
  constexpr std::streamoff kChunk = 1 << 20;
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return "unreadable plugin file " + path;
  std::streamoff size = f.tellg();
  std::string head(static_cast<size_t>(std::min(size, kChunk)), '\0');
  std::string tail(head.size(), '\0');
  f.seekg(0);
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  f.seekg(size - static_cast<std::streamoff>(tail.size()));
  f.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  return to_hex(Sha256().u64(static_cast<uint64_t>(size)).field(head).field(tail).finish());
}

// XLA:CPU executables hold machine code for the host that compiled them.
std::string host_cpu_features() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, out;
  for (const char* field : {"model name", "flags", "Features", "CPU implementer", "CPU part"}) {
    f.clear();
    f.seekg(0);
    while (std::getline(f, line)) {
      if (line.rfind(field, 0) == 0) {
        out += line + "\n";
        break;
      }
    }
  }
  return out.empty() ? "unknown host cpu" : out;
}

}  // namespace

Config Config::from_env() {
  Config c;
  std::string home = env_or("HOME", "");
  std::string base = env_or("XDG_CACHE_HOME", home.empty() ? "" : home + "/.cache");
  c.local_dir = env_or("TORCHTPU_CACHE_DIR", base.empty() ? "off" : base + "/torchtpu");
  if (c.local_dir == "off") c.local_dir.clear();
  c.shared_dir = env_or("TORCHTPU_SHARED_CACHE_DIR", "");
  if (c.shared_dir == "off") c.shared_dir.clear();
  if (const char* v = std::getenv("TORCHTPU_CACHE_MAX_BYTES")) {
    if (auto b = parse_bytes(v)) {
      c.max_bytes = *b;
    } else {
      std::fprintf(stderr,
                   "[tpu cache] ignoring TORCHTPU_CACHE_MAX_BYTES='%s': expected a byte count "
                   "such as 2147483648 or 2G\n",
                   v);
    }
  }
  if (const char* v = std::getenv("TORCHTPU_CACHE_LOCK_TIMEOUT")) c.lock_timeout_s = std::atof(v);
  if (const char* v = std::getenv("TORCHTPU_CACHE_MEMORY_ENTRIES"))
    c.memory_entries = std::max<int64_t>(1, std::atoll(v));
  std::string packs = env_or("TORCHTPU_CACHE_PACKS", "");
  for (size_t at = 0; at <= packs.size();) {
    size_t end = std::min(packs.find(':', at), packs.size());
    if (end > at) c.packs.push_back(packs.substr(at, end - at));
    at = end + 1;
  }
  return c;
}

Digest runtime_identity(const pjrt::Client& client) {
  Sha256 h;
  h.field(file_fingerprint(client.plugin().path()));
  for (const auto& [name, value] : client.plugin().attributes()) h.field(name).field(value);
  h.u64(static_cast<uint64_t>(client.plugin().api_major()));
  h.u64(static_cast<uint64_t>(client.plugin().api_minor()));
  h.field(client.platform_name()).field(client.platform_version());
  if (client.platform_name() == "cpu") h.field(host_cpu_features());
  // XLA reads its flags from the environment when the plugin starts; they can
  // change the code it generates.
  const char* flags = std::getenv("XLA_FLAGS");
  h.field(flags ? flags : "");
  return h.finish();
}

pjrt::ExecutablePtr CompileCache::with_known_overrides(
    const pjrt::CompileOptions& options,
    const std::function<pjrt::ExecutablePtr(const pjrt::CompileOptions&)>& build) {
  for (;;) {
    pjrt::CompileOptions known = tuning_.known(options);
    try {
      return build(known);
    } catch (const std::exception& e) {
      if (!tuning_.learn(e.what(), known)) throw;
    }
  }
}

CompileCache::CompileCache(pjrt::ClientPtr client, Config config, CompileFn compile)
    : client_(std::move(client)), config_(std::move(config)), compile_(std::move(compile)) {
  if (!compile_) {
    compile_ = [c = client_.get()](const std::string& m, const pjrt::CompileOptions& o) {
      return c->compile(m, o);
    };
  }
  identity_ = runtime_identity(*client_);
  local_.name = "cache directory";
  shared_.name = "shared cache root";
  for (auto [tier, dir] :
       {std::pair{&local_, &config_.local_dir}, {&shared_, &config_.shared_dir}}) {
    if (dir->empty()) continue;
    tier->store.emplace(*dir);
    try {
      tier->store->ensure_root();
    } catch (const std::exception& e) {
      degrade(*tier, e.what(), /*reads_too=*/true);
    }
  }
}

Digest CompileCache::key(const std::string& mlir_text, const pjrt::CompileOptions& options) const {
  return Sha256()
      .field("torchtpu compile cache")
      .u64(kFormatVersion)
      .field(mlir_text)
      .field(pjrt::encode_compile_options(options))
      .update(identity_.data(), identity_.size())
      .finish();
}

pjrt::ExecutablePtr CompileCache::get(const std::string& mlir_text,
                                      const pjrt::CompileOptions& options, Source* source) {
  requests_++;
  Digest k = key(mlir_text, options);
  std::string mkey(k.begin(), k.end());
  std::promise<pjrt::ExecutablePtr> promise;
  std::shared_future<pjrt::ExecutablePtr> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = memory_.find(mkey);
    if (it != memory_.end()) {
      memory_hits_++;
      pending = it->second.exe;
      lru_.splice(lru_.begin(), lru_, it->second.use);
    } else {
      remember(mkey, promise.get_future().share());
    }
  }
  if (pending.valid()) {
    if (source) *source = Source::Memory;
    return pending.get();  // Waits for the one in-flight compile.
  }
  try {
    pjrt::ExecutablePtr exe = produce(k, mlir_text, options, source);
    promise.set_value(exe);
    return exe;
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = memory_.find(mkey); it != memory_.end()) {  // Not cached: recompiled.
        lru_.erase(it->second.use);
        memory_.erase(it);
      }
    }
    promise.set_exception(std::current_exception());
    throw;
  }
}

pjrt::ExecutablePtr CompileCache::find(const std::string& mlir_text,
                                       const pjrt::CompileOptions& options, Source* source) {
  Digest k = key(mlir_text, options);
  std::string mkey(k.begin(), k.end());
  std::shared_future<pjrt::ExecutablePtr> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = memory_.find(mkey); it != memory_.end()) {
      pending = it->second.exe;
      lru_.splice(lru_.begin(), lru_, it->second.use);
    }
  }
  if (pending.valid()) {
    requests_++;
    memory_hits_++;
    if (source) *source = Source::Memory;
    return pending.get();
  }
  pjrt::ExecutablePtr exe = load_stored(k, options, source);
  if (!exe) return nullptr;
  requests_++;
  std::promise<pjrt::ExecutablePtr> ready;
  ready.set_value(exe);
  std::lock_guard<std::mutex> lock(mu_);
  if (memory_.count(mkey) == 0) remember(mkey, ready.get_future().share());  // else a racer did
  return exe;
}

void CompileCache::remember(const std::string& mkey, std::shared_future<pjrt::ExecutablePtr> exe) {
  lru_.push_front(mkey);
  memory_.emplace(mkey, Resident{std::move(exe), lru_.begin()});
  trim_memory();
}

// Drops the least recently used ready executables over the limit; callers
// still holding one keep it alive, and a later request reloads it from disk.
void CompileCache::trim_memory() {
  auto it = lru_.end();
  while (static_cast<int64_t>(memory_.size()) > config_.memory_entries && it != lru_.begin()) {
    --it;
    auto m = memory_.find(*it);
    if (m->second.exe.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
    memory_.erase(m);
    it = lru_.erase(it);
    unloaded_++;
  }
}

// Indexes the packs' entries of this runtime; the others are refused one by
// one and counted, a damaged pack as a whole, each with one warning.
void CompileCache::open_packs() {
  for (const std::string& path : config_.packs) {
    std::shared_ptr<PackFile> pack;
    try {
      pack = PackFile::open(path);
    } catch (const std::exception& e) {
      errors_++;
      std::fprintf(stderr, "[tpu cache] refused %s; its programs are compiled instead.\n",
                   e.what());
      continue;
    }
    int64_t refused = 0;
    const auto& entries = pack->entries();
    for (size_t i = 0; i < entries.size(); ++i) {
      const EntryHeader& h = entries[i].header;
      if (h.identity != identity_) {
        refused++;
        continue;
      }
      if (pack_index_.emplace(std::string(h.key.begin(), h.key.end()), PackRef{pack.get(), i})
              .second)
        pack_entries_++;
    }
    pack_refused_ += refused;
    if (refused > 0) {
      std::fprintf(stderr,
                   "[tpu cache] kernel pack %s: refused %lld of %zu entries compiled for another "
                   "runtime (plugin, platform, host CPU or XLA_FLAGS differ); those programs "
                   "are compiled instead.\n",
                   path.c_str(), static_cast<long long>(refused), entries.size());
    }
    packs_.push_back(std::move(pack));
  }
}

pjrt::ExecutablePtr CompileCache::load_pack(const Digest& key,
                                            const pjrt::CompileOptions& options) {
  std::call_once(packs_opened_, [this] { open_packs(); });
  auto it = pack_index_.find(std::string(key.begin(), key.end()));
  if (it == pack_index_.end()) return nullptr;
  auto t0 = Clock::now();
  StoredEntry entry;
  if (auto why = it->second.file->read(it->second.index, &entry)) {
    errors_++;
    std::fprintf(stderr, "[tpu cache] skipping a damaged pack entry: %s\n", why->c_str());
    return nullptr;
  }
  pjrt::ExecutablePtr exe;
  try {
    exe = with_known_overrides(options, [&](const pjrt::CompileOptions& o) {
      return client_->deserialize(entry.payload, o);
    });
  } catch (const std::exception&) {
    errors_++;  // Checksum fine but the plugin rejects it: compiled instead.
    return nullptr;
  }
  pack_hits_++;
  add_seconds(load_ns_, seconds_since(t0));
  add_seconds(saved_ns_, entry.compile_seconds);
  return exe;
}

pjrt::ExecutablePtr CompileCache::load_stored(const Digest& key,
                                              const pjrt::CompileOptions& options, Source* source) {
  auto found = [&](Source s, pjrt::ExecutablePtr exe) {
    if (source) *source = s;
    return exe;
  };
  if (!config_.packs.empty()) {
    if (auto exe = load_pack(key, options)) return found(Source::Pack, std::move(exe));
  }
  if (auto hit = load(local_, key, options)) {
    disk_hits_++;
    return found(Source::Disk, std::move(hit->exe));
  }
  if (auto hit = load(shared_, key, options)) {
    shared_hits_++;
    store(local_, key, hit->entry);
    return found(Source::Shared, std::move(hit->exe));
  }
  return nullptr;
}

pjrt::ExecutablePtr CompileCache::produce(const Digest& key, const std::string& mlir,
                                          const pjrt::CompileOptions& options, Source* source) {
  if (auto exe = load_stored(key, options, source)) return exe;
  // One compile per key on this host: other processes wait here, then load.
  std::optional<KeyLock> lock = local_.store && local_.writable
                                    ? local_.store->lock_key(key, config_.lock_timeout_s)
                                    : std::nullopt;
  if (lock) {
    if (auto hit = load(local_, key, options)) {
      disk_hits_++;
      if (source) *source = Source::Disk;
      return hit->exe;
    }
  }
  if (source) *source = Source::Compiled;
  return compile_and_store(key, mlir, options);
}

std::optional<CompileCache::Loaded> CompileCache::load(Tier& tier, const Digest& key,
                                                       const pjrt::CompileOptions& options) {
  if (!tier.store || !tier.readable) return std::nullopt;
  auto t0 = Clock::now();
  ReadResult r = tier.store->read(key);
  if (r.status == ReadResult::kMiss) return std::nullopt;
  if (r.status == ReadResult::kUnreadable) {
    degrade(tier, r.error, /*reads_too=*/false);
    return std::nullopt;
  }
  if (r.status == ReadResult::kCorrupt) {
    errors_++;
    tier.store->remove(key);
    return std::nullopt;
  }
  Loaded out;
  try {
    out.exe = with_known_overrides(options, [&](const pjrt::CompileOptions& o) {
      return client_->deserialize(r.entry.payload, o);
    });
  } catch (const std::exception&) {
    // Checksum fine but the plugin rejects it: treat like any bad entry.
    errors_++;
    tier.store->remove(key);
    return std::nullopt;
  }
  add_seconds(load_ns_, seconds_since(t0));
  add_seconds(saved_ns_, r.entry.compile_seconds);
  out.entry = std::move(r.entry);
  return out;
}

pjrt::ExecutablePtr CompileCache::compile_and_store(const Digest& key, const std::string& mlir,
                                                    const pjrt::CompileOptions& options) {
  auto t0 = Clock::now();
  std::optional<std::string> translated = translate_source(mlir);
  pjrt::ExecutablePtr exe = with_known_overrides(options, [&](const pjrt::CompileOptions& o) {
    return compile_(translated ? *translated : mlir, o);
  });
  double dt = seconds_since(t0);
  misses_++;
  add_seconds(compile_ns_, dt);
  bool persist = (local_.store && local_.writable) || (shared_.store && shared_.writable);
  if (!persist) return exe;
  StoredEntry entry;
  entry.compile_seconds = dt;
  entry.identity = identity_;
  try {
    entry.payload = exe->serialize();
  } catch (const std::exception& e) {
    degrade(local_, std::string("cannot serialize executables: ") + e.what(), false);
    return exe;
  }
  store(local_, key, entry);
  store(shared_, key, entry);
  return exe;
}

void CompileCache::store(Tier& tier, const Digest& key, const StoredEntry& entry) {
  if (!tier.store || !tier.writable) return;
  try {
    tier.store->write(key, entry.payload, entry.compile_seconds, entry.identity);
  } catch (const std::exception& e) {
    degrade(tier, e.what(), /*reads_too=*/false);
    return;
  }
  if (&tier != &local_) return;  // The shared root is managed by its owners.
  // The size is rescanned now and then (other processes write too) and
  // whenever this process's estimate crosses the cap.
  int64_t n = writes_++;
  int64_t approx = approx_bytes_ += static_cast<int64_t>(entry.payload.size());
  if (n % 32 == 0) approx = approx_bytes_ = tier.store->usage().bytes;
  if (approx <= config_.max_bytes) return;
  evictions_ += tier.store->evict(config_.max_bytes);
  approx_bytes_ = tier.store->usage().bytes;
}

void CompileCache::degrade(Tier& tier, const std::string& why, bool reads_too) {
  errors_++;
  tier.writable = false;
  if (reads_too) tier.readable = false;
  std::call_once(tier.warned, [&] {
    std::fprintf(stderr,
                 "[tpu cache] %s %s is not usable (%s); compiling locally%s. Check the path and "
                 "its permissions, or unset the variable that points there.\n",
                 tier.name.c_str(), tier.store->root().c_str(), why.c_str(),
                 reads_too ? "" : " and no longer writing there");
  });
}

void CompileCache::add_seconds(std::atomic<int64_t>& counter, double seconds) {
  counter += static_cast<int64_t>(seconds * 1e9);
}

Stats CompileCache::stats() const {
  Stats s;
  s.requests = requests_;
  s.memory_hits = memory_hits_;
  s.disk_hits = disk_hits_;
  s.shared_hits = shared_hits_;
  s.pack_hits = pack_hits_;
  s.pack_entries = pack_entries_;
  s.pack_refused = pack_refused_;
  s.misses = misses_;
  s.errors = errors_;
  s.evictions = evictions_;
  s.unloaded = unloaded_;
  s.compile_seconds = static_cast<double>(compile_ns_) * 1e-9;
  s.saved_seconds = static_cast<double>(saved_ns_) * 1e-9;
  s.load_seconds = static_cast<double>(load_ns_) * 1e-9;
  return s;
}

Usage CompileCache::disk_usage() const {
  return local_.store && local_.readable ? local_.store->usage() : Usage{};
}

void set_source_translator(SourceTranslator fn) {
  std::lock_guard<std::mutex> lock(translator_mu);
  translator() = std::move(fn);
}

namespace {
std::mutex process_mu;
CompileCache* process_instance = nullptr;  // leaked: executables may outlive static dtors
}  // namespace

CompileCache& process_cache(const pjrt::ClientPtr& client) {
  std::lock_guard<std::mutex> lock(process_mu);
  if (process_instance == nullptr || process_instance->client() != client.get()) {
    process_instance = new CompileCache(client, Config::from_env());
  }
  return *process_instance;
}

Stats process_stats() {
  std::lock_guard<std::mutex> lock(process_mu);
  return process_instance ? process_instance->stats() : Stats{};
}

Config process_config() {
  std::lock_guard<std::mutex> lock(process_mu);
  return process_instance ? process_instance->config() : Config::from_env();
}

}  // namespace torchtpu::cache
