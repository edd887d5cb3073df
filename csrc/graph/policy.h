// Fused Eager's cut policy over plain data: loop detection on the stream of
// recorded calls, the split of a graph for a host read, and the learned
// read-ahead cut points. Depends only on the standard library; aten/fused.cpp
// records the calls and asks these functions where to cut.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <unordered_set>
#include <vector>

namespace torchtpu::graph {

// The shortest period p >= 8 of a graph's history `hist` (one call-key hash per
// recorded call) such that the last half of the history repeats with period p
// (at least two whole periods) and `live_at` (live pending values before each
// call) repeats with it up to a drift of at most 2 per period. 0 if none.
size_t find_period(const std::vector<uint64_t>& hist, const std::vector<int64_t>& live_at);

// A detected loop: cut before a call whose hash is `first` when the previous
// call's is `prev`. `at` is the index of that call in the history searched.
struct LoopCut {
  size_t period = 0;
  uint64_t prev = 0, first = 0;
  size_t at = 0;
};

// find_period, then among the last p-1 calls (the last period but its first
// call) the one with the fewest live pending values (the earliest on ties)
// whose (previous, own) hash pair occurs once among those p-1 calls' pairs.
// nullopt if there is no period or no such call.
std::optional<LoopCut> find_loop_cut(const std::vector<uint64_t>& hist,
                                     const std::vector<int64_t>& live_at);

// Loop detection over the current graph's history. The loop outlives cuts;
// the history does not.
class LoopDetector {
 public:
  static constexpr size_t kDetectEvery = 64;  // graph sizes at which detection runs

  // Forget the graph's history; call at every cut, whatever its reason.
  void reset_after_cut();
  // Before recording a call of hash `h`: true at a loop boundary (the graph
  // should be cut first). Never true for an empty graph.
  bool cut_before(uint64_t h) const;
  // After recording a call of hash `h`; `live_before` is the number of live
  // pending values before the call (after any cut for it, before its outputs).
  // Returns the loop when this call detected one.
  std::optional<LoopCut> recorded(uint64_t h, int64_t live_before);

  bool active() const { return active_; }
  size_t period() const { return loop_.period; }
  size_t size() const { return hist_.size(); }  // calls in the current graph

 private:
  std::vector<uint64_t> hist_;
  std::vector<int64_t> live_at_;
  bool active_ = false;
  LoopCut loop_;
  size_t since_ = 0;  // graph size when the loop was found (0 after each cut)
};

// Slots one recorded call reads (its device tensor arguments) and writes (in
// place or fresh outputs; a fresh output's slot is new, so no earlier call names it).
struct CallSlots {
  std::vector<int> reads, writes;
};

// Splits a graph of `calls` (slots below `num_slots`) for a host read of slot
// `target`: `first` gets the calls the value needs, closed so that running
// them before the others changes no value; `rest` the others. Both are call
// indices in recording order, appended to the vectors given.
void partition(const std::vector<CallSlots>& calls, size_t num_slots, int target,
               std::vector<int>& first, std::vector<int>& rest);

// Whether `first` (a partition's needed part) is the graph's leading calls.
bool is_prefix(const std::vector<int>& first);

// Whether running `first` and a rest of `rest_size` calls as two programs pays
// for the extra launch and outputs.
bool split_pays(const std::vector<int>& first, size_t rest_size, bool read_ahead_on);

// Where read-ahead cuts the graph next time, for a host read whose needed part is
// `first` in a graph of `n_calls` calls: just after the last needed call, so the
// cut also runs the unneeded calls recorded among the needed ones (a forward's
// batch-norm statistics updates). 0 when the calls after it are too few to pay.
size_t read_ahead_point(const std::vector<int>& first, size_t n_calls);

// The hash of the calls recorded so far, extended by one call: its key hash
// and the graph slots of its storages, in the call's storage order.
uint64_t extend_prefix(uint64_t prefix, uint64_t call_hash, std::span<const int> slots);

// A cut point: the hash of a graph's first `nodes` calls and their number.
uint64_t cut_point(uint64_t prefix, size_t nodes);

// Learned read-ahead cut points: where a split read needed exactly the graph's
// first calls, the graph is cut when those calls are recorded again.
class ReadAhead {
 public:
  static constexpr size_t kMaxPoints = 4096;  // cleared when full

  // `prefix_at_k`: the prefix before call k, i.e. the hash of calls [0, k).
  void learn(uint64_t prefix_at_k, size_t k);
  // Before recording call `nodes` of a graph whose calls so far hash to `prefix`.
  bool cut_here(uint64_t prefix, size_t nodes) const;
  bool empty() const { return points_.empty(); }
  size_t size() const { return points_.size(); }

 private:
  std::unordered_set<uint64_t> points_;
};

}  // namespace torchtpu::graph
