// Runs the runtime layer against a second, newer PJRT plugin named by
// TORCHTPU_TEST_NEWER_PLUGIN (e.g. the XLA:CPU plugin of jaxlib 0.11.2, PJRT
// 0.115, whose structs are larger than those of our 0.81 header). Skipped
// when the variable is unset.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "pjrt/pjrt.h"
#include "pjrt/tuning.h"

namespace torchtpu::pjrt {
namespace {

std::shared_ptr<Plugin> newer_plugin() {
  const char* path = std::getenv("TORCHTPU_TEST_NEWER_PLUGIN");
  if (path == nullptr || *path == '\0') return nullptr;
  return Plugin::load(path);
}

#define NEED_PLUGIN(p)     \
  auto p = newer_plugin(); \
  if (p == nullptr) GTEST_SKIP() << "TORCHTPU_TEST_NEWER_PLUGIN is unset"

TEST(NewerPlugin, ReportsVersionAndReadableAttributes) {
  NEED_PLUGIN(plugin);
  EXPECT_EQ(plugin->api_major(), 0);
  EXPECT_GT(plugin->api_minor(), 81);
  // Read through the plugin's own PJRT_NamedValue size.
  ASSERT_FALSE(plugin->attributes().empty());
  for (const auto& [name, value] : plugin->attributes()) {
    EXPECT_FALSE(name.empty());
    EXPECT_LT(name.size(), 256u) << "garbage attribute name: struct stride is wrong";
  }
}

TEST(NewerPlugin, CompilesExecutesAndTransfers) {
  NEED_PLUGIN(plugin);
  auto client = Client::create(plugin, {{"cpu_device_count", int64_t{2}}});
  ASSERT_EQ(client->device_count(), 2);
  const char* program = R"(module {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<i32>) {
    %0 = stablehlo.multiply %a, %b : tensor<2x3xf32>
    %c = stablehlo.constant dense<7> : tensor<i32>
    return %0, %c : tensor<2x3xf32>, tensor<i32>
  }
})";
  auto exe = client->compile(program);
  ASSERT_EQ(exe->num_outputs(), 2u);
  std::vector<float> a{1, 2, 3, 4, 5, 6}, b{2, 2, 2, 3, 3, 3};
  std::vector<int64_t> dims{2, 3};
  for (int device : {0, 1}) {
    auto ba = client->buffer_from_host(a.data(), DType::F32, dims, device);
    auto bb = client->buffer_from_host(b.data(), DType::F32, dims, device);
    Buffer* args[] = {ba.get(), bb.get()};
    auto out = exe->execute(args, device);
    ASSERT_EQ(out.size(), 2u);
    EXPECT_EQ(out[0]->dims(), dims);
    EXPECT_EQ(out[1]->dtype(), DType::I32);
    std::vector<float> got(6);
    out[0]->to_host(got.data(), got.size() * sizeof(float));
    EXPECT_EQ(got, (std::vector<float>{2, 4, 6, 12, 15, 18}));
    int32_t c = 0;
    out[1]->to_host(&c, sizeof c);
    EXPECT_EQ(c, 7);
  }
  // Executables survive serialization with this plugin too.
  auto again = client->deserialize(exe->serialize());
  auto ba = client->buffer_from_host(a.data(), DType::F32, dims, 0);
  Buffer* args[] = {ba.get(), ba.get()};
  std::vector<float> sq(6);
  again->execute(args, 0)[0]->to_host(sq.data(), sq.size() * sizeof(float));
  EXPECT_EQ(sq, (std::vector<float>{1, 4, 9, 16, 25, 36}));
}

TEST(NewerPlugin, ErrorsCarryThePluginMessage) {
  NEED_PLUGIN(plugin);
  auto client = Client::create(plugin, {{"cpu_device_count", int64_t{1}}});
  try {
    client->compile("module { func.func @main() { %0 = stablehlo.bogus } }");
    FAIL() << "expected a compile error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("PJRT_Client_Compile"), std::string::npos) << e.what();
  }
}

// jaxlib 0.11.2's XLA has no xla_cpu_use_fusion_emitters, an override our
// builds send: the build goes on without it.
TEST(NewerPlugin, BuildsWithoutTuningOverridesItLacks) {
  NEED_PLUGIN(plugin);
  auto client = Client::create(plugin, {{"cpu_device_count", int64_t{1}}});
  const char* program = R"(module {
  func.func public @main(%a: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %a : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
})";
  const CompileOptions asked{.overrides = {{"xla_backend_optimization_level", int64_t{1}},
                                           {"xla_cpu_use_fusion_emitters", false}}};
  TuningOverrides tuning;
  ExecutablePtr exe;
  for (int tries = 0; !exe && tries < 3; ++tries) {
    CompileOptions o = tuning.known(asked);
    try {
      exe = client->compile(program, o);
    } catch (const Error& e) {
      ASSERT_TRUE(tuning.learn(e.what(), o)) << e.what();
    }
  }
  ASSERT_TRUE(exe);
  EXPECT_EQ(tuning.missing(), std::set<std::string>{"xla_cpu_use_fusion_emitters"});
  std::vector<float> a{1, 2, 3, 4}, got(4);
  std::vector<int64_t> dims{4};
  auto ba = client->buffer_from_host(a.data(), DType::F32, dims, 0);
  Buffer* args[] = {ba.get()};
  exe->execute(args, 0)[0]->to_host(got.data(), got.size() * sizeof(float));
  EXPECT_EQ(got, (std::vector<float>{2, 4, 6, 8}));
}

}  // namespace
}  // namespace torchtpu::pjrt

namespace torchtpu::pjrt {
namespace {

// Without a driver (this CPU machine) or without the CUDA 13 libraries, the
// preload names what is missing instead of letting the plugin fail later.
TEST(CudaLibraries, MissingDriverOrLibraryIsNamed) {
  try {
    auto report = preload_cuda_libraries("/nonexistent/jax_plugins/xla_cuda13/p.so", {});
    GTEST_SKIP() << "driver and CUDA libraries are loadable here (" << report.size() << " lines)";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("TORCHTPU_PLATFORM=cuda"), std::string::npos) << msg;
    EXPECT_TRUE(msg.find("libcuda.so.1") != std::string::npos ||
                msg.find("libcudart.so.13") != std::string::npos)
        << msg;
  }
}

}  // namespace
}  // namespace torchtpu::pjrt
