// Tests of the PJRT runtime layer against the stock CPU plugin.
#include "pjrt/pjrt.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pjrt/tuning.h"

namespace torchtpu::pjrt {
namespace {

const char kCpuRelPath[] = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so";

// Sets (or unsets, for nullopt) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::vector<std::string> site_dirs() { return {TORCHTPU_SITE_PACKAGES}; }
std::string cpu_plugin_path() { return std::string(TORCHTPU_SITE_PACKAGES) + "/" + kCpuRelPath; }

// Message of the pjrt::Error thrown by `fn`, failing the test if none is.
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected pjrt::Error";
  return "";
}

// One 2-device CPU client shared by the tests of this process.
ClientPtr cpu_client() {
  static ClientPtr client = [] {
    ScopedEnv a("TORCHTPU_PJRT_PLUGIN", std::nullopt);
    ScopedEnv b("TORCHTPU_PLATFORM", std::nullopt);
    return Client::create(Plugin::load(find_plugin(site_dirs())),
                          {{"cpu_device_count", int64_t{2}}});
  }();
  return client;
}

const char kAddProgram[] = R"(module {
  func.func public @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {
    %0 = stablehlo.add %a, %b : tensor<2xf32>
    return %0 : tensor<2xf32>
  }
})";

std::vector<float> to_floats(const Buffer& buf) {
  std::vector<float> out(static_cast<size_t>(buf.numel()));
  buf.to_host(out.data(), out.size() * sizeof(float));
  return out;
}

// ---------------------------------------------------------------------------
// Plugin discovery and loading.

TEST(PjrtPlugin, FindsCpuPluginByDefault) {
  ScopedEnv a("TORCHTPU_PJRT_PLUGIN", std::nullopt);
  ScopedEnv b("TORCHTPU_PLATFORM", std::nullopt);
  std::string path = find_plugin({"/nonexistent-dir", TORCHTPU_SITE_PACKAGES});
  EXPECT_EQ(std::filesystem::path(path), std::filesystem::path(cpu_plugin_path()));
}

TEST(PjrtPlugin, EnvOverrideWins) {
  ScopedEnv a("TORCHTPU_PJRT_PLUGIN", cpu_plugin_path());
  ScopedEnv b("TORCHTPU_PLATFORM", "tpu");  // Ignored when the path is explicit.
  EXPECT_EQ(find_plugin({}), cpu_plugin_path());
}

TEST(PjrtPlugin, EnvOverrideMustExist) {
  ScopedEnv a("TORCHTPU_PJRT_PLUGIN", "/nonexistent/plugin.so");
  std::string msg = error_of([] { find_plugin(site_dirs()); });
  EXPECT_NE(msg.find("/nonexistent/plugin.so"), std::string::npos) << msg;
}

TEST(PjrtPlugin, MissingPluginNamesSearchedPathsAndInstallHint) {
  ScopedEnv a("TORCHTPU_PJRT_PLUGIN", std::nullopt);
  struct Case {
    const char* platform;
    const char* rel_path;
    const char* hint;
  };
  for (const Case& c :
       {Case{"cpu", kCpuRelPath, "pip install xla-cpu-pjrt==0.0.1"},
        Case{"cuda", "jax_plugins/xla_cuda13/xla_cuda_plugin.so", "pip install jax-cuda13-pjrt"},
        Case{"tpu", "libtpu/libtpu.so", "pip install libtpu"}}) {
    ScopedEnv b("TORCHTPU_PLATFORM", c.platform);
    std::string msg = error_of([] { find_plugin({"/nonexistent-dir"}); });
    EXPECT_NE(msg.find(c.hint), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string("/nonexistent-dir/") + c.rel_path), std::string::npos) << msg;
  }
}

TEST(PjrtPlugin, UnknownPlatformIsAnError) {
  ScopedEnv a("TORCHTPU_PJRT_PLUGIN", std::nullopt);
  ScopedEnv b("TORCHTPU_PLATFORM", "rocm");
  std::string msg = error_of([] { find_plugin(site_dirs()); });
  EXPECT_NE(msg.find("'rocm'"), std::string::npos) << msg;
}

TEST(PjrtPlugin, LoadIsCachedAndReportsVersionAndAttributes) {
  auto plugin = Plugin::load(cpu_plugin_path());
  EXPECT_EQ(plugin.get(), Plugin::load(cpu_plugin_path()).get());
  EXPECT_EQ(plugin->api_major(), 0);
  EXPECT_GT(plugin->api_minor(), 0);
  EXPECT_EQ(plugin->path(), cpu_plugin_path());
  for (const auto& [k, v] : plugin->attributes())
    std::printf("  attribute %s = %s\n", k.c_str(), v.c_str());
  EXPECT_TRUE(plugin->attributes().count("stablehlo_current_version"));
}

TEST(PjrtPlugin, LoadOfNonPluginFails) {
  std::string msg = error_of([] { Plugin::load("/nonexistent/libnothing.so"); });
  EXPECT_NE(msg.find("/nonexistent/libnothing.so"), std::string::npos) << msg;
  msg = error_of([] { Plugin::load("libm.so.6"); });  // A library, but not a plugin.
  EXPECT_NE(msg.find("GetPjrtApi"), std::string::npos) << msg;
}

TEST(PjrtPlugin, WrongMajorVersionIsRejectedWithBothVersions) {
  const int major = Plugin::load(find_plugin({TORCHTPU_SITE_PACKAGES}))->api_major();
  std::string msg = error_of([] { Plugin::load(TORCHTPU_FAKE_PLUGIN); });
  EXPECT_NE(msg.find("implements PJRT C API " + std::to_string(major + 1) + ".3"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("built against " + std::to_string(major) + "."), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------
// Client and buffers.

TEST(PjrtClient, CreatesRequestedDeviceCount) {
  ClientPtr client = cpu_client();
  EXPECT_EQ(client->device_count(), 2);
  EXPECT_EQ(client->platform_name(), "cpu");
  EXPECT_NE(client->device(0), client->device(1));
}

TEST(PjrtClient, BadDeviceIndexThrows) {
  ClientPtr client = cpu_client();
  std::string msg = error_of([&] { client->device(2); });
  EXPECT_NE(msg.find("device index 2"), std::string::npos) << msg;
  error_of([&] { client->device(-1); });
  float x = 1;
  error_of([&] { client->buffer_from_host(&x, DType::F32, {}, 7); });
}

TEST(PjrtClient, MistypedCreateOptionIsAnError) {
  // "cpu_device_count" must be an int64; the plugin rejects a string.
  auto plugin = Plugin::load(cpu_plugin_path());
  std::string msg = error_of([&] {
    Client::create(plugin, {{"cpu_device_count", std::string("two")}});
  });
  EXPECT_EQ(msg.rfind("PJRT_Client_Create: ", 0), 0u) << msg;
}

template <class T>
void expect_round_trip(DType dtype, const std::vector<T>& values, std::vector<int64_t> dims,
                       int device) {
  ClientPtr client = cpu_client();
  BufferPtr buf = client->buffer_from_host(values.data(), dtype, dims, device);
  EXPECT_EQ(buf->dtype(), dtype);
  EXPECT_EQ(buf->dims(), dims);
  EXPECT_EQ(buf->nbytes(), values.size() * sizeof(T));
  buf->await_ready();
  EXPECT_TRUE(buf->is_ready());
  std::vector<T> back(values.size());
  buf->to_host(back.data(), back.size() * sizeof(T));
  EXPECT_EQ(std::memcmp(back.data(), values.data(), values.size() * sizeof(T)), 0);
}

TEST(PjrtBuffer, RoundTripF32) {
  expect_round_trip<float>(DType::F32, {1.5f, -2.f, 3.25f, 0.f, 1e30f, -0.f}, {2, 3}, 0);
}
TEST(PjrtBuffer, RoundTripI64) {
  expect_round_trip<int64_t>(DType::I64, {INT64_MIN, -1, 0, INT64_MAX}, {4}, 1);
}
TEST(PjrtBuffer, RoundTripBool) {
  expect_round_trip<uint8_t>(DType::Bool, {1, 0, 0, 1, 1, 0, 1, 1}, {2, 2, 2}, 0);
}
TEST(PjrtBuffer, RoundTripBf16) {
  // bf16 bit patterns of 1.0, -2.0, 0.5, inf.
  expect_round_trip<uint16_t>(DType::BF16, {0x3f80, 0xc000, 0x3f00, 0x7f80}, {4}, 1);
}
TEST(PjrtBuffer, RoundTripScalarAndEmpty) {
  expect_round_trip<double>(DType::F64, {3.5}, {}, 0);
  expect_round_trip<int32_t>(DType::I32, {}, {0, 3}, 1);
}

TEST(PjrtBuffer, ToHostRejectsWrongSize) {
  float x[2] = {1, 2};
  BufferPtr buf = cpu_client()->buffer_from_host(x, DType::F32, std::vector<int64_t>{2}, 0);
  std::string msg = error_of([&] { buf->to_host(x, 4); });
  EXPECT_NE(msg.find("8"), std::string::npos) << msg;
}

// A placeholder stands for a buffer not produced yet: readers wait for fill(),
// and a failed one throws its reason to every reader.
TEST(PjrtBuffer, PlaceholderWaitsForFillOrFails) {
  ClientPtr client = cpu_client();
  float x[2] = {3, 4};
  std::vector<int64_t> dims = {2};
  BufferPtr ph = Buffer::placeholder(client, DType::F32, dims);
  EXPECT_FALSE(ph->filled());
  EXPECT_FALSE(ph->is_ready());
  std::vector<float> seen;
  std::thread reader([&] { seen = to_floats(*ph); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BufferPtr made = client->buffer_from_host(x, DType::F32, dims, 0);
  ph->fill(*made);
  reader.join();
  EXPECT_EQ(seen, (std::vector<float>{3, 4}));
  EXPECT_TRUE(ph->filled());
  EXPECT_NE(error_of([&] { made->raw(); }).find("given away"), std::string::npos);

  BufferPtr wrong = Buffer::placeholder(client, DType::F32, {3});
  BufferPtr other = client->buffer_from_host(x, DType::F32, dims, 0);
  wrong->fill(*other);  // a type mismatch fails the placeholder, not the caller
  EXPECT_NE(error_of([&] { wrong->await_ready(); }).find("expected"), std::string::npos);

  BufferPtr failed = Buffer::placeholder(client, DType::F32, dims);
  failed->fail("[tpu] aten::mm: compile failed: boom");
  EXPECT_TRUE(failed->filled());
  EXPECT_NE(error_of([&] { to_floats(*failed); }).find("boom"), std::string::npos);
}

// ---------------------------------------------------------------------------
// Executables.

void expect_add_runs_on(Executable& exe, int device) {
  ClientPtr client = cpu_client();
  float a[2] = {1, 2}, b[2] = {10, 20};
  std::vector<int64_t> dims = {2};
  BufferPtr ba = client->buffer_from_host(a, DType::F32, dims, device);
  BufferPtr bb = client->buffer_from_host(b, DType::F32, dims, device);
  Buffer* args[] = {ba.get(), bb.get()};
  std::vector<BufferPtr> out = exe.execute(args, device);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]->dtype(), DType::F32);
  EXPECT_EQ(out[0]->dims(), dims);
  EXPECT_EQ(to_floats(*out[0]), (std::vector<float>{11, 22})) << "device " << device;
}

// XLA:CPU's buffers are host memory: a read of at most kDirectReadBytes from a
// rank <= 1 buffer copies it in place; others go through PJRT_Buffer_ToHostBuffer.
// Both give the buffer's bytes.
int64_t direct_reads_of(const std::vector<float>& values, const std::vector<int64_t>& dims) {
  BufferPtr buf = cpu_client()->buffer_from_host(values.data(), DType::F32, dims, 1);
  const int64_t before = Buffer::direct_host_reads();
  EXPECT_EQ(to_floats(*buf), values);
  return Buffer::direct_host_reads() - before;
}

TEST(PjrtBuffer, SmallCpuReadsCopyInPlace) {
  EXPECT_EQ(direct_reads_of({2.5f}, {}), 1);
  EXPECT_EQ(direct_reads_of({1, -2, 3, 4}, {4}), 1);
  EXPECT_EQ(direct_reads_of({1, -2, 3, 4}, {2, 2}), 0);
  std::vector<float> big(Buffer::kDirectReadBytes / sizeof(float) + 1, 7.f);
  EXPECT_EQ(direct_reads_of(big, {static_cast<int64_t>(big.size())}), 0);
  // An execution's output, read at once: the read waits for it.
  ExecutablePtr exe = cpu_client()->compile(kAddProgram);
  const int64_t before = Buffer::direct_host_reads();
  expect_add_runs_on(*exe, 1);
  EXPECT_EQ(Buffer::direct_host_reads() - before, 1);
}

// A [1200, 1200] matmul: its output is not ready right after launch.
const char kSlowProgram[] = R"(module {
  func.func public @main(%a: tensor<1200x1200xf32>) -> tensor<1200x1200xf32> {
    %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<1200x1200xf32>, tensor<1200x1200xf32>) -> tensor<1200x1200xf32>
    return %0 : tensor<1200x1200xf32>
  }
})";

// kSlowProgram compiled, its input, and no dropped producer left from earlier tests.
struct SlowRuns {
  ClientPtr client = cpu_client();
  ExecutablePtr exe = client->compile(kSlowProgram);
  BufferPtr input = [this] {
    std::vector<float> a(1200 * 1200, 0.5f);
    std::vector<int64_t> dims = {1200, 1200};
    return client->buffer_from_host(a.data(), DType::F32, dims, 0);
  }();
  SlowRuns() { await_dropped_producers(); }
};

// synchronize() relies on this: a run whose outputs were all dropped can
// still be awaited through its watched output.
TEST(PjrtBuffer, DroppedWatchedOutputsProducerIsAwaited) {
  SlowRuns slow;
  Buffer* args[] = {slow.input.get()};
  ExecutablePtr exe = slow.exe;
  std::vector<BufferPtr> out = exe->execute(args, 0);
  out[0]->watch();
  ASSERT_FALSE(out[0]->is_ready());
  out.clear();
  EXPECT_EQ(await_dropped_producers(), 1u);
  EXPECT_EQ(await_dropped_producers(), 0u);
  // A finished producer leaves nothing to wait for; an unwatched one is not kept.
  out = exe->execute(args, 0);
  out[0]->await_ready();
  out[0]->watch();
  out = exe->execute(args, 0);
  EXPECT_EQ(await_dropped_producers(), 0u);
  out.clear();
  EXPECT_EQ(await_dropped_producers(), 0u);
}

// The in-flight bound waits for one run by its output's ticket: a run that had
// finished when its output died leaves nothing, and another run's kept producer
// is not waited for in its place.
TEST(PjrtBuffer, DroppedProducerIsAwaitedByItsTicket) {
  SlowRuns slow;
  Buffer* args[] = {slow.input.get()};
  ExecutablePtr exe = slow.exe;
  std::vector<BufferPtr> done = exe->execute(args, 0);
  const uint64_t done_ticket = done[0]->watch();
  EXPECT_EQ(done[0]->watch(), done_ticket);
  done[0]->await_ready();
  done.clear();
  std::vector<BufferPtr> first = exe->execute(args, 0), second = exe->execute(args, 0);
  const uint64_t t1 = first[0]->watch(), t2 = second[0]->watch();
  EXPECT_NE(t1, t2);
  EXPECT_NE(t1, done_ticket);
  BufferPtr later = exe->execute(args, 0)[0];  // queued behind both, kept alive
  ASSERT_FALSE(first[0]->is_ready());
  first.clear();
  second.clear();
  EXPECT_FALSE(await_dropped_producer(done_ticket));
  EXPECT_TRUE(await_dropped_producer(t2));
  EXPECT_FALSE(await_dropped_producer(t2));
  EXPECT_EQ(await_dropped_producers(), 1u);  // t1's, still kept
  EXPECT_FALSE(await_dropped_producer(t1));
  later->await_ready();
}

TEST(PjrtExecutable, AddRunsOnDevice0And1) {
  ExecutablePtr exe = cpu_client()->compile(kAddProgram);
  EXPECT_EQ(exe->num_outputs(), 1u);
  expect_add_runs_on(*exe, 0);
  expect_add_runs_on(*exe, 1);
  expect_add_runs_on(*exe, 0);
}

TEST(PjrtExecutable, MultipleOutputsKeepTheirTypes) {
  const char* program = R"(module {
  func.func public @main(%a: tensor<3xi32>) -> (tensor<3xi32>, tensor<3xi1>, tensor<i32>) {
    %0 = stablehlo.multiply %a, %a : tensor<3xi32>
    %1 = stablehlo.compare GT, %a, %0 : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi1>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %2 = stablehlo.reduce(%a init: %c) applies stablehlo.add across dimensions = [0]
        : (tensor<3xi32>, tensor<i32>) -> tensor<i32>
    return %0, %1, %2 : tensor<3xi32>, tensor<3xi1>, tensor<i32>
  }
})";
  ClientPtr client = cpu_client();
  ExecutablePtr exe = client->compile(program);
  ASSERT_EQ(exe->num_outputs(), 3u);
  int32_t a[3] = {-1, 0, 3};
  BufferPtr ba = client->buffer_from_host(a, DType::I32, std::vector<int64_t>{3}, 1);
  Buffer* args[] = {ba.get()};
  std::vector<BufferPtr> out = exe->execute(args, 1);
  ASSERT_EQ(out.size(), 3u);
  int32_t sq[3];
  out[0]->to_host(sq, sizeof(sq));
  EXPECT_EQ(std::vector<int32_t>(sq, sq + 3), (std::vector<int32_t>{1, 0, 9}));
  EXPECT_EQ(out[1]->dtype(), DType::Bool);
  uint8_t gt[3];
  out[1]->to_host(gt, sizeof(gt));
  EXPECT_EQ(std::vector<uint8_t>(gt, gt + 3), (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_TRUE(out[2]->dims().empty());
  int32_t sum = 0;
  out[2]->to_host(&sum, sizeof(sum));
  EXPECT_EQ(sum, 2);
}

TEST(PjrtExecutable, CompileErrorCarriesPluginMessage) {
  const char* bad = "module { func.func @main() -> tensor<2xf32> { %0 = stablehlo.bogus } }";
  try {
    cpu_client()->compile(bad);
    FAIL() << "compile of an invalid program succeeded";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(msg.rfind("PJRT_Client_Compile: ", 0), 0u) << msg;
    EXPECT_GT(msg.size(), std::strlen("PJRT_Client_Compile: ") + 10) << msg;
    EXPECT_NE(e.code(), 0) << msg;
  }
}

TEST(PjrtExecutable, BadArgumentsCarryPluginMessage) {
  ClientPtr client = cpu_client();
  ExecutablePtr exe = client->compile(kAddProgram);
  float a[2] = {1, 2};
  std::vector<int64_t> dims = {2};
  BufferPtr on0 = client->buffer_from_host(a, DType::F32, dims, 0);
  BufferPtr on1 = client->buffer_from_host(a, DType::F32, dims, 1);
  Buffer* one_arg[] = {on0.get()};
  std::string msg = error_of([&] { exe->execute(one_arg, 0); });
  EXPECT_EQ(msg.rfind("PJRT_LoadedExecutable_Execute: ", 0), 0u) << msg;
  // Arguments must already live on the executing device.
  Buffer* mixed[] = {on0.get(), on1.get()};
  msg = error_of([&] { exe->execute(mixed, 1); });
  EXPECT_EQ(msg.rfind("PJRT_LoadedExecutable_Execute: ", 0), 0u) << msg;
  Buffer* null_arg[] = {on0.get(), nullptr};
  error_of([&] { exe->execute(null_arg, 0); });
  error_of([&] { exe->execute(mixed, 2); });
}

TEST(PjrtClient, BuffersAndExecutablesKeepTheClientAlive) {
  BufferPtr buf;
  ExecutablePtr exe;
  {
    ClientPtr client =
        Client::create(Plugin::load(cpu_plugin_path()), {{"cpu_device_count", int64_t{1}}});
    EXPECT_EQ(client->device_count(), 1);
    float a[2] = {4, 5};
    buf = client->buffer_from_host(a, DType::F32, std::vector<int64_t>{2}, 0);
    exe = client->compile(kAddProgram);
  }
  Buffer* args[] = {buf.get(), buf.get()};
  EXPECT_EQ(to_floats(*exe->execute(args, 0)[0]), (std::vector<float>{8, 10}));
}

TEST(PjrtExecutable, SerializeDeserializeRoundTrip) {
  ClientPtr client = cpu_client();
  std::string bytes = client->compile(kAddProgram)->serialize();
  ASSERT_FALSE(bytes.empty());
  ExecutablePtr exe = client->deserialize(bytes);
  EXPECT_EQ(exe->num_outputs(), 1u);
  expect_add_runs_on(*exe, 1);
  expect_add_runs_on(*exe, 0);
}

TEST(PjrtExecutable, ExecuteOverhead) {
  // Not a pass/fail gate: prints the host cost of one tiny eager-style op.
  ClientPtr client = cpu_client();
  ExecutablePtr exe = client->compile(kAddProgram);
  float a[2] = {1, 2};
  BufferPtr ba = client->buffer_from_host(a, DType::F32, std::vector<int64_t>{2}, 0);
  Buffer* args[] = {ba.get(), ba.get()};
  constexpr int kIters = 2000;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kIters; ++i) exe->execute(args, 0);
  auto us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start);
  std::printf("  execute(): %.2f us per call (incl. output destroy)\n", us.count() / kIters);
  EXPECT_EQ(to_floats(*exe->execute(args, 0)[0]), (std::vector<float>{2, 4}));
}

// ---------------------------------------------------------------------------
// CompileOptionsProto encoding.

std::string hex(const std::string& bytes) {
  std::string out;
  char buf[4];
  for (unsigned char c : bytes) {
    std::snprintf(buf, sizeof(buf), "%02x ", c);
    out += buf;
  }
  if (!out.empty()) out.pop_back();
  return out;
}

TEST(PjrtCompileOptions, GoldenBytes) {
  // executable_build_options{device_ordinal=-1, num_replicas=1, num_partitions=1},
  // compile_portable_executable=true.
  EXPECT_EQ(hex(encode_compile_options({})),
            "1a 0f 08 ff ff ff ff ff ff ff ff ff 01 20 01 28 01 20 01");
  // Multi-device programs are not portable; 300 = ac 02 as a varint.
  EXPECT_EQ(hex(encode_compile_options({.num_replicas = 300, .num_partitions = 2})),
            "1a 10 08 ff ff ff ff ff ff ff ff ff 01 20 ac 02 28 02");
  error_of([] { encode_compile_options({.num_replicas = 0}); });
  // env_option_overrides: field 7, map entry {key = 1: name, value = 2: {int_field = 3}}.
  EXPECT_EQ(hex(encode_compile_options({.overrides = {{"ab", int64_t{0}}}})),
            "1a 0f 08 ff ff ff ff ff ff ff ff ff 01 20 01 28 01 20 01 3a 08 0a 02 61 62 12 02 18 "
            "00");
  EXPECT_EQ(
      hex(encode_compile_options({.overrides = {{"a", true}, {"b", std::string("x")}}})),
      "1a 0f 08 ff ff ff ff ff ff ff ff ff 01 20 01 28 01 20 01 3a 07 0a 01 61 12 02 10 01 3a "
      "08 0a 01 62 12 03 0a 01 78");
  // device_assignment (field 9): {replica_count = 2, computation_count = 1,
  // computation_devices = [{replica_device_ids = [1, 0] (packed)}]}.
  EXPECT_EQ(hex(encode_compile_options({.num_replicas = 2, .replica_devices = {1, 0}})),
            "1a 1b 08 ff ff ff ff ff ff ff ff ff 01 20 02 28 01 4a 0a 08 02 10 01 1a 04 0a 02 01 "
            "00");
  error_of([] { encode_compile_options({.num_replicas = 2, .replica_devices = {1}}); });
}

// A replicated program with a device assignment runs replica r on the device
// it names: replica 0 takes its argument on device 1 and adds its replica id.
TEST(PjrtCompileOptions, ReplicaDevicesPlaceReplicas) {
  const char program[] = R"(module {
  func.func public @main(%a: tensor<2xf32>) -> tensor<2xf32> {
    %r = stablehlo.replica_id : tensor<ui32>
    %f = stablehlo.convert %r : (tensor<ui32>) -> tensor<f32>
    %b = stablehlo.broadcast_in_dim %f, dims = [] : (tensor<f32>) -> tensor<2xf32>
    %c = stablehlo.add %a, %b : tensor<2xf32>
    return %c : tensor<2xf32>
  }
})";
  ClientPtr client = cpu_client();
  ExecutablePtr exe = client->compile(
      program,
      {.num_replicas = 2, .replica_devices = {client->device_id(1), client->device_id(0)}});
  float ten[2] = {10, 10}, twenty[2] = {20, 20};
  BufferPtr on1 = client->buffer_from_host(ten, DType::F32, std::vector<int64_t>{2}, 1);
  BufferPtr on0 = client->buffer_from_host(twenty, DType::F32, std::vector<int64_t>{2}, 0);
  auto out = exe->execute_replicated({{on1.get()}, {on0.get()}});
  EXPECT_EQ(to_floats(*out[0][0]), (std::vector<float>{10, 10}));
  EXPECT_EQ(to_floats(*out[1][0]), (std::vector<float>{21, 21}));
}

// The plugin applies per-compile overrides: xla_dump_to writes this compile's
// HLO where it says, and the level-0 program still computes the same sums.
TEST(PjrtCompileOptions, PluginAppliesOverrides) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("tt_override_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  ExecutablePtr exe = cpu_client()->compile(
      kAddProgram, {.overrides = {{"xla_dump_to", dir.string()},
                                  {"xla_backend_optimization_level", int64_t{0}}}});
  expect_add_runs_on(*exe, 0);
  EXPECT_TRUE(fs::is_directory(dir) && !fs::is_empty(dir)) << dir;
  fs::remove_all(dir);
  EXPECT_THROW(cpu_client()->compile(kAddProgram, {.overrides = {{"no_such_xla_option", true}}}),
               Error);
}

// An override the plugin's XLA lacks is learned from the compile error and
// left out of the retry and of later builds; other errors are not retried.
TEST(PjrtCompileOptions, TuningOverridesLeaveOutWhatThePluginLacks) {
  TuningOverrides tuning;
  const CompileOptions asked{
      .overrides = {{"xla_backend_optimization_level", int64_t{1}}, {"no_such_xla_option", true}}};
  CompileOptions o = tuning.known(asked);
  ASSERT_EQ(o.overrides.size(), 2u);
  std::string error;
  try {
    cpu_client()->compile(kAddProgram, o);
  } catch (const Error& e) {
    error = e.what();
  }
  ASSERT_TRUE(tuning.learn(error, o)) << error;
  EXPECT_EQ(tuning.missing(), std::set<std::string>{"no_such_xla_option"});
  o = tuning.known(asked);
  ASSERT_EQ(o.overrides.size(), 1u);
  EXPECT_EQ(o.overrides[0].name, "xla_backend_optimization_level");
  expect_add_runs_on(*cpu_client()->compile(kAddProgram, o), 0);
  // Not an override of these options, or not that error: the build fails as it is.
  EXPECT_FALSE(tuning.learn(error, CompileOptions{}));
  EXPECT_FALSE(tuning.learn("PJRT_Client_Compile: parse error", asked));
}

}  // namespace
}  // namespace torchtpu::pjrt
