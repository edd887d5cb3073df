#include "cache/pack.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <system_error>
#include <utility>

namespace torchtpu::cache {

namespace fs = std::filesystem;

namespace {

// Pack file, little-endian:
//   0 magic[8]  8 pack version u32  12 entry format u32  16 entry count u64
//  24 entries, each an entry file as the disk tier writes it (header with key,
//     runtime identity, sizes and its own SHA-256, then the payload)
// end-32 SHA-256 of every byte before it
constexpr char kMagic[8] = {'T', 'T', 'P', 'U', 'P', 'A', 'C', 'K'};
constexpr size_t kHeaderSize = 24;
constexpr size_t kSumSize = 32;

void put_le(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw std::runtime_error("kernel pack " + path.string() + ": " + what);
}

std::string errno_text() { return std::error_code(errno, std::generic_category()).message(); }

void write_at(int fd, std::string_view data, off_t at, const fs::path& path) {
  while (!data.empty()) {
    ssize_t n = ::pwrite(fd, data.data(), data.size(), at);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, "write failed: " + errno_text());
    data.remove_prefix(static_cast<size_t>(n));
    at += n;
  }
}

// SHA-256 of the first `size` bytes of an open file.
Digest hash_file(int fd, uint64_t size, const fs::path& path) {
  Sha256 h;
  std::string buf(size_t{1} << 20, '\0');
  for (uint64_t at = 0; at < size;) {
    ssize_t n =
        ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), size - at), static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(path, "read back failed: " + errno_text());
    h.update(buf.data(), static_cast<size_t>(n));
    at += static_cast<uint64_t>(n);
  }
  return h.finish();
}

}  // namespace

PackWriter::PackWriter(fs::path path) : path_(std::move(path)) {
  tmp_ = path_.parent_path() /
         ("." + path_.filename().string() + "." + std::to_string(::getpid()) + ".tmp");
  fd_ = ::open(tmp_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(tmp_, "cannot create: " + errno_text());
  std::string head(kMagic, sizeof(kMagic));
  put_le(head, kPackVersion, 4);
  put_le(head, kFormatVersion, 4);
  put_le(head, 0, 8);  // The count, written by finish().
  write_at(fd_, head, 0, tmp_);
}

PackWriter::~PackWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!done_) ::unlink(tmp_.c_str());
}

void PackWriter::add(std::string_view entry_file) {
  auto h = DiskStore::header(entry_file);
  if (!h || h->file_size() != entry_file.size())
    throw std::invalid_argument("PackWriter::add: not one cache entry file");
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(tmp_, "stat failed: " + errno_text());
  write_at(fd_, entry_file, st.st_size, tmp_);
  count_++;
}

uint64_t PackWriter::finish() {
  std::string count;
  put_le(count, count_, 8);
  write_at(fd_, count, 16, tmp_);
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(tmp_, "stat failed: " + errno_text());
  Digest sum = hash_file(fd_, static_cast<uint64_t>(st.st_size), tmp_);
  write_at(fd_, std::string_view(reinterpret_cast<const char*>(sum.data()), sum.size()), st.st_size,
           tmp_);
  if (::fsync(fd_) != 0) fail(tmp_, "fsync failed: " + errno_text());
  ::close(std::exchange(fd_, -1));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    fail(path_, "cannot rename " + tmp_.string() + " to it: " + errno_text());
  done_ = true;
  return count_;
}

PackStats pack_directory(const DiskStore& dir, const fs::path& out) {
  PackStats s;
  PackWriter w(out);
  for (const Digest& key : dir.keys()) {
    ReadResult r = dir.read(key);
    if (r.status == ReadResult::kMiss) continue;  // Evicted meanwhile.
    if (r.status != ReadResult::kHit) {
      s.skipped++;
      continue;
    }
    std::string file =
        DiskStore::encode(key, r.entry.payload, r.entry.compile_seconds, r.entry.identity);
    w.add(file);
    s.entries++;
  }
  w.finish();
  std::error_code ec;
  s.bytes = static_cast<int64_t>(fs::file_size(out, ec));
  return s;
}

std::shared_ptr<PackFile> PackFile::open(const fs::path& path) {
  std::shared_ptr<PackFile> p(new PackFile());
  p->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, "cannot stat: " + errno_text());
  }
  p->size_ = static_cast<uint64_t>(st.st_size);
  if (p->size_ < kHeaderSize + kSumSize) {
    ::close(fd);
    fail(path, "too short to be a pack (" + std::to_string(p->size_) + " bytes)");
  }
  void* m = ::mmap(nullptr, p->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) fail(path, "cannot map: " + errno_text());
  p->data_ = static_cast<const char*>(m);
  const char* d = p->data_;
  if (std::memcmp(d, kMagic, sizeof(kMagic)) != 0)
    fail(path, "not a torchtpu kernel pack (bad magic)");
  if (uint64_t v = get_le(d + 8, 4); v != kPackVersion)
    fail(path,
         "pack format " + std::to_string(v) + ", this build reads " + std::to_string(kPackVersion));
  if (uint64_t v = get_le(d + 12, 4); v != kFormatVersion)
    fail(path, "entries of cache format " + std::to_string(v) + ", this build uses " +
                   std::to_string(kFormatVersion) + "; rebuild the pack");
  uint64_t body_end = p->size_ - kSumSize;
  Digest sum = sha256(std::string_view(d, body_end));
  if (std::memcmp(sum.data(), d + body_end, kSumSize) != 0)
    fail(path, "checksum mismatch (corrupted or truncated file)");
  uint64_t count = get_le(d + 16, 8), at = kHeaderSize;
  for (uint64_t i = 0; i < count; ++i) {
    auto h = DiskStore::header(std::string_view(d + at, body_end - at));
    if (!h || h->payload_size > body_end - at || h->file_size() > body_end - at)
      fail(path, "entry " + std::to_string(i) + " of " + std::to_string(count) + " is malformed");
    p->entries_.push_back({*h, at});
    at += h->file_size();
  }
  if (at != body_end) fail(path, "bytes after its " + std::to_string(count) + " entries");
  return p;
}

PackFile::~PackFile() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

std::optional<std::string> PackFile::read(size_t i, StoredEntry* out) const {
  const Entry& e = entries_.at(i);
  std::string_view file(data_ + e.offset, e.header.file_size());
  if (auto why = DiskStore::decode(e.header.key, file, out))
    return path_.string() + " entry " + std::to_string(i) + ": " + *why;
  return std::nullopt;
}

}  // namespace torchtpu::cache
