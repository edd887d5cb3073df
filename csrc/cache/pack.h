// Precompiled kernel packs: one portable file of cache entries, each tagged
// with the runtime identity it was compiled for, read as a read-only tier
// (TORCHTPU_CACHE_PACKS). Depends only on the disk store's entry format.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/disk_store.h"

namespace torchtpu::cache {

// Bumped whenever the pack layout changes (entries follow kFormatVersion).
inline constexpr uint32_t kPackVersion = 1;

// Streams entries into `path`: written to a temp file beside it, checksummed,
// fsynced and renamed on finish(), removed if never finished. Throws
// std::runtime_error naming the file on I/O failure.
class PackWriter {
 public:
  explicit PackWriter(std::filesystem::path path);
  ~PackWriter();
  PackWriter(const PackWriter&) = delete;
  PackWriter& operator=(const PackWriter&) = delete;
  // `entry_file` is one entry file's bytes (DiskStore::encode).
  void add(std::string_view entry_file);
  // Number of entries written.
  uint64_t finish();

 private:
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
  uint64_t count_ = 0;
  bool done_ = false;
};

struct PackStats {
  int64_t entries = 0, skipped = 0, bytes = 0;
};
// Packs every valid entry of a cache directory; corrupt ones are skipped.
PackStats pack_directory(const DiskStore& dir, const std::filesystem::path& out);

// A pack mapped read-only. open() checks the whole-file checksum and every
// entry header; each entry's own checksum is checked when it is read.
class PackFile {
 public:
  struct Entry {
    EntryHeader header;
    uint64_t offset = 0;  // of the entry file's bytes within the pack
  };
  // Throws std::runtime_error naming the file and what is wrong with it.
  static std::shared_ptr<PackFile> open(const std::filesystem::path& path);
  ~PackFile();
  PackFile(const PackFile&) = delete;
  PackFile& operator=(const PackFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::vector<Entry>& entries() const { return entries_; }
  uint64_t size() const { return size_; }
  // Entry `i`'s bytes checked and decoded; the error when they are bad.
  std::optional<std::string> read(size_t i, StoredEntry* out) const;

 private:
  PackFile() = default;
  std::filesystem::path path_;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace torchtpu::cache
