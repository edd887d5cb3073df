// SHA-256 (FIPS 180-4) for cache keys and entry checksums. No torch, no deps.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace torchtpu::cache {

using Digest = std::array<uint8_t, 32>;

// Incremental hasher: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  Sha256& update(const void* data, size_t size);
  Sha256& update(std::string_view s) { return update(s.data(), s.size()); }
  // Length-prefixed field, so that concatenated fields cannot collide.
  Sha256& field(std::string_view s);
  Sha256& u64(uint64_t v);
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(std::string_view data);
std::string to_hex(const Digest& d);
// Parses 64 hex digits; false when `hex` is not exactly that.
bool from_hex(std::string_view hex, Digest* out);

}  // namespace torchtpu::cache
