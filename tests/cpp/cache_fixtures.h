// What the compile-cache and kernel-pack tests share: the stock CPU plugin's
// client, small distinct programs, a scratch directory and whole-file I/O.
#pragma once
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>

#include "pjrt/pjrt.h"

namespace torchtpu::cache::fixtures {

namespace fs = std::filesystem;

inline pjrt::ClientPtr cpu_client() {
  static pjrt::ClientPtr client = [] {
    std::string path =
        std::string(TORCHTPU_SITE_PACKAGES) + "/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";
    return pjrt::Client::create(pjrt::Plugin::load(path), {{"cpu_device_count", int64_t{1}}});
  }();
  return client;
}

// A distinct valid program per `n`: out = a + b over tensor<nxf32>.
inline std::string add_program(int n) {
  std::string t = "tensor<" + std::to_string(n) + "xf32>";
  return "module {\n  func.func public @main(%a: " + t + ", %b: " + t + ") -> " + t +
         " {\n    %0 = stablehlo.add %a, %b : " + t + "\n    return %0 : " + t + "\n  }\n}\n";
}

// A fresh directory, removed (read-only parts too) at scope end.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> n{0};
    path_ = fs::temp_directory_path() /
            ("torchtpu_cache_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

inline std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

}  // namespace torchtpu::cache::fixtures
