// Tests of kernel packs: the file format on its own, then as a cache tier on
// the stock CPU plugin.
#include "cache/pack.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache/compile_cache.h"
#include "cache/disk_store.h"
#include "cache/sha256.h"
#include "cache_fixtures.h"

namespace torchtpu::cache {
namespace {

namespace fs = std::filesystem;
using namespace fixtures;

Digest identity_of(const char* name) { return sha256(name); }

// Three entries of two runtimes.
fs::path small_pack(const TempDir& dir) {
  fs::path out = dir.path() / "small.pack";
  PackWriter w(out);
  w.add(DiskStore::encode(sha256("k0"), "payload zero", 0.5, identity_of("a")));
  w.add(DiskStore::encode(sha256("k1"), std::string(3000, 'x'), 1.5, identity_of("a")));
  w.add(DiskStore::encode(sha256("k2"), "", 2.5, identity_of("b")));
  EXPECT_EQ(w.finish(), 3u);
  return out;
}

void expect_refused(const fs::path& pack, const std::string& why) {
  try {
    PackFile::open(pack);
    ADD_FAILURE() << "opened a bad pack (" << why << ")";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(pack.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

TEST(PackFormat, RoundTrip) {
  TempDir dir;
  fs::path out = small_pack(dir);
  // Published by rename: nothing else is left in the directory.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
  auto pack = PackFile::open(out);
  ASSERT_EQ(pack->entries().size(), 3u);
  EXPECT_EQ(pack->size(), fs::file_size(out));
  const char* keys[] = {"k0", "k1", "k2"};
  const char* payloads[] = {"payload zero", nullptr, ""};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(pack->entries()[i].header.key, sha256(keys[i]));
    EXPECT_EQ(pack->entries()[i].header.identity, identity_of(i < 2 ? "a" : "b"));
    StoredEntry e;
    ASSERT_EQ(pack->read(i, &e), std::nullopt);
    EXPECT_EQ(e.payload, payloads[i] ? std::string(payloads[i]) : std::string(3000, 'x'));
    EXPECT_EQ(e.compile_seconds, 0.5 + static_cast<double>(i));
    EXPECT_EQ(e.identity, pack->entries()[i].header.identity);
  }
}

TEST(PackFormat, EmptyPack) {
  TempDir dir;
  PackWriter w(dir.path() / "empty.pack");
  EXPECT_EQ(w.finish(), 0u);
  EXPECT_TRUE(PackFile::open(dir.path() / "empty.pack")->entries().empty());
}

TEST(PackFormat, UnfinishedWriterLeavesNothing) {
  TempDir dir;
  {
    PackWriter w(dir.path() / "never.pack");
    w.add(DiskStore::encode(sha256("k"), "p", 1.0));
  }
  EXPECT_TRUE(fs::is_empty(dir.path()));
  PackWriter w(dir.path() / "bad.pack");
  EXPECT_THROW(w.add("not an entry"), std::invalid_argument);
}

TEST(PackFormat, EveryFlippedByteIsRefused) {
  TempDir dir;
  fs::path out = small_pack(dir);
  std::string good = read_file(out);
  fs::path bad = dir.path() / "bad.pack";
  // Header, entry headers, payloads and the trailing checksum itself.
  for (size_t at : {size_t{3}, size_t{20}, size_t{24 + 70}, good.size() / 2, good.size() - 40,
                    good.size() - 1}) {
    std::string bytes = good;
    bytes[at] ^= 0x04;
    write_file(bad, bytes);
    std::string why = at < 8 ? "bad magic" : "checksum mismatch";
    SCOPED_TRACE("byte " + std::to_string(at));
    expect_refused(bad, why);
  }
  write_file(bad, good.substr(0, good.size() - 100));
  expect_refused(bad, "checksum mismatch");
  write_file(bad, good.substr(0, 30));
  expect_refused(bad, "too short");
  expect_refused(dir.path() / "missing.pack", "cannot open");
}

TEST(PackFormat, PacksADirectorySkippingDamagedEntries) {
  TempDir dir;
  DiskStore store(dir.path() / "cache");
  store.ensure_root();
  for (int i = 0; i < 4; ++i)
    store.write(sha256(std::to_string(i)), "payload " + std::to_string(i), 0.1, identity_of("a"));
  fs::path damaged = store.entry_path(sha256("3"));
  write_file(damaged, read_file(damaged).substr(0, 50));
  PackStats s = pack_directory(store, dir.path() / "dir.pack");
  EXPECT_EQ(s.entries, 3);
  EXPECT_EQ(s.skipped, 1);
  EXPECT_EQ(s.bytes, static_cast<int64_t>(fs::file_size(dir.path() / "dir.pack")));
  auto pack = PackFile::open(dir.path() / "dir.pack");
  ASSERT_EQ(pack->entries().size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    StoredEntry e;
    ASSERT_EQ(pack->read(i, &e), std::nullopt);
    EXPECT_EQ(e.identity, identity_of("a"));
    EXPECT_EQ(e.payload.rfind("payload ", 0), 0u);
  }
}

// A cache directory holding add_program(2) and (3), compiled here, and its pack.
struct Compiled {
  TempDir dir;
  fs::path pack;
  Digest identity;
  Compiled() {
    Config c;
    c.local_dir = (dir.path() / "cache").string();
    CompileCache writer(cpu_client(), c);
    writer.get(add_program(2));
    writer.get(add_program(3));
    identity = writer.identity();
    pack = dir.path() / "run.pack";
    EXPECT_EQ(pack_directory(DiskStore(c.local_dir), pack).entries, 2);
  }
};

Config packs_only(const std::vector<fs::path>& packs) {
  Config c;  // no disk tier: every program comes from a pack or a compile
  for (const auto& p : packs) c.packs.push_back(p.string());
  return c;
}

TEST(PackTier, ColdCacheCompilesNothing) {
  Compiled run;
  CompileCache cold(cpu_client(), packs_only({run.pack}));
  float a[2] = {1, 2}, out[2] = {0, 0};
  auto buf = cpu_client()->buffer_from_host(a, DType::F32, std::vector<int64_t>{2}, 0);
  pjrt::Buffer* args[] = {buf.get(), buf.get()};
  cold.get(add_program(2))->execute(args, 0)[0]->to_host(out, sizeof(out));
  EXPECT_EQ(out[1], 4.0f);
  cold.get(add_program(3));
  cold.get(add_program(2));
  Stats s = cold.stats();
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.pack_hits, 2);
  EXPECT_EQ(s.memory_hits, 1);
  EXPECT_EQ(s.pack_entries, 2);
  EXPECT_EQ(s.pack_refused, 0);
  EXPECT_GT(s.saved_seconds, 0.0);
  cold.get(add_program(4));  // not in the pack
  EXPECT_EQ(cold.stats().misses, 1);
}

TEST(PackTier, ForeignEntriesAreRefusedOneByOne) {
  Compiled run;
  // The same entries, one claimed by another runtime.
  fs::path mixed = run.dir.path() / "mixed.pack";
  {
    auto pack = PackFile::open(run.pack);
    PackWriter w(mixed);
    for (size_t i = 0; i < 2; ++i) {
      StoredEntry e;
      ASSERT_EQ(pack->read(i, &e), std::nullopt);
      Digest who = i == 0 ? identity_of("another plugin") : e.identity;
      w.add(DiskStore::encode(pack->entries()[i].header.key, e.payload, e.compile_seconds, who));
    }
    w.finish();
  }
  testing::internal::CaptureStderr();
  CompileCache cold(cpu_client(), packs_only({mixed}));
  cold.get(add_program(2));
  cold.get(add_program(3));
  std::string err = testing::internal::GetCapturedStderr();
  Stats s = cold.stats();
  EXPECT_EQ(s.pack_refused, 1);
  EXPECT_EQ(s.pack_entries, 1);
  EXPECT_EQ(s.pack_hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_NE(err.find("refused 1 of 2 entries"), std::string::npos) << err;
  EXPECT_NE(err.find(mixed.string()), std::string::npos) << err;
}

TEST(PackTier, DamagedPackIsRefusedWholeAndOthersStillServe) {
  Compiled run;
  fs::path bad = run.dir.path() / "bad.pack";
  std::string bytes = read_file(run.pack);
  bytes[bytes.size() / 2] ^= 0x01;
  write_file(bad, bytes);
  testing::internal::CaptureStderr();
  CompileCache cold(cpu_client(), packs_only({bad, run.pack}));
  cold.get(add_program(2));
  std::string err = testing::internal::GetCapturedStderr();
  Stats s = cold.stats();
  EXPECT_EQ(s.errors, 1);
  EXPECT_EQ(s.pack_hits, 1);
  EXPECT_EQ(s.misses, 0);
  EXPECT_NE(err.find(bad.string()), std::string::npos) << err;
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;

  CompileCache only_bad(cpu_client(), packs_only({bad}));
  testing::internal::CaptureStderr();
  only_bad.get(add_program(2));
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(only_bad.stats().misses, 1);
  EXPECT_EQ(only_bad.stats().pack_hits, 0);
}

TEST(PackTier, ListFromEnvironment) {
  ::setenv("TORCHTPU_CACHE_PACKS", "a.pack::/x/b.pack:", 1);
  Config c = Config::from_env();
  ::unsetenv("TORCHTPU_CACHE_PACKS");
  EXPECT_EQ(c.packs, (std::vector<std::string>{"a.pack", "/x/b.pack"}));
  EXPECT_TRUE(Config::from_env().packs.empty());
}

}  // namespace
}  // namespace torchtpu::cache
