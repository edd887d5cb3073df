// Fused Eager's read policy (csrc/graph): the split of a graph for a host
// read, whether it pays, and the learned read-ahead cut points.
#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "graph/policy.h"

namespace torchtpu::graph {
namespace {

// A call-key hash (any distinct values do).
uint64_t H(int kind, int idx) { return (uint64_t(kind) << 40) ^ uint64_t(idx + 1); }
enum Kind { kFwd = 1, kLoss, kBwd };

// Slots: parameters 0, 1; input 2; activations 3, 4; loss 5; gradients 6-8.
std::vector<CallSlots> training_graph() {
  return {
      {{2, 0}, {3}},        // 0 fwd0: a0 = x @ p0
      {{3, 1}, {4}},        // 1 fwd1: a1 = a0 @ p1
      {{4}, {5}},           // 2 loss
      {{5, 3, 1}, {6, 7}},  // 3 bwd1: g1, grad a0
      {{7, 2}, {8}},        // 4 bwd0: g0
      {{1, 6}, {1}},        // 5 opt: p1 -= g1 (in place)
      {{0, 8}, {0}},        // 6 opt: p0 -= g0
  };
}

TEST(PartitionPolicy, LossReadNeedsForwardOnly) {
  std::vector<int> first, rest;
  partition(training_graph(), 9, 5, first, rest);
  EXPECT_EQ(first, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(rest, (std::vector<int>{3, 4, 5, 6}));
  EXPECT_TRUE(is_prefix(first));

  first.clear(), rest.clear();
  partition(training_graph(), 9, 8, first, rest);  // a gradient needs all but the optimizer
  EXPECT_EQ(first, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(rest, (std::vector<int>{5, 6}));

  first.clear(), rest.clear();
  partition(training_graph(), 9, 1, first, rest);  // the updated p1
  EXPECT_EQ(first, (std::vector<int>{0, 1, 2, 3, 5}));
  EXPECT_EQ(rest, (std::vector<int>{4, 6}));
  EXPECT_FALSE(is_prefix(first));
}

// Running `first` ahead must change no value the rest sees or leaves.
TEST(PartitionPolicy, ClosureKeepsOrderOfConflictingCalls) {
  // Write after read: call 0 reads w, which needed call 1 updates in place.
  std::vector<CallSlots> war = {
      {{0}, {1}},  // 0 c = exp(w)
      {{2}, {3}},  // 1 unrelated
      {{0}, {0}},  // 2 w.mul_(2)
      {{0}, {4}},  // 3 t = w + 1   <- read
  };
  std::vector<int> first, rest;
  partition(war, 5, 4, first, rest);
  EXPECT_EQ(first, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(rest, (std::vector<int>{1}));

  // Write after write: call 0 writes s, which needed call 2 writes later.
  std::vector<CallSlots> waw = {
      {{}, {0}},     // 0 s.fill_(1)
      {{5}, {6}},    // 1 unrelated
      {{}, {0, 1}},  // 2 writes s and t
      {{5}, {7}},    // 3 unrelated
  };
  first.clear(), rest.clear();
  partition(waw, 8, 1, first, rest);
  EXPECT_EQ(first, (std::vector<int>{0, 2}));
  EXPECT_EQ(rest, (std::vector<int>{1, 3}));

  // A call that writes what a needed call reads is needed; one that only reads
  // a needed call's inputs is not.
  std::vector<CallSlots> raw = {
      {{}, {0}},   // 0 u = rand()
      {{0}, {1}},  // 1 v = u * 2 (not needed)
      {{0}, {2}},  // 2 t = u + 1 <- read
  };
  first.clear(), rest.clear();
  partition(raw, 3, 2, first, rest);
  EXPECT_EQ(first, (std::vector<int>{0, 2}));
  EXPECT_EQ(rest, (std::vector<int>{1}));
}

TEST(SplitPolicy, SplitPays) {
  const std::vector<int> prefix = {0, 1, 2}, inner = {0, 2, 3}, none;
  EXPECT_TRUE(is_prefix(prefix));
  EXPECT_FALSE(is_prefix(inner));
  EXPECT_FALSE(is_prefix(none));
  // A leading needed part runs ahead next time: 16 calls of rest suffice.
  EXPECT_FALSE(split_pays(prefix, 15, true));
  EXPECT_TRUE(split_pays(prefix, 16, true));
  EXPECT_FALSE(split_pays(prefix, 63, false));
  EXPECT_TRUE(split_pays(prefix, 64, false));
  EXPECT_FALSE(split_pays(inner, 63, true));
  EXPECT_TRUE(split_pays(inner, 64, true));
  EXPECT_FALSE(split_pays(none, 0, true));  // no target: never split
}

TEST(ReadAheadPolicy, PointIsAfterTheLastNeededCall) {
  // Needed calls with unneeded ones among them: the cut covers all of them.
  EXPECT_EQ(read_ahead_point({0, 2, 5}, 6 + 16), 6u);
  EXPECT_EQ(read_ahead_point({0, 1, 2}, 3 + 16), 3u);
  EXPECT_EQ(read_ahead_point({0, 2, 5}, 6 + 15), 0u);  // too few calls after it
  EXPECT_EQ(read_ahead_point({}, 100), 0u);            // no read target
}

TEST(ReadAheadPolicy, PrefixAndCutPointConstants) {
  EXPECT_EQ(extend_prefix(0, 5, {}), 5u);
  EXPECT_EQ(extend_prefix(7, 5, std::vector<int>{1, 2}), 0x1a4700002c9401ULL);
  EXPECT_EQ(cut_point(0, 0), 0x9e3779b97f4a7c15ULL);
  EXPECT_EQ(cut_point(0x1234, 3), 0x78dde6e5fd29e260ULL);
}

// The calls of a graph (hash, storage slots) and the prefix before each.
std::vector<uint64_t> prefixes(const std::vector<std::pair<uint64_t, std::vector<int>>>& calls) {
  std::vector<uint64_t> at;
  uint64_t p = 0;
  for (const auto& [h, slots] : calls) {
    at.push_back(p);
    p = extend_prefix(p, h, slots);
  }
  at.push_back(p);
  return at;
}

TEST(ReadAheadPolicy, LearnedCutComesBackWithSameCalls) {
  // A step: 3 forward calls (the loss read needed them), then backward.
  std::vector<std::pair<uint64_t, std::vector<int>>> step = {{H(kFwd, 0), {0, 1, 2}},
                                                             {H(kFwd, 1), {2, 3, 4}},
                                                             {H(kLoss, 0), {4, 5}},
                                                             {H(kBwd, 1), {5, 2, 3, 6}},
                                                             {H(kBwd, 0), {6, 0, 7}}};
  ReadAhead ra;
  EXPECT_TRUE(ra.empty());
  std::vector<uint64_t> at = prefixes(step);
  ra.learn(at[3], 3);
  EXPECT_FALSE(ra.empty());
  // The next step records the same calls on the same slot numbers.
  for (size_t k = 0; k < at.size(); ++k) EXPECT_EQ(ra.cut_here(at[k], k), k == 3) << k;
  // The same calls hashed as if at another position do not match.
  EXPECT_FALSE(ra.cut_here(at[3], 4));
  // A storage used differently (slot 9 instead of 3) changes the prefix.
  step[1].second = {2, 9, 4};
  EXPECT_FALSE(ra.cut_here(prefixes(step)[3], 3));
}

TEST(ReadAheadPolicy, BoundedSetClearedWhenFull) {
  ReadAhead ra;
  for (uint64_t k = 0; k < ReadAhead::kMaxPoints; ++k) ra.learn(k * 1000, 7);
  EXPECT_EQ(ra.size(), 4096u);
  EXPECT_TRUE(ra.cut_here(0, 7));
  ra.learn(0, 7);  // already known: still cleared, the set was full
  EXPECT_EQ(ra.size(), 1u);
  ra.learn(1, 8);
  EXPECT_EQ(ra.size(), 2u);
  EXPECT_TRUE(ra.cut_here(0, 7));
  EXPECT_FALSE(ra.cut_here(1000, 7));
  EXPECT_TRUE(ra.cut_here(1, 8));
}

}  // namespace
}  // namespace torchtpu::graph
