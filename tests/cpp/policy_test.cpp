// Fused Eager's loop policy (csrc/graph) on synthetic op streams: a period of
// the recorded calls, where the graph is cut, when the loop ends.
#include "graph/policy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace torchtpu::graph {
namespace {

// One recorded call: its key hash, the values it creates or writes in place
// (they become pending) and the values Python drops right after it.
struct Op {
  uint64_t h;
  std::vector<std::string> makes, frees;
};
using Stream = std::vector<Op>;

// A call-key hash: the op (kind, index) and the batch size in its shapes.
uint64_t H(int kind, int idx, int batch = 32) {
  return (uint64_t(kind) << 40) ^ (uint64_t(batch) << 20) ^ uint64_t(idx + 1);
}
enum Kind { kFwd = 1, kLoss, kBwd, kOpt, kEval, kLayerFwd, kLayerBwd };

// Records a stream the way fused.cpp does: a loop boundary cuts first (every
// pending value materializes), then the call is recorded with the live count
// before it, then its outputs become pending and the dropped values die.
struct Recorder {
  LoopDetector det;
  std::set<std::string> pending;
  size_t i = 0;                                      // stream index of the next call
  std::vector<size_t> cuts;                          // stream index of each boundary call
  std::vector<std::pair<size_t, LoopCut>> detected;  // stream index of the detecting call

  void run(const Stream& ops) {
    for (const Op& op : ops) {
      if (det.cut_before(op.h)) {
        cuts.push_back(i);
        pending.clear();
        det.reset_after_cut();
      }
      if (auto c = det.recorded(op.h, static_cast<int64_t>(pending.size())))
        detected.emplace_back(i, *c);
      for (const std::string& v : op.makes) pending.insert(v);
      for (const std::string& v : op.frees) pending.erase(v);
      ++i;
    }
  }
};

// One training step of an n-layer MLP: forward (each layer saves its
// activation), loss, backward (drops the activations, makes the gradients),
// an in-place update per parameter, then zero_grad drops the gradients.
// `keep` values per step outlive it (a kept loss). 3n+1 calls.
Stream mlp_step(int n, int step, int keep = 0, int batch = 32) {
  Stream s;
  auto a = [](int l) { return "a" + std::to_string(l); };
  auto g = [](int l) { return "g" + std::to_string(l); };
  for (int l = 0; l < n; ++l) s.push_back({H(kFwd, l, batch), {a(l)}, {}});
  Op loss{H(kLoss, 0, batch), {"loss"}, {}};
  for (int k = 0; k < keep; ++k)
    loss.makes.push_back("kept" + std::to_string(k) + "@" + std::to_string(step));
  s.push_back(loss);
  for (int l = n - 1; l >= 0; --l) s.push_back({H(kBwd, l, batch), {g(l)}, {a(l)}});
  for (int l = 0; l < n; ++l) s.push_back({H(kOpt, l, batch), {"p" + std::to_string(l)}, {}});
  for (int l = 0; l < n; ++l) s.back().frees.push_back(g(l));
  s.back().frees.push_back("loss");
  return s;
}

Stream mlp_steps(int n, int steps, int keep = 0, int batch = 32, int first_step = 0) {
  Stream s;
  for (int k = 0; k < steps; ++k) {
    Stream one = mlp_step(n, first_step + k, keep, batch);
    s.insert(s.end(), one.begin(), one.end());
  }
  return s;
}

// A step of a model of `layers` identical 8-call layers: each forward call
// saves a value (+8 per layer), each backward layer drops its 8 and makes one
// gradient (-7 per layer); a 3-call foreach optimizer. 16*layers+4 calls.
Stream layered_step(int layers) {
  Stream s;
  auto a = [](int l, int c) { return "a" + std::to_string(l) + "." + std::to_string(c); };
  for (int l = 0; l < layers; ++l)
    for (int c = 0; c < 8; ++c) s.push_back({H(kLayerFwd, c), {a(l, c)}, {}});
  s.push_back({H(kLoss, 0), {"loss"}, {}});
  for (int l = layers - 1; l >= 0; --l)
    for (int c = 0; c < 8; ++c) {
      Op op{H(kLayerBwd, c), {}, {a(l, c)}};
      if (c == 7) op.makes.push_back("g" + std::to_string(l));
      s.push_back(op);
    }
  Op opt0{H(kOpt, 0), {}, {}};
  for (int l = 0; l < layers; ++l) opt0.makes.push_back("p" + std::to_string(l));
  s.push_back(opt0);
  s.push_back({H(kOpt, 1), {}, {}});
  s.push_back({H(kOpt, 2), {}, {"loss"}});
  for (int l = 0; l < layers; ++l) s.back().frees.push_back("g" + std::to_string(l));
  return s;
}

// The (hash, live-before) history a Recorder without cuts sees for `ops`.
std::pair<std::vector<uint64_t>, std::vector<int64_t>> history(const Stream& ops) {
  std::vector<uint64_t> h;
  std::vector<int64_t> live;
  std::set<std::string> pending;
  for (const Op& op : ops) {
    h.push_back(op.h);
    live.push_back(static_cast<int64_t>(pending.size()));
    for (const std::string& v : op.makes) pending.insert(v);
    for (const std::string& v : op.frees) pending.erase(v);
  }
  return {h, live};
}

// 10 layers: a 31-call step. Step 1 starts with no pending parameters, so its
// live counts differ: the first 64-call check (steps 1-3) rejects, the second
// (128 calls) finds period 31 and cuts before step 5's first call (index 124),
// where only the 10 updated parameters are pending.
TEST(LoopPolicy, TrainingLoopCutsBetweenSteps) {
  Recorder r;
  r.run(mlp_steps(10, 10));
  ASSERT_EQ(r.detected.size(), 1u);
  EXPECT_EQ(r.detected[0].first, 127u);
  const LoopCut& c = r.detected[0].second;
  EXPECT_EQ(c.period, 31u);
  EXPECT_EQ(c.at, 124u);
  EXPECT_EQ(c.first, H(kFwd, 0));
  EXPECT_EQ(c.prev, H(kOpt, 9));
  // A boundary before every later step's first call.
  EXPECT_EQ(r.cuts, (std::vector<size_t>{155, 186, 217, 248, 279}));
  EXPECT_TRUE(r.det.active());
  EXPECT_EQ(r.det.period(), 31u);
  EXPECT_EQ(r.det.size(), 31u);  // the last step, recorded since its boundary

  auto [h, live] = history(mlp_steps(10, 5));
  EXPECT_EQ(find_period(h, live), 31u);
  h.resize(128), live.resize(128);
  auto cut = find_loop_cut(h, live);
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->at, 124u);
  EXPECT_EQ(live[124], 10);
  h.resize(64), live.resize(64);
  EXPECT_EQ(find_period(h, live), 0u);  // step 1's live counts are in the window
}

// Eight identical layers: period 8 inside the step passes the hash test, the
// live counts reject it (+8 per forward layer, -7 per backward layer); the
// 132-call step is found once the check window leaves step 1 (448 calls).
TEST(LoopPolicy, RepeatedLayersAreNoLoop) {
  Stream step = layered_step(8);
  ASSERT_EQ(step.size(), 132u);
  Stream fwd(step.begin(), step.begin() + 64), fwd_bwd(step.begin(), step.begin() + 129);
  for (const Stream* s : {&fwd, &fwd_bwd}) {
    auto [h, live] = history(*s);
    EXPECT_EQ(find_period(h, live), 0u);
    std::vector<int64_t> flat(h.size(), 0);
    EXPECT_EQ(find_period(h, flat), 8u);  // the live test is what rejects
  }

  Stream steps;
  for (int k = 0; k < 7; ++k) steps.insert(steps.end(), step.begin(), step.end());
  Recorder r;
  r.run(steps);
  ASSERT_EQ(r.detected.size(), 1u);
  EXPECT_EQ(r.detected[0].first, 447u);
  const LoopCut& c = r.detected[0].second;
  EXPECT_EQ(c.period, 132u);
  EXPECT_EQ(c.at, 396u);  // step 4's first call, 8 parameters pending
  EXPECT_EQ(c.first, H(kLayerFwd, 0));
  EXPECT_EQ(c.prev, H(kOpt, 2));
  EXPECT_EQ(r.cuts, (std::vector<size_t>{528, 660, 792}));
}

// A loop keeping each step's loss: live counts drift +1 per period, still a
// loop. Up to 2 per period is accepted; 3 is not, at any multiple of the period.
TEST(LoopPolicy, DriftOfKeptLoss) {
  for (int keep : {1, 2}) {
    Recorder r;
    r.run(mlp_steps(10, 10, keep));
    ASSERT_EQ(r.detected.size(), 1u) << keep;
    EXPECT_EQ(r.detected[0].first, 127u);
    EXPECT_EQ(r.detected[0].second.period, 31u);
    EXPECT_EQ(r.detected[0].second.at, 124u);
    EXPECT_EQ(r.cuts, (std::vector<size_t>{155, 186, 217, 248, 279}));
  }
  Recorder r;
  r.run(mlp_steps(10, 20, 3));
  EXPECT_TRUE(r.detected.empty());
  EXPECT_TRUE(r.cuts.empty());
  EXPECT_FALSE(r.det.active());
  auto [h, live] = history(mlp_steps(10, 20, 3));
  EXPECT_EQ(live[124 + 31] - live[124], 3);
  EXPECT_EQ(find_period(h, live), 0u);
}

// Shapes are in the call key: with a batch size changing every step no
// period exists, the loop's boundary stops coming and it ends. With the batch
// fixed again the period is found once it covers half the graph (the graph
// has grown since the last cut at 155: 165 fixed calls of 320).
TEST(LoopPolicy, ChangingBatchSize) {
  Recorder r;
  r.run(mlp_steps(10, 6));  // batch 32: loop found, cut at step 6 (155)
  ASSERT_EQ(r.detected.size(), 1u);
  EXPECT_EQ(r.cuts, (std::vector<size_t>{155}));
  for (int b = 33; b < 37; ++b) r.run(mlp_steps(10, 1, 0, b));
  EXPECT_EQ(r.i, 310u);
  EXPECT_FALSE(r.det.active());  // ended at graph size 63 (index 217)
  EXPECT_EQ(r.detected.size(), 1u);
  EXPECT_EQ(r.cuts.size(), 1u);

  r.run(mlp_steps(10, 8));  // batch 32 again
  ASSERT_EQ(r.detected.size(), 2u);
  EXPECT_EQ(r.detected[1].first, 474u);
  const LoopCut& c = r.detected[1].second;
  EXPECT_EQ(c.period, 31u);
  EXPECT_EQ(c.at, 310u);  // graph index of the call at stream index 465
  EXPECT_EQ(c.first, H(kFwd, 0));
  EXPECT_EQ(c.prev, H(kOpt, 9));
  EXPECT_EQ(r.cuts, (std::vector<size_t>{155, 496, 527}));

  Stream varying;
  for (int b = 1; b < 12; ++b) {
    Stream one = mlp_step(10, b, 0, b);
    varying.insert(varying.end(), one.begin(), one.end());
  }
  auto [h, live] = history(varying);
  EXPECT_EQ(find_period(h, live), 0u);
}

// The cut call's (previous, own) pair must occur once per period, else the
// boundary would come several times a step; among those, the fewest live
// values, the earliest on ties. Candidates are the last period's calls after
// its first.
TEST(LoopPolicy, CutAtCallPairOncePerPeriod) {
  const std::vector<uint64_t> period = {1, 2, 3, 1, 2, 4, 5, 6};
  const std::vector<int64_t> live_in = {9, 9, 3, 5, 1, 3, 7, 8};
  std::vector<uint64_t> h;
  std::vector<int64_t> live;
  for (int k = 0; k < 4; ++k) {
    h.insert(h.end(), period.begin(), period.end());
    live.insert(live.end(), live_in.begin(), live_in.end());
  }
  auto cut = find_loop_cut(h, live);
  ASSERT_TRUE(cut);
  EXPECT_EQ(cut->period, 8u);
  EXPECT_EQ(cut->at, 26u);  // not 28: pair (1, 2) twice; not 29: a later tie
  EXPECT_EQ(cut->prev, 2u);
  EXPECT_EQ(cut->first, 3u);

  // Every pair repeats within the period: a period but no cut.
  std::vector<uint64_t> ab(32);
  for (size_t i = 0; i < ab.size(); ++i) ab[i] = 1 + i % 2;
  EXPECT_EQ(find_period(ab, std::vector<int64_t>(32, 0)), 8u);
  EXPECT_FALSE(find_loop_cut(ab, std::vector<int64_t>(32, 0)));
}

// Deactivation: more than two periods without the boundary since the loop
// was found (graph size 128 + 62) or since the last cut (62).
TEST(LoopPolicy, LoopEndsWhenBoundaryStopsComing) {
  Stream eval;
  for (int k = 0; k < 100; ++k) eval.push_back({H(kEval, k), {}, {}});
  Recorder r;
  r.run(mlp_steps(10, 5));
  ASSERT_TRUE(r.det.active());
  ASSERT_EQ(r.det.size(), 155u);
  r.run(Stream(eval.begin(), eval.begin() + 35));
  EXPECT_EQ(r.det.size(), 190u);
  EXPECT_TRUE(r.det.active());
  r.run(Stream(eval.begin() + 35, eval.begin() + 36));
  EXPECT_FALSE(r.det.active());

  Recorder s;
  s.run(mlp_steps(10, 6));
  ASSERT_EQ(s.cuts, (std::vector<size_t>{155}));
  s.run(Stream(eval.begin(), eval.begin() + 31));
  EXPECT_EQ(s.det.size(), 62u);
  EXPECT_TRUE(s.det.active());
  s.run(Stream(eval.begin() + 31, eval.begin() + 32));
  EXPECT_FALSE(s.det.active());
}

// The boundary needs the previous call in the same graph: never at a graph's
// first call, and only after the loop's `prev`.
TEST(LoopPolicy, BoundaryNeedsPreviousCall) {
  Recorder r;
  r.run(mlp_steps(10, 5));
  ASSERT_TRUE(r.det.active());
  EXPECT_TRUE(r.det.cut_before(H(kFwd, 0)));  // the last call was step 5's opt 9
  EXPECT_FALSE(r.det.cut_before(H(kFwd, 1)));
  r.det.reset_after_cut();
  EXPECT_FALSE(r.det.cut_before(H(kFwd, 0)));
  EXPECT_TRUE(r.det.active());  // the loop outlives the cut
  r.det.recorded(H(kBwd, 3), 0);
  EXPECT_FALSE(r.det.cut_before(H(kFwd, 0)));
  r.det.recorded(H(kOpt, 9), 0);
  EXPECT_TRUE(r.det.cut_before(H(kFwd, 0)));
}

}  // namespace
}  // namespace torchtpu::graph
