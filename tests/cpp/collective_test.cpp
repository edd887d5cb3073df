// Cross-replica collective programs (hlo builder + Executable::execute_replicated)
// on 4 XLA:CPU devices of one process.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "hlo/builder.h"
#include "pjrt/pjrt.h"

namespace torchtpu::hlo {
namespace {

constexpr int kN = 4;
const Builder::Groups kAll = {{0, 1, 2, 3}};

pjrt::ClientPtr client4() {
  static pjrt::ClientPtr c =
      pjrt::Client::create(pjrt::Plugin::load(pjrt::find_plugin({TORCHTPU_SITE_PACKAGES})),
                           {{"cpu_device_count", int64_t{kN}}});
  return c;
}

// Runs b's module on every replica, replica r taking inputs[r]; returns each
// replica's single output.
template <class T>
std::vector<std::vector<T>> run(const Builder& b, DType dt, const Shape& shape,
                                const std::vector<std::vector<T>>& inputs) {
  auto exe = client4()->compile(b.module(), {.num_replicas = kN});
  std::vector<pjrt::BufferPtr> keep;
  std::vector<std::vector<pjrt::Buffer*>> args(kN);
  for (int r = 0; r < kN; ++r) {
    keep.push_back(client4()->buffer_from_host(inputs[r].data(), dt, shape, r));
    args[r].push_back(keep.back().get());
  }
  std::vector<std::vector<T>> out;
  for (auto& outs : exe->execute_replicated(args)) {
    std::vector<T> v(size_t(outs[0]->numel()));
    outs[0]->to_host(v.data(), v.size() * sizeof(T));
    out.push_back(v);
  }
  return out;
}

std::vector<std::vector<float>> per_replica(int n_each) {
  std::vector<std::vector<float>> in(kN);
  for (int r = 0; r < kN; ++r)
    for (int i = 0; i < n_each; ++i) in[r].push_back(float(10 * r + i));
  return in;
}

TEST(Collective, AllReduceSumMaxAndGroups) {
  auto start = std::chrono::steady_clock::now();
  {
    Builder b;
    Value x = b.param(Type{DType::F32, {3}});
    b.ret({b.all_reduce(x, Reducer::Add, kAll)});
    EXPECT_NE(b.module().find("stablehlo.all_reduce"), std::string::npos);
    auto out = run<float>(b, DType::F32, {3}, per_replica(3));
    for (auto& o : out) EXPECT_EQ(o, (std::vector<float>{60, 64, 68}));
  }
  {
    Builder b;
    Value x = b.param(Type{DType::I64, {2}});
    b.ret({b.all_reduce(x, Reducer::Max, {{0, 1}, {2, 3}})});
    std::vector<std::vector<int64_t>> in = {{1, 9}, {5, 2}, {-1, 0}, {-7, 3}};
    auto out = run<int64_t>(b, DType::I64, {2}, in);
    EXPECT_EQ(out[0], (std::vector<int64_t>{5, 9}));
    EXPECT_EQ(out[1], (std::vector<int64_t>{5, 9}));
    EXPECT_EQ(out[2], (std::vector<int64_t>{-1, 3}));
    EXPECT_EQ(out[3], (std::vector<int64_t>{-1, 3}));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(Collective, AllGatherReduceScatterAllToAllPermute) {
  {
    Builder b;
    Value x = b.param(Type{DType::F32, {2}});
    b.ret({b.all_gather(x, 0, kAll)});
    auto out = run<float>(b, DType::F32, {2}, per_replica(2));
    for (auto& o : out) EXPECT_EQ(o, (std::vector<float>{0, 1, 10, 11, 20, 21, 30, 31}));
  }
  {
    Builder b;
    Value x = b.param(Type{DType::F32, {8}});
    b.ret({b.reduce_scatter(x, 0, Reducer::Add, kAll)});
    auto out = run<float>(b, DType::F32, {8}, per_replica(8));
    // Sum over replicas of 10r + i is 60 + 4i; replica r keeps i = 2r, 2r + 1.
    for (int r = 0; r < kN; ++r)
      EXPECT_EQ(out[r], (std::vector<float>{60.f + 8 * r, 64.f + 8 * r}));
  }
  {
    Builder b;
    Value x = b.param(Type{DType::F32, {4}});
    b.ret({b.all_to_all(x, 0, 0, kAll)});
    auto out = run<float>(b, DType::F32, {4}, per_replica(4));
    // Replica r receives element r of every replica.
    for (int r = 0; r < kN; ++r)
      EXPECT_EQ(out[r], (std::vector<float>{float(r), 10.f + r, 20.f + r, 30.f + r}));
  }
  {
    Builder b;
    Value x = b.param(Type{DType::F32, {1}});
    b.ret({b.collective_permute(x, {{0, 1}, {1, 2}, {2, 3}, {3, 0}})});
    auto out = run<float>(b, DType::F32, {1}, per_replica(1));
    for (int r = 0; r < kN; ++r) EXPECT_EQ(out[r], (std::vector<float>{10.f * ((r + 3) % 4)}));
  }
}

TEST(Collective, BadGroupsAreBuildErrors) {
  Builder b;
  Value x = b.param(Type{DType::F32, {3}});
  EXPECT_THROW(b.all_reduce(x, Reducer::Add, {{0, 1}, {2}}), BuildError);
  EXPECT_THROW(b.reduce_scatter(x, 0, Reducer::Add, kAll), BuildError);  // 3 rows, 4 ranks
  EXPECT_THROW(b.all_gather(x, 1, kAll), BuildError);
}

TEST(Collective, ReducersByName) {
  EXPECT_EQ(reducer_named("sum"), Reducer::Add);
  EXPECT_EQ(reducer_named("prod"), Reducer::Mul);
  EXPECT_EQ(reducer_named("max"), Reducer::Max);
  EXPECT_EQ(reducer_named("min"), Reducer::Min);
  EXPECT_EQ(reducer_named("bxor"), Reducer::Xor);
  EXPECT_THROW(reducer_named("avg"), BuildError);  // a division after a sum, not a reducer
}

// A program's replica set: set once, the same again is fine, another group is an error.
TEST(Collective, OneReplicationPerProgram) {
  Builder b;
  EXPECT_EQ(b.replication().tag, -1);
  b.replicate(7, {2, 3});
  b.replicate(7, {2, 3});
  EXPECT_EQ(b.replication().tag, 7);
  EXPECT_EQ(b.replication().devices, (std::vector<int64_t>{2, 3}));
  EXPECT_THROW(b.replicate(8, {2, 3}), BuildError);
  EXPECT_THROW(b.replicate(7, {0, 1}), BuildError);
}

}  // namespace
}  // namespace torchtpu::hlo
