#include "cache/disk_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace torchtpu::cache {

namespace fs = std::filesystem;

namespace {

// Entry file: a fixed little-endian header, then the payload.
//   0 magic[8]  8 format u32  12 header size u32  16 key[32]  48 payload size u64
//  56 compile seconds f64  64 runtime identity[32]  96 sha256(bytes 0..95 + payload)[32]
// 128 payload
constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'X', 'E', 'C', '\n'};
constexpr size_t kHeaderSize = 128;
constexpr size_t kSumAt = 96;
constexpr char kEntrySuffix[] = ".entry";
constexpr char kLockSuffix[] = ".lock";
constexpr char kTempSuffix[] = ".tmp";
// Temp and lock files this old belong to killed processes.
constexpr auto kStaleAge = std::chrono::hours(1);

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t get_le(std::string_view s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Closes a file descriptor (and so drops its flock) on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// True when `fd` is still the file at `path` (not replaced or removed since it was opened).
bool still_linked(int fd, const fs::path& path) {
  struct stat a {
  }, b{};
  return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && same_file(a, b);
}

bool read_all(int fd, std::string* out) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  out->resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out->size()) {
    ssize_t n = ::read(fd, out->data() + done, out->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  out->resize(done);  // A file shrunk under us reads as truncated.
  return true;
}

void write_all(int fd, std::string_view data, const fs::path& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw std::runtime_error("compile cache: writing " + path.string() +
                               " failed: " + errno_text(errno));
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

bool has_suffix(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_key_hex(std::string_view s) {
  Digest unused;
  return from_hex(s, &unused);
}

bool is_entry_name(const std::string& name) {
  return name.size() == 64 + sizeof(kEntrySuffix) - 1 && has_suffix(name, kEntrySuffix) &&
         is_key_hex(std::string_view(name).substr(0, 64));
}

// ".<key hex>.<pid>.<n>.tmp" and "<key hex>.lock": only our own files are swept,
// whatever else shares the directory.
bool is_temp_or_lock_name(const std::string& name) {
  if (name.size() == 64 + sizeof(kLockSuffix) - 1 && has_suffix(name, kLockSuffix))
    return is_key_hex(std::string_view(name).substr(0, 64));
  return name.size() > 66 && name[0] == '.' && has_suffix(name, kTempSuffix) && name[65] == '.' &&
         is_key_hex(std::string_view(name).substr(1, 64));
}

// Removes `path` if no reader holds it and it is still the file we locked.
bool remove_if_unlocked(const fs::path& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 || ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;
  return still_linked(fd.get(), path) && ::unlink(path.c_str()) == 0;
}

struct Candidate {
  fs::path path;
  int64_t bytes;
  fs::file_time_type used;
};

}  // namespace

KeyLock::~KeyLock() {
  if (fd_ < 0) return;
  // Unlink before unlocking: a waiter that then wins the old inode sees it is
  // stale and retries on a fresh file (see DiskStore::lock_key).
  ::unlink(path_.c_str());
  ::close(fd_);
}

fs::path DiskStore::entry_path(const Digest& key) const {
  return root_ / (to_hex(key) + kEntrySuffix);
}

void DiskStore::ensure_root() const {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec || !fs::is_directory(root_, ec)) {
    throw std::runtime_error("cannot create cache directory " + root_.string() + ": " +
                             (ec ? ec.message() : "not a directory"));
  }
}

uint64_t EntryHeader::file_size() const { return kHeaderSize + payload_size; }

std::string DiskStore::encode(const Digest& key, std::string_view payload, double compile_seconds,
                              const Digest& identity) {
  std::string out(kMagic, sizeof(kMagic));
  put_le(out, kFormatVersion, 4);
  put_le(out, kHeaderSize, 4);
  out.append(reinterpret_cast<const char*>(key.data()), key.size());
  put_le(out, payload.size(), 8);
  uint64_t secs;
  std::memcpy(&secs, &compile_seconds, sizeof(secs));
  put_le(out, secs, 8);
  out.append(reinterpret_cast<const char*>(identity.data()), identity.size());
  Digest sum = Sha256().update(out).update(payload).finish();
  out.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  out.append(payload);
  return out;
}

namespace {

std::optional<std::string> check_header(std::string_view file) {
  if (file.size() < kHeaderSize)
    return "truncated header (" + std::to_string(file.size()) + " bytes)";
  if (file.substr(0, sizeof(kMagic)) != std::string_view(kMagic, sizeof(kMagic)))
    return std::string("not a cache entry (bad magic)");
  uint64_t version = get_le(file, 8, 4);
  if (version != kFormatVersion || get_le(file, 12, 4) != kHeaderSize)
    return "entry format " + std::to_string(version) + ", expected " +
           std::to_string(kFormatVersion);
  return std::nullopt;
}

Digest digest_at(std::string_view file, size_t at) {
  Digest d;
  std::memcpy(d.data(), file.data() + at, d.size());
  return d;
}

}  // namespace

std::optional<EntryHeader> DiskStore::header(std::string_view file) {
  if (check_header(file)) return std::nullopt;
  EntryHeader h;
  h.key = digest_at(file, 16);
  h.identity = digest_at(file, 64);
  h.payload_size = get_le(file, 48, 8);
  return h;
}

std::optional<std::string> DiskStore::decode(const Digest& key, std::string_view file,
                                             StoredEntry* out) {
  if (auto why = check_header(file)) return why;
  if (file.substr(16, 32) != std::string_view(reinterpret_cast<const char*>(key.data()), 32))
    return std::string("foreign entry (the header holds another key)");
  uint64_t size = get_le(file, 48, 8);
  if (size != file.size() - kHeaderSize)
    return "truncated payload (" + std::to_string(file.size() - kHeaderSize) + " of " +
           std::to_string(size) + " bytes)";
  Digest sum = Sha256().update(file.substr(0, kSumAt)).update(file.substr(kHeaderSize)).finish();
  if (file.substr(kSumAt, 32) != std::string_view(reinterpret_cast<const char*>(sum.data()), 32))
    return std::string("checksum mismatch (corrupted bytes)");
  uint64_t secs = get_le(file, 56, 8);
  std::memcpy(&out->compile_seconds, &secs, sizeof(secs));
  out->identity = digest_at(file, 64);
  out->payload.assign(file.substr(kHeaderSize));
  return std::nullopt;
}

ReadResult DiskStore::read(const Digest& key) const {
  ReadResult r;
  fs::path path = entry_path(key);
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno != ENOENT) {
      r.status = ReadResult::kUnreadable;
      r.error = "cannot open " + path.string() + ": " + errno_text(errno);
    }
    return r;
  }
  // The evictor only removes entries it can lock exclusively.
  while (::flock(fd.get(), LOCK_SH) != 0 && errno == EINTR) {
  }
  std::string bytes;
  if (!read_all(fd.get(), &bytes)) {
    r.status = ReadResult::kUnreadable;
    r.error = "cannot read " + path.string() + ": " + errno_text(errno);
    return r;
  }
  if (auto why = decode(key, bytes, &r.entry)) {
    r.status = ReadResult::kCorrupt;
    r.error = path.string() + ": " + *why;
    return r;
  }
  ::futimens(fd.get(), nullptr);  // LRU clock; fails harmlessly on read-only roots.
  r.status = ReadResult::kHit;
  return r;
}

void DiskStore::write(const Digest& key, std::string_view payload, double compile_seconds,
                      const Digest& identity) const {
  fs::path path = entry_path(key);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return;  // Another process published it first.
  static std::atomic<uint64_t> counter{0};
  fs::path tmp = root_ / ("." + to_hex(key) + "." + std::to_string(::getpid()) + "." +
                          std::to_string(counter++) + kTempSuffix);
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    throw std::runtime_error("compile cache: cannot create " + tmp.string() + ": " +
                             errno_text(errno));
  }
  try {
    write_all(fd.get(), encode(key, payload, compile_seconds, identity), tmp);
    if (::fsync(fd.get()) != 0) {
      throw std::runtime_error("compile cache: fsync of " + tmp.string() +
                               " failed: " + errno_text(errno));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      throw std::runtime_error("compile cache: cannot rename " + tmp.string() + " to " +
                               path.string() + ": " + errno_text(errno));
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

bool DiskStore::remove(const Digest& key) const { return remove_if_unlocked(entry_path(key)); }

std::vector<Digest> DiskStore::keys() const {
  std::vector<Digest> out;
  std::error_code ec;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!is_entry_name(name)) continue;
    from_hex(std::string_view(name).substr(0, 64), &out.emplace_back());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Usage DiskStore::usage() const {
  Usage u;
  std::error_code ec;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    if (!is_entry_name(it->path().filename().string())) continue;
    std::error_code size_ec;
    auto size = it->file_size(size_ec);
    if (size_ec) continue;  // Evicted while we looked.
    u.entries++;
    u.bytes += static_cast<int64_t>(size);
  }
  return u;
}

int64_t DiskStore::evict(int64_t max_bytes) const {
  std::vector<Candidate> entries;
  int64_t total = 0;
  auto stale_before = fs::file_time_type::clock::now() - kStaleAge;
  std::error_code ec;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::error_code e1, e2;
    auto mtime = it->last_write_time(e1);
    if (e1) continue;
    if (is_entry_name(name)) {
      auto size = static_cast<int64_t>(it->file_size(e2));
      if (e2) continue;
      entries.push_back({it->path(), size, mtime});
      total += size;
    } else if (is_temp_or_lock_name(name) && mtime < stale_before) {
      remove_if_unlocked(it->path());
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const Candidate& a, const Candidate& b) { return a.used < b.used; });
  int64_t removed = 0;
  for (const Candidate& c : entries) {
    if (total <= max_bytes) break;
    if (!remove_if_unlocked(c.path)) continue;  // Being read, or already gone.
    total -= c.bytes;
    removed++;
  }
  return removed;
}

std::optional<KeyLock> DiskStore::lock_key(const Digest& key, double timeout_s) const {
  fs::path path = root_ / (to_hex(key) + kLockSuffix);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(timeout_s));
  auto nap = std::chrono::milliseconds(1);
  for (;;) {
    Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() < 0) return std::nullopt;
    // Polled, not blocking: a stuck holder must not hang this process forever.
    while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) return std::nullopt;
      if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::milliseconds(50));
    }
    if (still_linked(fd.get(), path)) return KeyLock(fd.release(), path);
    // The previous holder removed this file as it finished: lock the new one.
  }
}

}  // namespace torchtpu::cache
