// One directory of serialized executables, shared by every process that uses
// it. Entries are published atomically (temp file + fsync + rename), carry a
// checksum, and are read under a shared flock so eviction never removes an
// entry while another process reads it.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache/sha256.h"

namespace torchtpu::cache {

// Bumped whenever the entry layout or the key recipe changes.
inline constexpr uint32_t kFormatVersion = 2;

struct StoredEntry {
  std::string payload;           // PJRT_Executable_Serialize bytes
  double compile_seconds = 0.0;  // what the original compile cost
  Digest identity{};             // runtime_identity() of the compiling process
};

// The fixed header of an entry file, read without checking the payload.
struct EntryHeader {
  Digest key{}, identity{};
  uint64_t payload_size = 0;
  uint64_t file_size() const;  // header + payload
};

struct ReadResult {
  enum Status { kHit, kMiss, kCorrupt, kUnreadable } status = kMiss;
  StoredEntry entry;
  std::string error;  // why kCorrupt / kUnreadable
};

struct Usage {
  int64_t entries = 0;
  int64_t bytes = 0;
};

// Exclusive cross-process lock on one key while it is being compiled.
// Released (and its file removed) on destruction.
class KeyLock {
 public:
  KeyLock(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  KeyLock(KeyLock&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  KeyLock(const KeyLock&) = delete;
  KeyLock& operator=(const KeyLock&) = delete;
  KeyLock& operator=(KeyLock&&) = delete;
  ~KeyLock();

 private:
  int fd_;
  std::filesystem::path path_;
};

class DiskStore {
 public:
  explicit DiskStore(std::filesystem::path root) : root_(std::move(root)) {}
  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path entry_path(const Digest& key) const;

  // Creates the directory; throws std::runtime_error naming it when impossible.
  void ensure_root() const;
  // Never throws. kCorrupt: truncated, bit-flipped, foreign key or wrong format.
  // A hit refreshes the entry's mtime (the LRU clock).
  ReadResult read(const Digest& key) const;
  // Atomic publish; a no-op when the entry already exists. Throws
  // std::runtime_error naming the file and the errno text on I/O failure.
  // `identity` is recorded so that a pack built from the directory can tell
  // which runtime each entry belongs to (zero: unknown, refused by packs).
  void write(const Digest& key, std::string_view payload, double compile_seconds,
             const Digest& identity = {}) const;
  // Removes the entry if it is still the file that was found corrupt.
  bool remove(const Digest& key) const;
  Usage usage() const;
  // Removes least recently used entries (skipping ones being read) until the
  // total is <= max_bytes; also stale temp/lock files of killed processes.
  // Returns the number of entries removed.
  int64_t evict(int64_t max_bytes) const;
  int64_t clear() const { return evict(0); }
  // Waits up to timeout_s for the key's compile lock; nullopt on timeout or
  // when the directory is not writable (the caller then compiles unlocked).
  std::optional<KeyLock> lock_key(const Digest& key, double timeout_s) const;

  // The bytes of an entry file (header + payload); exposed for tests.
  static std::string encode(const Digest& key, std::string_view payload, double compile_seconds,
                            const Digest& identity = {});
  // The header of an entry file (magic, format and sizes checked, not the
  // checksum); nullopt when it is not one.
  static std::optional<EntryHeader> header(std::string_view file);
  // Keys of the entry files in the directory.
  std::vector<Digest> keys() const;
  // Checks an entry file's bytes; fills `out` or returns why they are bad.
  static std::optional<std::string> decode(const Digest& key, std::string_view file,
                                           StoredEntry* out);

 private:
  std::filesystem::path root_;
};

}  // namespace torchtpu::cache
