// PJRT C API runtime: see pjrt.h. Everything here talks to the plugin through
// the PJRT_Api function table; no XLA headers or libraries are linked. This
// file: clients, executables and key-value callbacks; plugin.cpp loads the
// plugin, buffer.cpp holds buffers, call.h the calling convention.
#include "pjrt/pjrt.h"

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>

#include "pjrt/call.h"

namespace torchtpu::pjrt {

using namespace detail;

namespace {

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
