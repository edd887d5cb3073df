// PJRT C API runtime: plugin loading, client, buffers, executables.
// Knows nothing of torch or Python. Every failure throws pjrt::Error.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/dtype.h"

struct PJRT_Api;
struct PJRT_Client;
struct PJRT_Buffer;
struct PJRT_LoadedExecutable;
struct PJRT_Device;

namespace torchtpu::pjrt {

// A failure reported by the plugin or by this layer. `what()` carries the
// plugin's own message, prefixed with the PJRT call that failed.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg, int code = 0) : std::runtime_error(msg), code_(code) {}
  int code() const { return code_; }  // PJRT_Error_Code, 0 when not from the plugin

 private:
  int code_;
};

// Resolves the plugin path: TORCHTPU_PJRT_PLUGIN, else TORCHTPU_PLATFORM
// (cpu|cuda|tpu, default cpu) searched in the given site-packages dirs.
// Throws Error with an install hint when nothing is found.
std::string find_plugin(const std::vector<std::string>& search_dirs);

// Makes the NVIDIA libraries a CUDA plugin dlopens by soname (cudart, cublas,
// cudnn, nccl, ...) loadable: each one not already loaded is opened RTLD_GLOBAL
// from the pip `nvidia/*/lib` folders under `site_dirs` (and the plugin's own
// site-packages), else from the system search path. Throws Error naming what is
// missing when the driver (libcuda.so.1) or a required library cannot be found.
// Returns one line per library: "<soname> <path or 'already loaded'>".
std::vector<std::string> preload_cuda_libraries(const std::string& plugin_path,
                                                const std::vector<std::string>& site_dirs);

using OptionValue = std::variant<int64_t, bool, float, std::string>;
using CreateOptions = std::map<std::string, OptionValue>;

// A loaded plugin (dlopen once per path, never closed, initialized once).
class Plugin {
 public:
  static std::shared_ptr<Plugin> load(const std::string& path);
  const PJRT_Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  int api_major() const;
  int api_minor() const;
  // PJRT_Plugin_Attributes as strings (xla_version, stablehlo_current_version, ...).
  const std::map<std::string, std::string>& attributes() const { return attributes_; }

 private:
  Plugin() = default;
  const PJRT_Api* api_ = nullptr;
  std::string path_;
  std::map<std::string, std::string> attributes_;
};

class Client;

// Thrown by KeyValueStore::get when the key did not appear in time.
class KvTimeout : public Error {
 public:
  using Error::Error;
};

// A store shared by all processes of a job, handed to the plugin at client
// creation (multi-process GPU clients exchange their topology through it).
// Thread-safe. Exceptions thrown here reach the plugin as PJRT errors.
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual void put(std::string_view key, std::string_view value) = 0;
  // Blocks until `key` exists; throws KvTimeout after `timeout`.
  virtual std::string get(std::string_view key, std::chrono::milliseconds timeout) = 0;
  // The value, or nullopt at once when the key does not exist.
  virtual std::optional<std::string> try_get(std::string_view key) = 0;
};

// The C callbacks given to the plugin, called exactly as a plugin calls them
// (PJRT_KeyValue*Callback_Args with a callback_error that builds the error).
// Failures come back as Error with the PJRT code the callback reported. For
// tests: the CPU plugin never calls the callbacks itself.
std::string kv_callback_get(KeyValueStore& store, const std::string& key, int timeout_ms);
std::optional<std::string> kv_callback_try_get(KeyValueStore& store, const std::string& key);
void kv_callback_put(KeyValueStore& store, const std::string& key, const std::string& value);

// An immutable device array. Destroyed (PJRT_Buffer_Destroy) with the last owner.
//
// A placeholder (Buffer::placeholder) knows its type before the execution
// that produces it was enqueued: the runtime hands it out while the program
// still compiles, and fills it (or fails it) later. raw() and everything that
// reads the array wait until then.
class Buffer {
 public:
  Buffer(std::shared_ptr<Client> client, PJRT_Buffer* buf, DType dtype, std::vector<int64_t> dims);
  static std::shared_ptr<Buffer> placeholder(std::shared_ptr<Client> client, DType dtype,
                                             std::vector<int64_t> dims);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(dtype_); }
  // The PJRT buffer; a placeholder waits until filled (throws Error if it failed).
  PJRT_Buffer* raw() const {
    PJRT_Buffer* b = buf_.load(std::memory_order_acquire);
    return b ? b : wait_filled();
  }

  // A placeholder takes `produced`'s PJRT buffer (same type and dims), or
  // records why it never will; either wakes its waiters. Once only.
  void fill(Buffer& produced);
  void fail(const std::string& why);
  // False for a placeholder not yet filled or failed.
  bool filled() const;
  // Holders that are queued runs, each handed to PJRT before any run launched
  // after it: they do not keep the buffer from being donated to a later run.
  int queued_uses() const { return queued_uses_.load(std::memory_order_acquire); }
  void add_queued_uses(int n) const { queued_uses_.fetch_add(n, std::memory_order_acq_rel); }

  // Blocks until the buffer's producer finished; throws the execution's error if it failed.
  void await_ready() const;
  // If this buffer dies before its producer finished, its ready event is kept:
  // await_dropped_producers() and await_dropped_producer(ticket) still wait for
  // that producer (a run whose outputs were all dropped). Returns the ticket,
  // unique in the process and never 0; watching again returns the same one.
  uint64_t watch() const;
  // True when the producer finished (successfully or not); does not block.
  bool is_ready() const;
  // Blocking copy of the whole buffer to host memory (row-major, dst_bytes == nbytes()).
  void to_host(void* dst, size_t dst_bytes) const;
  // Reads of at most this many bytes from an XLA:CPU buffer copy it in place.
  static constexpr size_t kDirectReadBytes = 64 << 10;
  // How many reads did (process-wide).
  static int64_t direct_host_reads();
  // A copy on another device of the same client (PJRT_Buffer_CopyToDevice: a
  // device-to-device transfer where the plugin has one); asynchronous.
  std::shared_ptr<Buffer> copy_to_device(int device) const;

 private:
  struct Pending;
  PJRT_Buffer* wait_filled() const;

  std::shared_ptr<Client> client_;
  std::atomic<PJRT_Buffer*> buf_;
  DType dtype_;
  std::vector<int64_t> dims_;
  std::unique_ptr<Pending> pending_;  // placeholders only
  mutable std::atomic<int> queued_uses_{0};
  mutable std::atomic<uint64_t> ticket_{0};  // 0: not watched
};
using BufferPtr = std::shared_ptr<Buffer>;

// Waits for the producers of all watched buffers that died unfinished; returns
// how many it waited for. Their errors go with their values.
size_t await_dropped_producers();
// Waits for the producer of the watched buffer with this ticket if that buffer
// died before its producer finished; returns whether there was one to wait for.
// Other kept producers are not waited for.
bool await_dropped_producer(uint64_t ticket);

// One XLA DebugOptions field set for a single compile (by its proto field
// name, e.g. "xla_backend_optimization_level"), on top of XLA_FLAGS.
struct OptionOverride {
  std::string name;
  std::variant<std::string, bool, int64_t, double> value;
};

struct CompileOptions {
  int num_replicas = 1;
  int num_partitions = 1;
  std::vector<OptionOverride> overrides;
  // PJRT device ids, one per replica (Client::device_id): replica r runs on
  // replica_devices[r]. Empty: the plugin's default, replica i on device i.
  std::vector<int64_t> replica_devices;
};

class Executable {
 public:
  Executable(std::shared_ptr<Client> client, PJRT_LoadedExecutable* exe);
  ~Executable();
  Executable(const Executable&) = delete;
  Executable& operator=(const Executable&) = delete;

  size_t num_outputs() const { return num_outputs_; }
  // Asynchronous: returns output buffers at once; errors of the run surface
  // from Buffer::await_ready / to_host. Arguments must live on `device`.
  std::vector<BufferPtr> execute(std::span<Buffer* const> args, int device);
  // A program compiled with num_replicas = args.size(): replica i runs on
  // its assigned device (device i by default) with args[i]; returns each
  // replica's outputs.
  std::vector<std::vector<BufferPtr>> execute_replicated(
      const std::vector<std::vector<Buffer*>>& args);
  // PJRT_Executable_Serialize bytes (valid for the same plugin build only).
  std::string serialize() const;
  PJRT_LoadedExecutable* raw() const { return exe_; }

 private:
  std::shared_ptr<Client> client_;
  PJRT_LoadedExecutable* exe_;
  size_t num_outputs_ = 0;
  std::vector<DType> out_dtypes_;
  std::vector<std::vector<int64_t>> out_dims_;
};
using ExecutablePtr = std::shared_ptr<Executable>;

class Client : public std::enable_shared_from_this<Client> {
 public:
  // `kv` (optional) is passed as the kv_get/kv_put/kv_try_get callbacks and
  // kept alive as long as the client.
  static std::shared_ptr<Client> create(std::shared_ptr<Plugin> plugin,
                                        const CreateOptions& options,
                                        std::shared_ptr<KeyValueStore> kv = nullptr);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Plugin& plugin() const { return *plugin_; }
  const PJRT_Api* api() const { return plugin_->api(); }
  PJRT_Client* raw() const { return client_; }
  int device_count() const { return static_cast<int>(devices_.size()); }  // addressable
  PJRT_Device* device(int index) const;  // throws Error on a bad index
  int64_t device_id(int index) const;    // the device's global PJRT id
  const std::string& platform_name() const { return platform_name_; }
  const std::string& platform_version() const { return platform_version_; }

  // Registers host memory for direct device transfers (page-locks it on GPU
  // plugins). False when the plugin lacks PJRT_Client_DmaMap or refuses.
  bool dma_map(void* data, size_t size) noexcept;
  void dma_unmap(void* data) noexcept;
  // Copies host data into a new device buffer (host memory may be freed on return).
  BufferPtr buffer_from_host(const void* data, DType dtype, std::span<const int64_t> dims,
                             int device);
  // Compiles StableHLO text (program format "mlir").
  ExecutablePtr compile(const std::string& mlir, const CompileOptions& options = {});
  ExecutablePtr deserialize(const std::string& bytes, const CompileOptions& options = {});

 private:
  Client() = default;
  std::shared_ptr<Plugin> plugin_;
  std::shared_ptr<KeyValueStore> kv_;
  PJRT_Client* client_ = nullptr;
  std::vector<PJRT_Device*> devices_;
  std::string platform_name_, platform_version_;
};
using ClientPtr = std::shared_ptr<Client>;

// Serialized xla.CompileOptionsProto (hand-encoded varints), exposed for tests.
std::string encode_compile_options(const CompileOptions& options);

}  // namespace torchtpu::pjrt
