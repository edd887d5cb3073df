// Tests of the compile cache (memory, disk and shared tiers) on the stock CPU plugin.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cache/compile_cache.h"
#include "cache/disk_store.h"
#include "cache/sha256.h"
#include "cache_fixtures.h"

namespace torchtpu::cache {
namespace {

namespace fs = std::filesystem;
using namespace fixtures;
using pjrt::ClientPtr;
using pjrt::ExecutablePtr;

// Runs add_program(2) and checks {1,2} + {1,2}.
void expect_adds(pjrt::Executable& exe) {
  float a[2] = {1, 2};
  auto buf = cpu_client()->buffer_from_host(a, DType::F32, std::vector<int64_t>{2}, 0);
  pjrt::Buffer* args[] = {buf.get(), buf.get()};
  float out[2] = {0, 0};
  exe.execute(args, 0)[0]->to_host(out, sizeof(out));
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 4.0f);
}

// A fresh directory under /tmp, removed with the test.
Config local_config(const TempDir& dir) {
  Config c;
  c.local_dir = dir.str();
  c.lock_timeout_s = 5;
  return c;
}

void set_mtime(const fs::path& p, int seconds_ago) {
  fs::last_write_time(p, fs::file_time_type::clock::now() - std::chrono::seconds(seconds_ago));
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(to_hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  Sha256 h;  // One million 'a', fed in uneven pieces.
  std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    size_t take = std::min(left, chunk.size());
    h.update(chunk.data(), take);
    left -= take;
  }
  EXPECT_EQ(to_hex(h.finish()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  Digest d;
  EXPECT_TRUE(from_hex(to_hex(sha256("x")), &d));
  EXPECT_EQ(d, sha256("x"));
  EXPECT_FALSE(from_hex("xyz", &d));
}

TEST(CompileCacheKey, DependsOnProgramOptionsAndRuntime) {
  CompileCache cache(cpu_client(), Config{});
  pjrt::CompileOptions two;
  two.num_replicas = 2;
  EXPECT_EQ(cache.key(add_program(2), {}), cache.key(add_program(2), {}));
  EXPECT_NE(cache.key(add_program(2), {}), cache.key(add_program(3), {}));
  EXPECT_NE(cache.key(add_program(2), {}), cache.key(add_program(2), two));
  EXPECT_EQ(runtime_identity(*cpu_client()), runtime_identity(*cpu_client()));
}

TEST(CompileCacheMemory, ConcurrentRequestersShareOneCompile) {
  std::atomic<int> compiles{0};
  auto slow = [&](const std::string& m, const pjrt::CompileOptions& o) {
    compiles++;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return cpu_client()->compile(m, o);
  };
  CompileCache cache(cpu_client(), Config{}, slow);
  std::vector<ExecutablePtr> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] { got[i] = cache.get(add_program(2)); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(compiles.load(), 1);
  for (auto& e : got) EXPECT_EQ(e, got[0]);
  Stats s = cache.stats();
  EXPECT_EQ(s.requests, 8);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.memory_hits, 7);
  EXPECT_GT(s.compile_seconds, 0.09);
  expect_adds(*got[0]);
}

TEST(CompileCacheMemory, KeepsAtMostTheConfiguredExecutablesLoaded) {
  Config c;
  c.memory_entries = 2;
  CompileCache cache(cpu_client(), c);
  std::weak_ptr<pjrt::Executable> first = cache.get(add_program(2));
  cache.get(add_program(3));
  EXPECT_FALSE(first.expired());
  cache.get(add_program(2));  // used again: now the most recent
  cache.get(add_program(4));  // drops 3, the least recently used
  EXPECT_FALSE(first.expired());
  cache.get(add_program(5));
  EXPECT_TRUE(first.expired());  // nothing else held it: released
  Stats s = cache.stats();
  EXPECT_EQ(s.unloaded, 2);
  EXPECT_EQ(s.misses, 4);
  expect_adds(*cache.get(add_program(2)));  // compiled again on request
  EXPECT_EQ(cache.stats().misses, 5);
}

TEST(CompileCacheMemory, FailedCompileReachesEveryWaiterAndIsNotCached) {
  std::atomic<int> compiles{0};
  auto failing = [&](const std::string& m, const pjrt::CompileOptions& o) {
    compiles++;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return cpu_client()->compile(m, o);  // The plugin rejects the program.
  };
  CompileCache cache(cpu_client(), Config{}, failing);
  const std::string bad = "module { this is not stablehlo }";
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      try {
        cache.get(bad);
      } catch (const pjrt::Error&) {
        errors++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 4);
  EXPECT_EQ(compiles.load(), 1);
  EXPECT_THROW(cache.get(bad), pjrt::Error);
  EXPECT_EQ(compiles.load(), 2);  // Retried, not served from memory.
}

TEST(CompileCacheDisk, RoundTripAcrossInstances) {
  TempDir dir;
  {
    CompileCache writer(cpu_client(), local_config(dir));
    expect_adds(*writer.get(add_program(2)));
    EXPECT_EQ(writer.stats().misses, 1);
    EXPECT_EQ(writer.disk_usage().entries, 1);
  }
  CompileCache reader(cpu_client(), local_config(dir));
  expect_adds(*reader.get(add_program(2)));
  Stats s = reader.stats();
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.disk_hits, 1);
  EXPECT_EQ(s.errors, 0);
  EXPECT_GT(s.saved_seconds, 0.0);
}

// A tuning override the plugin lacks: the build and a later process's load go
// on without it, under the key of the options asked for.
TEST(CompileCacheDisk, OverridesThePluginLacksAreLeftOut) {
  TempDir dir;
  const pjrt::CompileOptions asked{.overrides = {{"no_such_xla_option", true}}};
  {
    CompileCache writer(cpu_client(), local_config(dir));
    expect_adds(*writer.get(add_program(2), asked));
    EXPECT_EQ(writer.stats().misses, 1);
    EXPECT_EQ(writer.disk_usage().entries, 1);
  }
  CompileCache reader(cpu_client(), local_config(dir));
  expect_adds(*reader.get(add_program(2), asked));
  Stats s = reader.stats();
  EXPECT_EQ(s.disk_hits, 1);
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.errors, 0);
}

// Writes add_program(2)'s entry, damages it with `corrupt`, and checks that a
// new cache ignores it, counts an error, recompiles and repairs the entry.
template <class Fn>
void expect_recompiled_after(Fn corrupt) {
  TempDir dir;
  CompileCache writer(cpu_client(), local_config(dir));
  writer.get(add_program(2));
  fs::path entry = DiskStore(dir.path()).entry_path(writer.key(add_program(2), {}));
  ASSERT_TRUE(fs::exists(entry));
  corrupt(entry, writer);

  CompileCache reader(cpu_client(), local_config(dir));
  expect_adds(*reader.get(add_program(2)));
  Stats s = reader.stats();
  EXPECT_EQ(s.errors, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.disk_hits, 0);
  CompileCache again(cpu_client(), local_config(dir));
  again.get(add_program(2));
  EXPECT_EQ(again.stats().disk_hits, 1) << "the recompiled entry was not written back";
}

TEST(CompileCacheDisk, TruncatedEntryIsRecompiled) {
  expect_recompiled_after(
      [](const fs::path& p, CompileCache&) { fs::resize_file(p, fs::file_size(p) / 2); });
}

TEST(CompileCacheDisk, TruncatedHeaderIsRecompiled) {
  expect_recompiled_after([](const fs::path& p, CompileCache&) { fs::resize_file(p, 10); });
}

TEST(CompileCacheDisk, BitFlipIsRecompiled) {
  expect_recompiled_after([](const fs::path& p, CompileCache&) {
    std::string bytes = read_file(p);
    bytes[bytes.size() / 2] ^= 0x10;
    write_file(p, bytes);
  });
}

TEST(CompileCacheDisk, ForeignEntryIsRecompiled) {
  // Another program's (valid) entry under this key's name, as if from another plugin.
  expect_recompiled_after([](const fs::path& p, CompileCache& cache) {
    cache.get(add_program(3));
    fs::path other = DiskStore(p.parent_path()).entry_path(cache.key(add_program(3), {}));
    fs::copy_file(other, p, fs::copy_options::overwrite_existing);
  });
}

TEST(CompileCacheDisk, UndeserializablePayloadIsRecompiled) {
  expect_recompiled_after([](const fs::path& p, CompileCache& cache) {
    fs::remove(p);
    DiskStore(p.parent_path()).write(cache.key(add_program(2), {}), "not an executable", 1.0);
  });
}

TEST(CompileCacheDisk, KilledWriterLeavesNothingThatLoads) {
  TempDir dir;
  DiskStore store(dir.path());
  Digest key = sha256("k");
  std::string full = DiskStore::encode(key, "payload", 1.0);
  // A writer killed before its rename leaves only a temp file...
  fs::path tmp = dir.path() / ("." + to_hex(key) + ".123.0.tmp");
  write_file(tmp, full.substr(0, full.size() / 2));
  EXPECT_EQ(store.read(key).status, ReadResult::kMiss);
  EXPECT_EQ(store.usage().entries, 0);
  // ...and without atomic publishing a partial entry would be caught by its header.
  write_file(store.entry_path(key), full.substr(0, full.size() - 1));
  EXPECT_EQ(store.read(key).status, ReadResult::kCorrupt);
  // Stale temp files are swept by eviction; other files in the directory are not.
  fs::path unrelated = dir.path() / "notes.tmp";
  write_file(unrelated, "keep");
  set_mtime(tmp, 2 * 3600);
  set_mtime(unrelated, 2 * 3600);
  store.evict(int64_t{1} << 40);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_TRUE(fs::exists(unrelated));
}

TEST(DiskStoreEviction, StaysUnderTheCap) {
  TempDir dir;
  DiskStore store(dir.path());
  std::string payload(1000, 'x');
  for (int i = 0; i < 5; ++i) store.write(sha256(std::to_string(i)), payload, 0.1);
  int64_t one = store.usage().bytes / 5;
  EXPECT_EQ(store.evict(2 * one + one / 2), 3);
  Usage u = store.usage();
  EXPECT_EQ(u.entries, 2);
  EXPECT_LE(u.bytes, 2 * one + one / 2);
}

TEST(DiskStoreEviction, RemovesLeastRecentlyUsedFirst) {
  TempDir dir;
  DiskStore store(dir.path());
  Digest a = sha256("a"), b = sha256("b"), c = sha256("c");
  for (const Digest& k : {a, b, c}) store.write(k, std::string(1000, 'x'), 0.1);
  set_mtime(store.entry_path(a), 300);
  set_mtime(store.entry_path(b), 200);
  set_mtime(store.entry_path(c), 100);
  EXPECT_EQ(store.read(a).status, ReadResult::kHit);  // a becomes the most recent
  int64_t one = store.usage().bytes / 3;
  EXPECT_EQ(store.evict(2 * one), 1);
  EXPECT_TRUE(fs::exists(store.entry_path(a)));
  EXPECT_FALSE(fs::exists(store.entry_path(b)));
  EXPECT_TRUE(fs::exists(store.entry_path(c)));
}

TEST(DiskStoreEviction, NeverRemovesAnEntryBeingRead) {
  TempDir dir;
  DiskStore store(dir.path());
  Digest a = sha256("a"), b = sha256("b");
  store.write(a, "aaaa", 0.1);
  store.write(b, "bbbb", 0.1);
  int reader = ::open(store.entry_path(a).c_str(), O_RDONLY);  // as DiskStore::read does
  ASSERT_GE(reader, 0);
  ASSERT_EQ(::flock(reader, LOCK_SH), 0);
  EXPECT_EQ(store.evict(0), 1);
  EXPECT_TRUE(fs::exists(store.entry_path(a)));
  EXPECT_FALSE(fs::exists(store.entry_path(b)));
  ::close(reader);
  EXPECT_EQ(store.clear(), 1);
  EXPECT_EQ(store.usage().entries, 0);
}

TEST(CompileCacheDisk, EvictsAfterWritesOverTheCap) {
  TempDir dir;
  Config c = local_config(dir);
  c.max_bytes = 1;  // every entry is over the cap: only the newest may stay
  CompileCache cache(cpu_client(), c);
  for (int n = 1; n <= 3; ++n) cache.get(add_program(n));
  EXPECT_EQ(cache.stats().misses, 3);
  EXPECT_GE(cache.stats().evictions, 2);
  EXPECT_LE(cache.disk_usage().entries, 1);
}

TEST(DiskStoreLock, OneHolderPerKey) {
  TempDir dir;
  DiskStore store(dir.path());
  Digest k = sha256("k");
  {
    auto first = store.lock_key(k, 1.0);
    ASSERT_TRUE(first.has_value());
    EXPECT_FALSE(store.lock_key(k, 0.05).has_value());  // times out
    EXPECT_TRUE(store.lock_key(sha256("other"), 0.05).has_value());
  }
  EXPECT_TRUE(store.lock_key(k, 0.05).has_value());  // released
}

TEST(CompileCacheShared, ReadThroughAndWriteBack) {
  TempDir shared, local1, local2;
  Config c1 = local_config(local1);
  c1.shared_dir = shared.str();
  CompileCache host1(cpu_client(), c1);
  host1.get(add_program(2));
  EXPECT_EQ(DiskStore(shared.path()).usage().entries, 1);

  Config c2 = local_config(local2);
  c2.shared_dir = shared.str();
  CompileCache host2(cpu_client(), c2);
  expect_adds(*host2.get(add_program(2)));
  EXPECT_EQ(host2.stats().shared_hits, 1);
  EXPECT_EQ(host2.stats().misses, 0);
  EXPECT_EQ(host2.disk_usage().entries, 1);  // copied into the local tier
}

// A shared root this process cannot write: a 0555 directory, or /proc when
// running as root (which ignores permission bits).
fs::path read_only_root(const TempDir& dir) {
  fs::path ro = dir.path() / "ro";
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  std::ofstream probe(ro / "probe");
  return probe ? fs::path("/proc") : ro;
}

TEST(CompileCacheShared, ReadOnlyRootDegradesWithOneWarning) {
  TempDir dir, local;
  Config c = local_config(local);
  c.shared_dir = read_only_root(dir).string();
  testing::internal::CaptureStderr();
  CompileCache cache(cpu_client(), c);
  for (int n = 1; n <= 3; ++n) cache.get(add_program(n));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cache.stats().misses, 3);
  EXPECT_EQ(cache.disk_usage().entries, 3);
  size_t first = err.find("[tpu cache]");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("[tpu cache]", first + 1), std::string::npos) << err;
  EXPECT_NE(err.find(c.shared_dir), std::string::npos) << err;
}

TEST(CompileCacheShared, UnreachableRootDegradesWithOneWarning) {
  TempDir dir, local;
  write_file(dir.path() / "file", "x");
  Config c = local_config(local);
  c.shared_dir = (dir.path() / "file" / "root").string();  // below a regular file
  testing::internal::CaptureStderr();
  CompileCache cache(cpu_client(), c);
  for (int n = 1; n <= 2; ++n) expect_adds(*cache.get(add_program(2)));
  cache.get(add_program(3));
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cache.stats().misses, 2);
  size_t first = err.find("[tpu cache]");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(err.find("[tpu cache]", first + 1), std::string::npos) << err;
}

TEST(CompileCacheConfig, FromEnvironment) {
  setenv("TORCHTPU_CACHE_DIR", "off", 1);
  setenv("TORCHTPU_CACHE_MAX_BYTES", "3M", 1);
  Config c = Config::from_env();
  EXPECT_TRUE(c.local_dir.empty());
  EXPECT_EQ(c.max_bytes, 3 << 20);
  setenv("TORCHTPU_CACHE_DIR", "/some/dir", 1);
  EXPECT_EQ(Config::from_env().local_dir, "/some/dir");
  unsetenv("TORCHTPU_CACHE_DIR");
  unsetenv("TORCHTPU_CACHE_MAX_BYTES");
  const char* home = std::getenv("HOME");
  std::string saved_home = home ? home : "";
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  std::string saved_xdg = xdg ? xdg : "";
  setenv("HOME", "/home/x", 1);
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(Config::from_env().local_dir, "/home/x/.cache/torchtpu");
  setenv("HOME", saved_home.c_str(), 1);
  if (xdg) setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
}

// The translator rewrites what compiles on a miss; hits never reach it, and the
// key stays the original text.
TEST(CompileCacheTranslator, RewritesMissesOnly) {
  TempDir dir;
  std::vector<std::string> seen;
  set_source_translator([&](const std::string& text) -> std::optional<std::string> {
    seen.push_back(text);
    if (text != add_program(2)) return std::nullopt;
    return add_program(3);
  });
  std::vector<std::string> compiled;
  auto record = [&](const std::string& m, const pjrt::CompileOptions& o) {
    compiled.push_back(m);
    return cpu_client()->compile(m, o);
  };
  {
    CompileCache cache(cpu_client(), local_config(dir), record);
    cache.get(add_program(2));
    cache.get(add_program(2));
    cache.get(add_program(4));
  }
  CompileCache again(cpu_client(), local_config(dir), record);
  again.get(add_program(2));
  set_source_translator(nullptr);
  EXPECT_EQ(seen, (std::vector<std::string>{add_program(2), add_program(4)}));
  EXPECT_EQ(compiled, (std::vector<std::string>{add_program(3), add_program(4)}));
  EXPECT_EQ(again.stats().misses, 0);
}

}  // namespace
}  // namespace torchtpu::cache
