// Finding and loading a PJRT plugin, and the NVIDIA libraries the CUDA plugin
// needs (see pjrt.h).
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string_view>

#include "pjrt/call.h"
#include "pjrt/pjrt.h"

namespace torchtpu::pjrt {

using namespace detail;

namespace {

// ---------------------------------------------------------------------------
// Plugin discovery and loading.

struct PlatformInfo {
  std::string_view name, rel_path, install;
};
constexpr PlatformInfo kPlatforms[] = {
    {"cpu", "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so", "pip install xla-cpu-pjrt==0.0.1"},
    {"cuda", "jax_plugins/xla_cuda13/xla_cuda_plugin.so", "pip install jax-cuda13-pjrt"},
    {"tpu", "libtpu/libtpu.so", "pip install libtpu"},
};

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

void check_version(const PJRT_Api* api, const std::string& path) {
  if (api->struct_size < offsetof(PJRT_Api, pjrt_api_version) + sizeof(PJRT_Api_Version)) {
    throw Error(path + ": PJRT_Api struct is too small (" + std::to_string(api->struct_size) +
                " bytes); not a usable PJRT plugin");
  }
  const PJRT_Api_Version& v = api->pjrt_api_version;
  if (v.major_version != PJRT_API_MAJOR) {
    throw Error(path + " implements PJRT C API " + std::to_string(v.major_version) + "." +
                std::to_string(v.minor_version) + " but torchtpu was built against " +
                std::to_string(PJRT_API_MAJOR) + "." + std::to_string(PJRT_API_MINOR) +
                "; install a plugin with the same major version");
  }
}

// Fails at load time rather than in the middle of a user's program.
void check_required_functions(const PJRT_Api* api) {
#define TT_REQUIRE(Name) \
  if (TT_FN(api, Name) == nullptr) throw_missing("PJRT_" #Name)
  TT_REQUIRE(Error_Destroy);
  TT_REQUIRE(Error_Message);
  TT_REQUIRE(Plugin_Initialize);
  TT_REQUIRE(Event_Destroy);
  TT_REQUIRE(Event_Await);
  TT_REQUIRE(Client_Create);
  TT_REQUIRE(Client_Destroy);
  TT_REQUIRE(Client_AddressableDevices);
  TT_REQUIRE(Client_BufferFromHostBuffer);
  TT_REQUIRE(Client_Compile);
  TT_REQUIRE(LoadedExecutable_Execute);
  TT_REQUIRE(LoadedExecutable_Destroy);
  TT_REQUIRE(LoadedExecutable_GetExecutable);
  TT_REQUIRE(Executable_Destroy);
  TT_REQUIRE(Executable_NumOutputs);
  TT_REQUIRE(Buffer_Destroy);
  TT_REQUIRE(Buffer_ElementType);
  TT_REQUIRE(Buffer_Dimensions);
  TT_REQUIRE(Buffer_ToHostBuffer);
  TT_REQUIRE(Buffer_ReadyEvent);
#undef TT_REQUIRE
}

std::string stringify(const PJRT_NamedValue& v) {
  switch (v.type) {
    case PJRT_NamedValue_kString: return std::string(v.string_value, v.value_size);
    case PJRT_NamedValue_kInt64: return std::to_string(v.int64_value);
    case PJRT_NamedValue_kBool: return v.bool_value ? "true" : "false";
    case PJRT_NamedValue_kFloat: {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v.float_value));
      return buf;
    }
    case PJRT_NamedValue_kInt64List: {
      std::string s = "[";
      for (size_t i = 0; i < v.value_size; ++i) {
        if (i > 0) s += ", ";
        s += std::to_string(v.int64_array_value[i]);
      }
      return s + "]";
    }
  }
  return "?";
}

std::map<std::string, std::string> read_attributes(const PJRT_Api* api) {
  std::map<std::string, std::string> out;
  if (TT_FN(api, Plugin_Attributes) == nullptr) return out;  // Optional.
  auto a = TT_ARGS(Plugin_Attributes);
  TT_CALL(api, Plugin_Attributes, a);
  if (a.num_attributes == 0 || a.attributes == nullptr) return out;
  // The array is the plugin's: a newer plugin's PJRT_NamedValue may be larger
  // than ours, so step by the size it reports and read only the fields we know.
  const size_t stride = a.attributes[0].struct_size;
  if (stride < PJRT_NamedValue_STRUCT_SIZE) return out;  // Too old to read safely.
  const char* base = reinterpret_cast<const char*>(a.attributes);
  for (size_t i = 0; i < a.num_attributes; ++i) {
    const auto& v = *reinterpret_cast<const PJRT_NamedValue*>(base + i * stride);
    out[std::string(v.name, v.name_size)] = stringify(v);
  }
  return out;
}

// Opens the shared object and returns its validated, initialized PJRT_Api.
const PJRT_Api* open_plugin(const std::string& path) {
  // Never dlclose: the plugin owns threads and static state for the process.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw Error("cannot load PJRT plugin " + path + ": " + (why ? why : "dlopen failed") +
                "; set TORCHTPU_PJRT_PLUGIN to a valid plugin .so");
  }
  using GetPjrtApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetPjrtApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) throw Error(path + " has no GetPjrtApi symbol; it is not a PJRT plugin");
  const PJRT_Api* api = get_api();
  if (api == nullptr) throw Error(path + ": GetPjrtApi returned null");
  check_version(api, path);
  check_required_functions(api);
  auto a = TT_ARGS(Plugin_Initialize);
  TT_CALL(api, Plugin_Initialize, a);
  return api;
}

// ---------------------------------------------------------------------------
// NVIDIA libraries for the CUDA plugin.

struct CudaLib {
  const char* soname;
  bool required;
};
// What jax's CUDA 13 plugin opens by soname (its own loader preloads the same set).
constexpr CudaLib kCudaLibs[] = {
    {"libcudart.so.13", true},    {"libnvrtc.so.13", false},       {"libnvJitLink.so.13", false},
    {"libcublasLt.so.13", true},  {"libcublas.so.13", true},       {"libcufft.so.12", false},
    {"libcusparse.so.12", false}, {"libcusolver.so.12", false},    {"libcupti.so.13", false},
    {"libnccl.so.2", false},      {"libnvshmem_host.so.3", false}, {"libcudnn.so.9", false},
};

// pip's NVIDIA wheels put libraries in <site>/nvidia/<pkg>/lib (CUDA 13: nvidia/cu13/lib).
std::vector<std::filesystem::path> nvidia_lib_dirs(const std::vector<std::string>& site_dirs) {
  namespace fs = std::filesystem;
  std::vector<fs::path> out;
  for (const std::string& site : site_dirs) {
    std::error_code ec;
    fs::path root = fs::path(site) / "nvidia";
    if (!fs::is_directory(root, ec)) continue;
    std::vector<fs::path> found;
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      fs::path lib = entry.path() / "lib";
      if (fs::is_directory(lib, ec)) found.push_back(lib);
    }
    std::sort(found.begin(), found.end());  // Deterministic order.
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// find_plugin / Plugin

std::string find_plugin(const std::vector<std::string>& search_dirs) {
  namespace fs = std::filesystem;
  if (std::string explicit_path = getenv_str("TORCHTPU_PJRT_PLUGIN"); !explicit_path.empty()) {
    std::error_code ec;
    if (!fs::is_regular_file(explicit_path, ec)) {
      throw Error("TORCHTPU_PJRT_PLUGIN=" + explicit_path +
                  " does not name an existing file; point it at a PJRT plugin .so or unset it");
    }
    return explicit_path;
  }
  std::string platform = getenv_str("TORCHTPU_PLATFORM");
  if (platform.empty()) platform = "cpu";
  const PlatformInfo* info = nullptr;
  for (const PlatformInfo& p : kPlatforms) {
    if (p.name == platform) info = &p;
  }
  if (info == nullptr) {
    throw Error("unknown TORCHTPU_PLATFORM '" + platform +
                "'; use one of cpu, cuda, tpu (or set TORCHTPU_PJRT_PLUGIN to a plugin .so)");
  }
  std::string searched;
  for (const std::string& dir : search_dirs) {
    fs::path candidate = fs::path(dir) / info->rel_path;
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec)) return candidate.string();
    searched += (searched.empty() ? "" : ", ") + candidate.string();
  }
  if (searched.empty()) searched = "(no search directories given)";
  throw Error("no PJRT plugin found for platform '" + platform + "'; searched " + searched +
              ". Install it with `" + std::string(info->install) +
              "` or set TORCHTPU_PJRT_PLUGIN to the plugin .so");
}

std::vector<std::string> preload_cuda_libraries(const std::string& plugin_path,
                                                const std::vector<std::string>& site_dirs) {
  namespace fs = std::filesystem;
  std::vector<std::string> report;
  // The driver comes with the NVIDIA kernel module, never from pip.
  if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* why = dlerror();
    throw Error(std::string("TORCHTPU_PLATFORM=cuda: cannot load the NVIDIA driver library "
                            "libcuda.so.1 (") +
                (why ? why : "not found") +
                "); this machine has no usable NVIDIA driver, or it is outside the loader's path");
  }
  report.push_back("libcuda.so.1 system");
  // The plugin's own site-packages first: its RPATH points there too.
  std::vector<std::string> sites;
  std::error_code ec;
  fs::path plugin_site =
      fs::weakly_canonical(plugin_path, ec).parent_path().parent_path().parent_path();
  if (!ec && !plugin_site.empty()) sites.push_back(plugin_site.string());
  sites.insert(sites.end(), site_dirs.begin(), site_dirs.end());
  std::vector<fs::path> dirs = nvidia_lib_dirs(sites);
  std::vector<std::string> missing;
  for (const CudaLib& lib : kCudaLibs) {
    if (dlopen(lib.soname, RTLD_NOW | RTLD_NOLOAD) != nullptr) {
      report.push_back(std::string(lib.soname) + " already loaded");
      continue;
    }
    std::string loaded;
    for (const fs::path& dir : dirs) {
      fs::path candidate = dir / lib.soname;
      if (!fs::exists(candidate, ec)) continue;
      if (dlopen(candidate.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) {
        loaded = candidate.string();
        break;
      }
    }
    if (loaded.empty() && dlopen(lib.soname, RTLD_NOW | RTLD_GLOBAL) != nullptr) {
      loaded = "system";
    }
    if (loaded.empty()) {
      dlerror();  // Clear the last failure.
      if (lib.required) missing.push_back(lib.soname);
      report.push_back(std::string(lib.soname) + " not found");
      continue;
    }
    report.push_back(std::string(lib.soname) + " " + loaded);
  }
  if (!missing.empty()) {
    std::string names, searched;
    for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
    for (const auto& d : dirs) searched += (searched.empty() ? "" : ", ") + d.string();
    if (searched.empty())
      searched = "no nvidia/*/lib folder under " + std::to_string(sites.size()) +
                 " site-packages folder(s)";
    throw Error("TORCHTPU_PLATFORM=cuda: cannot find " + names + " (searched " + searched +
                ", then the system loader path). Install the CUDA 13 wheels "
                "(pip install jax-cuda13-plugin[with-cuda]) or add the CUDA 13 lib folder to "
                "LD_LIBRARY_PATH");
  }
  return report;
}

std::shared_ptr<Plugin> Plugin::load(const std::string& path) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Plugin>> cache;
  // Key by canonical path so two spellings never initialize the plugin twice.
  std::error_code ec;
  std::string key = std::filesystem::weakly_canonical(path, ec).string();
  if (ec || key.empty()) key = path;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const PJRT_Api* api = open_plugin(path);
  std::shared_ptr<Plugin> plugin(new Plugin());
  plugin->api_ = api;
  plugin->path_ = path;
  plugin->attributes_ = read_attributes(api);
  cache.emplace(key, plugin);
  return plugin;
}

int Plugin::api_major() const { return api_->pjrt_api_version.major_version; }
int Plugin::api_minor() const { return api_->pjrt_api_version.minor_version; }

}  // namespace torchtpu::pjrt
