// PJRT C API runtime: see pjrt.h. Everything here talks to the plugin through
// the PJRT_Api function table; no XLA headers or libraries are linked.
#include "pjrt/pjrt.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <thread>
#include <type_traits>

#include "pjrt_c_api.h"

namespace torchtpu::pjrt {
namespace {

// ---------------------------------------------------------------------------
// Calling convention helpers.

// Zero-initialized args struct with struct_size set, as every PJRT call expects.
template <class Args>
Args make_args(size_t struct_size) {
  Args args{};
  args.struct_size = struct_size;
  return args;
}
#define TT_ARGS(Name) make_args<PJRT_##Name##_Args>(PJRT_##Name##_Args_STRUCT_SIZE)

// Looks up a function pointer, or nullptr when the plugin's PJRT_Api is too old
// to have the field (its struct_size ends before it) or leaves it unset.
template <class Fn>
Fn* find_fn(const PJRT_Api* api, size_t offset) {
  if (offset + sizeof(Fn*) > api->struct_size) return nullptr;
  Fn* fn;
  std::memcpy(&fn, reinterpret_cast<const char*>(api) + offset, sizeof(fn));
  return fn;
}
#define TT_FN(api, Name) find_fn<PJRT_##Name>(api, offsetof(PJRT_Api, PJRT_##Name))

[[noreturn]] void throw_missing(const char* name) {
  throw Error(std::string("plugin lacks ") + name +
              ": the PJRT plugin is too old or incomplete; install a plugin matching PJRT C API " +
              std::to_string(PJRT_API_MAJOR) + "." + std::to_string(PJRT_API_MINOR));
}

void destroy_error(const PJRT_Api* api, PJRT_Error* err) noexcept {
  if (err == nullptr) return;
  if (auto* fn = TT_FN(api, Error_Destroy)) {
    auto a = TT_ARGS(Error_Destroy);
    a.error = err;
    fn(&a);
  }
}

// Turns a plugin error into pjrt::Error("<name>: <message>", code) and frees it.
[[noreturn]] __attribute__((noinline)) void throw_error(const PJRT_Api* api, PJRT_Error* err,
                                                        const char* name) {
  std::string msg = std::string(name) + ": ";
  if (auto* fn = TT_FN(api, Error_Message)) {
    auto a = TT_ARGS(Error_Message);
    a.error = err;
    fn(&a);
    msg.append(a.message, a.message_size);
  } else {
    msg += "(plugin gave no message)";
  }
  int code = 0;
  if (auto* fn = TT_FN(api, Error_GetCode)) {
    auto a = TT_ARGS(Error_GetCode);
    a.error = err;
    if (PJRT_Error* e2 = fn(&a)) {
      destroy_error(api, e2);
    } else {
      code = static_cast<int>(a.code);
    }
  }
  destroy_error(api, err);
  throw Error(msg, code);
}

template <class Fn, class Args>
inline void call_checked(const PJRT_Api* api, Fn* fn, Args* args, const char* name) {
  if (fn == nullptr) [[unlikely]]
    throw_missing(name);
  if (PJRT_Error* err = fn(args)) [[unlikely]]
    throw_error(api, err, name);
}
// Calls PJRT_<Name>(&args), throwing pjrt::Error on failure.
#define TT_CALL(api, Name, args) call_checked(api, TT_FN(api, Name), &(args), "PJRT_" #Name)

// Calls a destroy-like function whose failure can only be swallowed.
template <class Fn, class Args>
void call_ignoring_error(const PJRT_Api* api, Fn* fn, Args* args) noexcept {
  if (fn != nullptr) destroy_error(api, fn(args));
}

void destroy_buffer(const PJRT_Api* api, PJRT_Buffer* buf) noexcept {
  if (buf == nullptr) return;
  auto a = TT_ARGS(Buffer_Destroy);
  a.buffer = buf;
  call_ignoring_error(api, TT_FN(api, Buffer_Destroy), &a);
}

// Owns a PJRT_Event; Await reports the async operation's error.
class Event {
 public:
  Event(const PJRT_Api* api, PJRT_Event* event) : api_(api), event_(event) {}
  ~Event() {
    if (event_ == nullptr) return;
    auto a = TT_ARGS(Event_Destroy);
    a.event = event_;
    call_ignoring_error(api_, TT_FN(api_, Event_Destroy), &a);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  // `what` names the operation the event belongs to, for the error message.
  void await(const char* what) const {
    if (event_ == nullptr) return;  // Nothing pending.
    auto a = TT_ARGS(Event_Await);
    a.event = event_;
    call_checked(api_, TT_FN(api_, Event_Await), &a, what);
  }
  bool is_ready() const {
    if (event_ == nullptr) return true;
    auto a = TT_ARGS(Event_IsReady);
    a.event = event_;
    TT_CALL(api_, Event_IsReady, a);
    return a.is_ready;
  }

 private:
  const PJRT_Api* api_;
  PJRT_Event* event_;
};

// Owns a PJRT_Executable (the unloaded view of a loaded executable).
class ExecutableView {
 public:
  ExecutableView(const PJRT_Api* api, PJRT_LoadedExecutable* loaded) : api_(api) {
    auto a = TT_ARGS(LoadedExecutable_GetExecutable);
    a.loaded_executable = loaded;
    TT_CALL(api, LoadedExecutable_GetExecutable, a);
    exe_ = a.executable;
  }
  ~ExecutableView() {
    auto a = TT_ARGS(Executable_Destroy);
    a.executable = exe_;
    call_ignoring_error(api_, TT_FN(api_, Executable_Destroy), &a);
  }
  ExecutableView(const ExecutableView&) = delete;
  ExecutableView& operator=(const ExecutableView&) = delete;
  PJRT_Executable* get() const { return exe_; }

 private:
  const PJRT_Api* api_;
  PJRT_Executable* exe_ = nullptr;
};

// ---------------------------------------------------------------------------
// Element types.

PJRT_Buffer_Type to_pjrt(DType t) {
  switch (t) {
    case DType::Bool: return PJRT_Buffer_Type_PRED;
    case DType::I8: return PJRT_Buffer_Type_S8;
    case DType::I16: return PJRT_Buffer_Type_S16;
    case DType::I32: return PJRT_Buffer_Type_S32;
    case DType::I64: return PJRT_Buffer_Type_S64;
    case DType::U8: return PJRT_Buffer_Type_U8;
    case DType::U16: return PJRT_Buffer_Type_U16;
    case DType::U32: return PJRT_Buffer_Type_U32;
    case DType::U64: return PJRT_Buffer_Type_U64;
    case DType::F16: return PJRT_Buffer_Type_F16;
    case DType::BF16: return PJRT_Buffer_Type_BF16;
    case DType::F32: return PJRT_Buffer_Type_F32;
    case DType::F64: return PJRT_Buffer_Type_F64;
    case DType::C64: return PJRT_Buffer_Type_C64;
    case DType::C128: return PJRT_Buffer_Type_C128;
  }
  throw Error("invalid DType " + std::to_string(static_cast<int>(t)));
}

DType from_pjrt(PJRT_Buffer_Type t) {
  switch (t) {
    case PJRT_Buffer_Type_PRED: return DType::Bool;
    case PJRT_Buffer_Type_S8: return DType::I8;
    case PJRT_Buffer_Type_S16: return DType::I16;
    case PJRT_Buffer_Type_S32: return DType::I32;
    case PJRT_Buffer_Type_S64: return DType::I64;
    case PJRT_Buffer_Type_U8: return DType::U8;
    case PJRT_Buffer_Type_U16: return DType::U16;
    case PJRT_Buffer_Type_U32: return DType::U32;
    case PJRT_Buffer_Type_U64: return DType::U64;
    case PJRT_Buffer_Type_F16: return DType::F16;
    case PJRT_Buffer_Type_BF16: return DType::BF16;
    case PJRT_Buffer_Type_F32: return DType::F32;
    case PJRT_Buffer_Type_F64: return DType::F64;
    case PJRT_Buffer_Type_C64: return DType::C64;
    case PJRT_Buffer_Type_C128: return DType::C128;
    default: break;
  }
  throw Error(
      "PJRT buffer element type " + std::to_string(static_cast<int>(t)) +
      " has no torchtpu DType; the program must only produce bool/int/float/complex outputs");
}

// Wraps a freshly produced PJRT buffer, reading its element type and shape.
BufferPtr wrap_output(const std::shared_ptr<Client>& client, PJRT_Buffer* raw) {
  const PJRT_Api* api = client->api();
  auto type = TT_ARGS(Buffer_ElementType);
  type.buffer = raw;
  TT_CALL(api, Buffer_ElementType, type);
  DType dtype = from_pjrt(type.type);
  auto shape = TT_ARGS(Buffer_Dimensions);
  shape.buffer = raw;
  TT_CALL(api, Buffer_Dimensions, shape);
  std::vector<int64_t> dims(shape.dims, shape.dims + shape.num_dims);
  return std::make_shared<Buffer>(client, raw, dtype, std::move(dims));
}

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
// Key-value callbacks. The plugin allocates the args structs: fields are only
// touched when the struct_size it set covers them (an older or newer plugin).

template <class Args>
bool covers(const Args* args, size_t offset, size_t size) {
  return args->struct_size >= offset + size;
}
#define TT_HAS(args, field) \
  covers(args, offsetof(std::remove_pointer_t<decltype(args)>, field), sizeof((args)->field))

template <class Args>
PJRT_Error* callback_failure(const Args* args, PJRT_Error_Code code, const std::string& msg) {
  if (!TT_HAS(args, callback_error) || args->callback_error == nullptr ||
      *args->callback_error == nullptr) {
    // A plugin always passes callback_error; without it the failure can only be
    // logged, and the plugin sees an empty value (or its own timeout) instead.
    std::fprintf(stderr, "[torchtpu] key-value callback failed, plugin gave no way to report: %s\n",
                 msg.c_str());
    return nullptr;
  }
  return (*args->callback_error)(code, msg.data(), msg.size());
}

void delete_value(char* value) { delete[] value; }

// Hands `value` to the plugin, which frees it through value_deleter_callback.
template <class Args>
void give_value(Args* args, const std::string& value) {
  char* copy = new char[value.size() + 1];
  std::memcpy(copy, value.data(), value.size());
  copy[value.size()] = '\0';
  args->value = copy;
  args->value_size = value.size();
  args->value_deleter_callback = &delete_value;
}

template <class Args>
PJRT_Error* kv_failure(const Args* args, const std::string& op, const std::string& key) {
  try {
    throw;
  } catch (const KvTimeout& e) {
    return callback_failure(args, PJRT_Error_Code_DEADLINE_EXCEEDED,
                            "key-value store " + op + " '" + key + "': " + e.what());
  } catch (const std::exception& e) {
    return callback_failure(args, PJRT_Error_Code_UNAVAILABLE,
                            "key-value store " + op + " '" + key + "' failed: " + e.what());
  } catch (...) {
    return callback_failure(args, PJRT_Error_Code_UNKNOWN,
                            "key-value store " + op + " '" + key + "' failed (unknown exception)");
  }
}

PJRT_Error* kv_get_trampoline(PJRT_KeyValueGetCallback_Args* args) {
  if (!TT_HAS(args, value_deleter_callback) || !TT_HAS(args, user_arg)) {
    return callback_failure(args, PJRT_Error_Code_INVALID_ARGUMENT,
                            "key-value get: the plugin's args struct is too small (" +
                                std::to_string(args->struct_size) + " bytes)");
  }
  std::string key(args->key, args->key_size);
  try {
    auto* store = static_cast<KeyValueStore*>(args->user_arg);
    give_value(args, store->get(key, std::chrono::milliseconds(args->timeout_in_ms)));
    return nullptr;
  } catch (...) {
    return kv_failure(args, "get", key);
  }
}

PJRT_Error* kv_try_get_trampoline(PJRT_KeyValueTryGetCallback_Args* args) {
  if (!TT_HAS(args, value_deleter_callback) || !TT_HAS(args, user_arg)) {
    return callback_failure(args, PJRT_Error_Code_INVALID_ARGUMENT,
                            "key-value try_get: the plugin's args struct is too small (" +
                                std::to_string(args->struct_size) + " bytes)");
  }
  std::string key(args->key, args->key_size);
  try {
    auto* store = static_cast<KeyValueStore*>(args->user_arg);
    std::optional<std::string> value = store->try_get(key);
    if (!value) {
      return callback_failure(args, PJRT_Error_Code_NOT_FOUND,
                              "key-value store: key '" + key + "' not found");
    }
    give_value(args, *value);
    return nullptr;
  } catch (...) {
    return kv_failure(args, "try_get", key);
  }
}

PJRT_Error* kv_put_trampoline(PJRT_KeyValuePutCallback_Args* args) {
  if (!TT_HAS(args, user_arg)) {
    return callback_failure(args, PJRT_Error_Code_INVALID_ARGUMENT,
                            "key-value put: the plugin's args struct is too small (" +
                                std::to_string(args->struct_size) + " bytes)");
  }
  std::string key(args->key, args->key_size);
  try {
    auto* store = static_cast<KeyValueStore*>(args->user_arg);
    store->put(key, std::string_view(args->value, args->value_size));
    return nullptr;
  } catch (...) {
    return kv_failure(args, "put", key);
  }
}

// What a plugin's callback_error builds, for kv_callback_*: our own error type.
struct CallbackError {
  PJRT_Error_Code code;
  std::string message;
};
PJRT_Error* make_callback_error(PJRT_Error_Code code, const char* message, size_t size) {
  return reinterpret_cast<PJRT_Error*>(new CallbackError{code, std::string(message, size)});
}
[[noreturn]] void throw_callback_error(PJRT_Error* err) {
  std::unique_ptr<CallbackError> e(reinterpret_cast<CallbackError*>(err));
  throw Error(e->message, static_cast<int>(e->code));
}
PJRT_CallbackError kCallbackError = &make_callback_error;

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

// ---------------------------------------------------------------------------
// Protobuf encoding (just enough for CompileOptionsProto).

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_varint_field(std::string& out, uint32_t field, uint64_t v) {
  put_varint(out, (field << 3) | 0);  // Wire type 0: varint.
  put_varint(out, v);
}
void put_bytes_field(std::string& out, uint32_t field, const std::string& bytes) {
  put_varint(out, (field << 3) | 2);  // Wire type 2: length-delimited.
  put_varint(out, bytes.size());
  out += bytes;
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

std::string kv_callback_get(KeyValueStore& store, const std::string& key, int timeout_ms) {
  auto a = TT_ARGS(KeyValueGetCallback);
  a.key = key.data();
  a.key_size = key.size();
  a.timeout_in_ms = timeout_ms;
  a.callback_error = &kCallbackError;
  a.user_arg = &store;
  if (PJRT_Error* err = kv_get_trampoline(&a)) throw_callback_error(err);
  std::string value(a.value, a.value_size);
  a.value_deleter_callback(a.value);
  return value;
}

std::optional<std::string> kv_callback_try_get(KeyValueStore& store, const std::string& key) {
  auto a = TT_ARGS(KeyValueTryGetCallback);
  a.key = key.data();
  a.key_size = key.size();
  a.callback_error = &kCallbackError;
  a.user_arg = &store;
  if (PJRT_Error* err = kv_try_get_trampoline(&a)) {
    std::unique_ptr<CallbackError> e(reinterpret_cast<CallbackError*>(err));
    if (e->code == PJRT_Error_Code_NOT_FOUND) return std::nullopt;
    throw Error(e->message, static_cast<int>(e->code));
  }
  std::string value(a.value, a.value_size);
  a.value_deleter_callback(a.value);
  return value;
}

void kv_callback_put(KeyValueStore& store, const std::string& key, const std::string& value) {
  auto a = TT_ARGS(KeyValuePutCallback);
  a.key = key.data();
  a.key_size = key.size();
  a.value = value.data();
  a.value_size = value.size();
  a.callback_error = &kCallbackError;
  a.user_arg = &store;
  if (PJRT_Error* err = kv_put_trampoline(&a)) throw_callback_error(err);
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

// ---------------------------------------------------------------------------
// Buffer

struct Buffer::Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
};

Buffer::Buffer(std::shared_ptr<Client> client, PJRT_Buffer* buf, DType dtype,
               std::vector<int64_t> dims)
    : client_(std::move(client)), buf_(buf), dtype_(dtype), dims_(std::move(dims)) {}

namespace {

// PJRT_Buffer_Destroy blocks until every execution reading the buffer has
// finished, which would make the host wait for the device whenever a value
// is replaced. Buffers are destroyed on this thread instead.
class Reaper {
 public:
  Reaper() {
    std::thread([this] { run(); }).detach();
  }
  void push(std::shared_ptr<Client> client, PJRT_Buffer* buf) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(client), buf);
    if (queue_.size() == 1 || queue_.size() == kBatch) cv_.notify_one();
  }

 private:
  void run() {
    std::vector<std::pair<std::shared_ptr<Client>, PJRT_Buffer*>> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        // Collect a batch (or wait at most 1 ms) so one wake-up serves many buffers.
        cv_.wait_for(lock, std::chrono::milliseconds(1),
                     [this] { return queue_.size() >= kBatch; });
        batch.swap(queue_);
      }
      for (auto& [client, buf] : batch) destroy_buffer(client->api(), buf);
      batch.clear();
    }
  }
  static constexpr size_t kBatch = 64;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::shared_ptr<Client>, PJRT_Buffer*>> queue_;
};

Reaper& reaper() {
  static auto* r = new Reaper();  // leaked: buffers may die during exit
  return *r;
}

}  // namespace

std::shared_ptr<Buffer> Buffer::placeholder(std::shared_ptr<Client> client, DType dtype,
                                            std::vector<int64_t> dims) {
  auto b = std::make_shared<Buffer>(std::move(client), nullptr, dtype, std::move(dims));
  b->pending_ = std::make_unique<Pending>();
  return b;
}

PJRT_Buffer* Buffer::wait_filled() const {
  if (!pending_) throw Error("Buffer: no PJRT buffer (already given away)");
  std::unique_lock<std::mutex> lock(pending_->mu);
  pending_->cv.wait(lock, [&] { return pending_->done; });
  if (PJRT_Buffer* b = buf_.load(std::memory_order_acquire)) return b;
  throw Error(pending_->error);
}

void Buffer::fill(Buffer& produced) {
  if (!pending_) throw Error("Buffer::fill: not a placeholder");
  if (produced.dtype_ != dtype_ || produced.dims_ != dims_)
    return fail("Buffer::fill: the program produced " + std::string(mlir_name(produced.dtype_)) +
                " of " + std::to_string(produced.numel()) + " elements where " +
                std::string(mlir_name(dtype_)) + " of " + std::to_string(numel()) +
                " were expected");
  std::lock_guard<std::mutex> lock(pending_->mu);
  if (pending_->done) throw Error("Buffer::fill: already filled");
  buf_.store(produced.buf_.exchange(nullptr), std::memory_order_release);
  pending_->done = true;
  pending_->cv.notify_all();
}

void Buffer::fail(const std::string& why) {
  if (!pending_) throw Error("Buffer::fail: not a placeholder");
  std::lock_guard<std::mutex> lock(pending_->mu);
  if (pending_->done) return;
  pending_->error = why;
  pending_->done = true;
  pending_->cv.notify_all();
}

bool Buffer::filled() const {
  if (buf_.load(std::memory_order_acquire)) return true;
  if (!pending_) return false;
  std::lock_guard<std::mutex> lock(pending_->mu);
  return pending_->done;
}

Buffer::~Buffer() {
  if (PJRT_Buffer* b = buf_.load(std::memory_order_acquire)) reaper().push(std::move(client_), b);
}

int64_t Buffer::numel() const {
  int64_t n = 1;
  for (int64_t d : dims_) n *= d;
  return n;
}

void Buffer::await_ready() const {
  const PJRT_Api* api = client_->api();
  auto a = TT_ARGS(Buffer_ReadyEvent);
  a.buffer = raw();
  TT_CALL(api, Buffer_ReadyEvent, a);
  Event(api, a.event).await("PJRT_Event_Await (buffer ready)");
}

bool Buffer::is_ready() const {
  if (!filled()) return false;
  const PJRT_Api* api = client_->api();
  auto a = TT_ARGS(Buffer_ReadyEvent);
  a.buffer = raw();
  TT_CALL(api, Buffer_ReadyEvent, a);
  return Event(api, a.event).is_ready();
}

void Buffer::to_host(void* dst, size_t dst_bytes) const {
  if (dst_bytes != nbytes()) {
    throw Error("Buffer::to_host: destination has " + std::to_string(dst_bytes) +
                " bytes but the buffer holds " + std::to_string(nbytes()));
  }
  if (dst_bytes == 0) {
    await_ready();  // Still report a failed producer; a null dst would mean "query size".
    return;
  }
  const PJRT_Api* api = client_->api();
  auto a = TT_ARGS(Buffer_ToHostBuffer);
  a.src = raw();
  a.dst = dst;
  a.dst_size = dst_bytes;
  TT_CALL(api, Buffer_ToHostBuffer, a);
  Event(api, a.event).await("PJRT_Event_Await (PJRT_Buffer_ToHostBuffer)");
}

std::shared_ptr<Buffer> Buffer::copy_to_device(int device) const {
  const PJRT_Api* api = client_->api();
  auto a = TT_ARGS(Buffer_CopyToDevice);
  a.buffer = raw();
  a.dst_device = client_->device(device);
  TT_CALL(api, Buffer_CopyToDevice, a);
  try {
    return std::make_shared<Buffer>(client_, a.dst_buffer, dtype_, dims_);
  } catch (...) {
    destroy_buffer(api, a.dst_buffer);
    throw;
  }
}

// ---------------------------------------------------------------------------
// Executable

Executable::Executable(std::shared_ptr<Client> client, PJRT_LoadedExecutable* exe)
    : client_(std::move(client)), exe_(exe) {
  const PJRT_Api* api = client_->api();
  try {
    ExecutableView view(api, exe_);
    auto a = TT_ARGS(Executable_NumOutputs);
    a.executable = view.get();
    TT_CALL(api, Executable_NumOutputs, a);
    num_outputs_ = a.num_outputs;
  } catch (...) {
    auto a = TT_ARGS(LoadedExecutable_Destroy);  // The destructor will not run.
    a.executable = exe_;
    call_ignoring_error(api, TT_FN(api, LoadedExecutable_Destroy), &a);
    throw;
  }
}

Executable::~Executable() {
  const PJRT_Api* api = client_->api();
  auto a = TT_ARGS(LoadedExecutable_Destroy);
  a.executable = exe_;
  call_ignoring_error(api, TT_FN(api, LoadedExecutable_Destroy), &a);
}

namespace {
// Small inline array of buffer pointers; spills to the heap past kInline.
class PtrArray {
 public:
  explicit PtrArray(size_t n) : data_(n <= kInline ? inline_ : (heap_.resize(n), heap_.data())) {
    for (size_t i = 0; i < n; ++i) data_[i] = nullptr;
  }
  PtrArray(const PtrArray&) = delete;
  PtrArray& operator=(const PtrArray&) = delete;
  PJRT_Buffer** data() { return data_; }
  PJRT_Buffer*& operator[](size_t i) { return data_[i]; }

 private:
  static constexpr size_t kInline = 16;
  PJRT_Buffer* inline_[kInline];
  std::vector<PJRT_Buffer*> heap_;
  PJRT_Buffer** data_;
};
}  // namespace

std::vector<BufferPtr> Executable::execute(std::span<Buffer* const> args, int device) {
  const PJRT_Api* api = client_->api();
  PtrArray in(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == nullptr) throw Error("execute: argument " + std::to_string(i) + " is null");
    in[i] = args[i]->raw();
  }
  PtrArray out(num_outputs_);
  PJRT_ExecuteOptions options{};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  PJRT_Buffer* const* arg_list = in.data();
  PJRT_Buffer** out_list = out.data();
  auto a = TT_ARGS(LoadedExecutable_Execute);
  a.executable = exe_;
  a.options = &options;
  a.argument_lists = &arg_list;
  a.num_devices = 1;
  a.num_args = args.size();
  a.output_lists = &out_list;
  // Compiled portable (see encode_compile_options), so any device can run it.
  a.execute_device = client_->device(device);
  TT_CALL(api, LoadedExecutable_Execute, a);  // Enqueues only; never awaited here.

  std::vector<BufferPtr> result;
  result.reserve(num_outputs_);
  size_t i = 0;
  try {
    for (; i < num_outputs_; ++i) result.push_back(wrap_output(client_, out[i]));
  } catch (...) {
    for (; i < num_outputs_; ++i) destroy_buffer(api, out[i]);
    throw;
  }
  return result;
}

std::vector<std::vector<BufferPtr>> Executable::execute_replicated(
    const std::vector<std::vector<Buffer*>>& args) {
  const PJRT_Api* api = client_->api();
  const size_t n = args.size();
  if (n == 0) throw Error("execute_replicated: no replicas");
  std::vector<std::vector<PJRT_Buffer*>> in(n, std::vector<PJRT_Buffer*>(args[0].size()));
  std::vector<std::vector<PJRT_Buffer*>> out(n, std::vector<PJRT_Buffer*>(num_outputs_));
  std::vector<PJRT_Buffer* const*> arg_lists(n);
  std::vector<PJRT_Buffer**> out_lists(n);
  for (size_t r = 0; r < n; ++r) {
    if (args[r].size() != args[0].size())
      throw Error("execute_replicated: replicas have different argument counts");
    for (size_t i = 0; i < args[r].size(); ++i) {
      if (args[r][i] == nullptr) throw Error("execute_replicated: a null argument");
      in[r][i] = args[r][i]->raw();
    }
    arg_lists[r] = in[r].data();
    out_lists[r] = out[r].data();
  }
  PJRT_ExecuteOptions options{};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  auto a = TT_ARGS(LoadedExecutable_Execute);
  a.executable = exe_;
  a.options = &options;
  a.argument_lists = arg_lists.data();
  a.num_devices = n;
  a.num_args = args[0].size();
  a.output_lists = out_lists.data();
  a.execute_device = nullptr;  // the compiled device assignment: replica i on device i
  TT_CALL(api, LoadedExecutable_Execute, a);

  std::vector<std::vector<BufferPtr>> result(n);
  size_t r = 0, i = 0;
  try {
    for (; r < n; ++r, i = 0)
      for (; i < num_outputs_; ++i) result[r].push_back(wrap_output(client_, out[r][i]));
  } catch (...) {
    for (; r < n; ++r, i = 0)
      for (; i < num_outputs_; ++i) destroy_buffer(api, out[r][i]);
    throw;
  }
  return result;
}

std::string Executable::serialize() const {
  const PJRT_Api* api = client_->api();
  ExecutableView view(api, exe_);
  auto a = TT_ARGS(Executable_Serialize);
  a.executable = view.get();
  TT_CALL(api, Executable_Serialize, a);
  std::string bytes(a.serialized_bytes, a.serialized_bytes_size);
  if (a.serialized_executable_deleter != nullptr) {
    a.serialized_executable_deleter(a.serialized_executable);
  }
  return bytes;
}

// ---------------------------------------------------------------------------
// Client

namespace {
std::vector<PJRT_NamedValue> to_named_values(const CreateOptions& options) {
  std::vector<PJRT_NamedValue> out;
  out.reserve(options.size());
  for (const auto& [name, value] : options) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = name.data();
    v.name_size = name.size();
    v.value_size = 1;
    if (const auto* i = std::get_if<int64_t>(&value)) {
      v.type = PJRT_NamedValue_kInt64;
      v.int64_value = *i;
    } else if (const auto* b = std::get_if<bool>(&value)) {
      v.type = PJRT_NamedValue_kBool;
      v.bool_value = *b;
    } else if (const auto* f = std::get_if<float>(&value)) {
      v.type = PJRT_NamedValue_kFloat;
      v.float_value = *f;
    } else {
      const std::string& s = std::get<std::string>(value);
      v.type = PJRT_NamedValue_kString;
      v.string_value = s.data();
      v.value_size = s.size();
    }
    out.push_back(v);
  }
  return out;
}
}  // namespace

std::shared_ptr<Client> Client::create(std::shared_ptr<Plugin> plugin, const CreateOptions& options,
                                       std::shared_ptr<KeyValueStore> kv) {
  if (plugin == nullptr) throw Error("Client::create: plugin is null; call Plugin::load first");
  static std::mutex mu;  // Plugins are not required to tolerate concurrent creation.
  std::lock_guard<std::mutex> lock(mu);
  const PJRT_Api* api = plugin->api();
  std::shared_ptr<Client> client(new Client());
  client->plugin_ = std::move(plugin);

  std::vector<PJRT_NamedValue> values = to_named_values(options);
  auto create = TT_ARGS(Client_Create);
  create.create_options = values.data();
  create.num_options = values.size();
  if (kv != nullptr) {
    create.kv_get_callback = &kv_get_trampoline;
    create.kv_get_user_arg = kv.get();
    create.kv_put_callback = &kv_put_trampoline;
    create.kv_put_user_arg = kv.get();
    create.kv_try_get_callback = &kv_try_get_trampoline;
    create.kv_try_get_user_arg = kv.get();
  }
  client->kv_ = std::move(kv);  // The plugin may call back while the client lives.
  try {
    TT_CALL(api, Client_Create, create);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // The stock CPU plugin lets a C++ exception escape on a mistyped option.
    throw Error(std::string("PJRT_Client_Create: plugin rejected the create options (") + e.what() +
                "); check option names and value types");
  }
  client->client_ = create.client;  // From here ~Client destroys it.

  auto name = TT_ARGS(Client_PlatformName);
  name.client = client->client_;
  TT_CALL(api, Client_PlatformName, name);
  client->platform_name_.assign(name.platform_name, name.platform_name_size);
  if (TT_FN(api, Client_PlatformVersion) != nullptr) {
    auto version = TT_ARGS(Client_PlatformVersion);
    version.client = client->client_;
    TT_CALL(api, Client_PlatformVersion, version);
    client->platform_version_.assign(version.platform_version, version.platform_version_size);
  }
  auto devs = TT_ARGS(Client_AddressableDevices);
  devs.client = client->client_;
  TT_CALL(api, Client_AddressableDevices, devs);
  client->devices_.assign(devs.addressable_devices,
                          devs.addressable_devices + devs.num_addressable_devices);
  if (client->devices_.empty()) {
    throw Error("PJRT client for platform '" + client->platform_name_ +
                "' has no addressable devices; check the plugin's device configuration");
  }
  return client;
}

Client::~Client() {
  if (client_ == nullptr) return;
  const PJRT_Api* api = plugin_->api();
  auto a = TT_ARGS(Client_Destroy);
  a.client = client_;
  call_ignoring_error(api, TT_FN(api, Client_Destroy), &a);
}

PJRT_Device* Client::device(int index) const {
  if (index < 0 || index >= static_cast<int>(devices_.size())) [[unlikely]] {
    throw Error("device index " + std::to_string(index) + " is out of range: the " +
                platform_name_ + " client has " + std::to_string(devices_.size()) +
                " addressable device(s)");
  }
  return devices_[static_cast<size_t>(index)];
}

int64_t Client::device_id(int index) const {
  const PJRT_Api* api = plugin_->api();
  auto d = TT_ARGS(Device_GetDescription);
  d.device = device(index);
  TT_CALL(api, Device_GetDescription, d);
  auto a = TT_ARGS(DeviceDescription_Id);
  a.device_description = d.device_description;
  TT_CALL(api, DeviceDescription_Id, a);
  return a.id;
}

bool Client::dma_map(void* data, size_t size) noexcept {
  const PJRT_Api* api = plugin_->api();
  auto* fn = TT_FN(api, Client_DmaMap);
  if (fn == nullptr) return false;
  auto a = TT_ARGS(Client_DmaMap);
  a.client = client_;
  a.data = data;
  a.size = size;
  if (PJRT_Error* err = fn(&a)) {
    destroy_error(api, err);
    return false;
  }
  return true;
}

void Client::dma_unmap(void* data) noexcept {
  const PJRT_Api* api = plugin_->api();
  auto a = TT_ARGS(Client_DmaUnmap);
  a.client = client_;
  a.data = data;
  call_ignoring_error(api, TT_FN(api, Client_DmaUnmap), &a);
}

BufferPtr Client::buffer_from_host(const void* data, DType dtype, std::span<const int64_t> dims,
                                   int device) {
  const PJRT_Api* api = plugin_->api();
  auto a = TT_ARGS(Client_BufferFromHostBuffer);
  a.client = client_;
  a.data = data;
  a.type = to_pjrt(dtype);
  a.dims = dims.data();
  a.num_dims = dims.size();
  a.byte_strides = nullptr;  // Dense row-major.
  a.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  a.device = this->device(device);
  TT_CALL(api, Client_BufferFromHostBuffer, a);
  Event done(api, a.done_with_host_buffer);
  BufferPtr buf;
  try {
    buf = std::make_shared<Buffer>(shared_from_this(), a.buffer, dtype,
                                   std::vector<int64_t>(dims.begin(), dims.end()));
  } catch (...) {
    destroy_buffer(api, a.buffer);
    throw;
  }
  // The caller may free `data` once we return.
  done.await("PJRT_Event_Await (PJRT_Client_BufferFromHostBuffer)");
  return buf;
}

ExecutablePtr Client::compile(const std::string& mlir, const CompileOptions& options) {
  const PJRT_Api* api = plugin_->api();
  std::string opts = encode_compile_options(options);
  static constexpr char kFormat[] = "mlir";
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  program.code = const_cast<char*>(mlir.data());  // Only read by the plugin.
  program.code_size = mlir.size();
  program.format = kFormat;
  program.format_size = sizeof(kFormat) - 1;
  auto a = TT_ARGS(Client_Compile);
  a.client = client_;
  a.program = &program;
  a.compile_options = opts.data();
  a.compile_options_size = opts.size();
  TT_CALL(api, Client_Compile, a);
  return std::make_shared<Executable>(shared_from_this(), a.executable);
}

ExecutablePtr Client::deserialize(const std::string& bytes, const CompileOptions& options) {
  const PJRT_Api* api = plugin_->api();
  std::string opts = encode_compile_options(options);
  auto a = TT_ARGS(Executable_DeserializeAndLoad);
  a.client = client_;
  a.serialized_executable = bytes.data();
  a.serialized_executable_size = bytes.size();
  a.overridden_serialized_compile_options = opts.data();
  a.overridden_serialized_compile_options_size = opts.size();
  TT_CALL(api, Executable_DeserializeAndLoad, a);
  return std::make_shared<Executable>(shared_from_this(), a.loaded_executable);
}

// ---------------------------------------------------------------------------
// CompileOptionsProto

std::string encode_compile_options(const CompileOptions& options) {
  if (options.num_replicas < 1 || options.num_partitions < 1) {
    throw Error("CompileOptions: num_replicas and num_partitions must be >= 1 (got " +
                std::to_string(options.num_replicas) + ", " +
                std::to_string(options.num_partitions) + ")");
  }
  std::string build;                                               // ExecutableBuildOptionsProto
  put_varint_field(build, 1, static_cast<uint64_t>(int64_t{-1}));  // device_ordinal: unpinned.
  put_varint_field(build, 4, static_cast<uint64_t>(options.num_replicas));
  put_varint_field(build, 5, static_cast<uint64_t>(options.num_partitions));
  if (!options.replica_devices.empty()) {
    if (options.num_partitions != 1 ||
        options.replica_devices.size() != static_cast<size_t>(options.num_replicas))
      throw Error("CompileOptions: " + std::to_string(options.replica_devices.size()) +
                  " replica devices for " + std::to_string(options.num_replicas) +
                  " replicas of 1 partition");
    std::string ids;  // packed repeated int64 replica_device_ids
    for (int64_t id : options.replica_devices) put_varint(ids, static_cast<uint64_t>(id));
    std::string computation;  // DeviceAssignmentProto.ComputationDevice
    put_bytes_field(computation, 1, ids);
    std::string assignment;  // DeviceAssignmentProto
    put_varint_field(assignment, 1, static_cast<uint64_t>(options.num_replicas));
    put_varint_field(assignment, 2, 1);
    put_bytes_field(assignment, 3, computation);
    put_bytes_field(build, 9, assignment);
  }
  std::string out;  // CompileOptionsProto
  put_bytes_field(out, 3, build);
  // Single-device programs are compiled portable: one executable then runs on
  // any device chosen per call via PJRT_LoadedExecutable_Execute_Args.execute_device.
  if (options.num_replicas == 1 && options.num_partitions == 1) put_varint_field(out, 4, 1);
  // env_option_overrides (field 7): map<string, OptionOverrideProto>, one
  // entry (key = 1, value = 2) per override; the plugin applies them to the
  // DebugOptions it derives from XLA_FLAGS.
  for (const OptionOverride& o : options.overrides) {
    std::string value;  // OptionOverrideProto: a oneof of string/bool/int/double
    if (const auto* s = std::get_if<std::string>(&o.value)) {
      put_bytes_field(value, 1, *s);
    } else if (const auto* b = std::get_if<bool>(&o.value)) {
      put_varint_field(value, 2, *b ? 1 : 0);
    } else if (const auto* i = std::get_if<int64_t>(&o.value)) {
      put_varint_field(value, 3, static_cast<uint64_t>(*i));
    } else {
      double d = std::get<double>(o.value);
      put_varint(value, (4 << 3) | 1);  // Wire type 1: 64-bit.
      value.append(reinterpret_cast<const char*>(&d), sizeof d);
    }
    std::string entry;
    put_bytes_field(entry, 1, o.name);
    put_bytes_field(entry, 2, value);
    put_bytes_field(out, 7, entry);
  }
  return out;
}

}  // namespace torchtpu::pjrt
