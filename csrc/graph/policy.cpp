#include "graph/policy.h"

#include <algorithm>

namespace torchtpu::graph {

// Z-function of the reversed history: z[p] is how far the history, read
// backwards from its end, matches itself shifted by p. The live-count test
// rejects repeated layers inside one step: each forward layer leaves several
// more saved values alive, each backward layer several fewer. The drift
// allowance admits a loop that keeps something per step (its loss).
size_t find_period(const std::vector<uint64_t>& h, const std::vector<int64_t>& live) {
  const size_t n = h.size();
  std::vector<uint64_t> r(h.rbegin(), h.rend());
  std::vector<size_t> z(n, 0);
  for (size_t i = 1, l = 0, rr = 0; i < n; ++i) {
    if (i < rr) z[i] = std::min(rr - i, z[i - l]);
    while (i + z[i] < n && r[z[i]] == r[i + z[i]]) ++z[i];
    if (i + z[i] > rr) l = i, rr = i + z[i];
  }
  constexpr size_t kMinPeriod = 8;
  constexpr int64_t kMaxDrift = 2;
  for (size_t p = kMinPeriod; 2 * p <= n; ++p) {
    if (z[p] < p || z[p] + p < n / 2) continue;
    const int64_t drift = live[n - 1] - live[n - 1 - p];
    bool steady = drift >= -kMaxDrift && drift <= kMaxDrift;
    for (size_t i = n - p; i < n && steady; ++i) steady = live[i] - live[i - p] == drift;
    if (steady) return p;
  }
  return 0;
}

// Cut where the fewest pending values are alive (between iterations, so the
// fewest values cross the cut), before a call pair that occurs once per
// period (a pair inside a repeated layer would cut every layer).
std::optional<LoopCut> find_loop_cut(const std::vector<uint64_t>& h,
                                     const std::vector<int64_t>& live) {
  const size_t p = find_period(h, live);
  if (!p) return std::nullopt;
  const size_t n = h.size();
  size_t best = 0;
  for (size_t j = n - p + 1; j < n; ++j) {
    int same = 0;
    for (size_t i = n - p + 1; i < n; ++i) same += h[i] == h[j] && h[i - 1] == h[j - 1];
    if (same != 1) continue;
    if (!best || live[j] < live[best]) best = j;
  }
  if (!best) return std::nullopt;
  return LoopCut{p, h[best - 1], h[best], best};
}

void LoopDetector::reset_after_cut() {
  hist_.clear();
  live_at_.clear();
  since_ = 0;
}

bool LoopDetector::cut_before(uint64_t h) const {
  return active_ && !hist_.empty() && h == loop_.first && hist_.back() == loop_.prev;
}

std::optional<LoopCut> LoopDetector::recorded(uint64_t h, int64_t live_before) {
  hist_.push_back(h);
  live_at_.push_back(live_before);
  const size_t n = hist_.size();
  // A loop whose boundary stopped coming has ended (or was never one).
  if (active_ && n > since_ + 2 * loop_.period) active_ = false;
  if (active_ || n % kDetectEvery != 0) return std::nullopt;
  std::optional<LoopCut> cut = find_loop_cut(hist_, live_at_);
  if (cut) {
    active_ = true;
    loop_ = *cut;
    since_ = n;
  }
  return cut;
}

void partition(const std::vector<CallSlots>& calls, size_t num_slots, int target,
               std::vector<int>& first, std::vector<int>& rest) {
  // Walking backwards: a call is taken when it writes a value the taken calls
  // need, or reads or writes a slot a later taken call writes (running the
  // taken calls first must not change what the others see).
  std::vector<char> need(num_slots, 0), written_later(num_slots, 0), take(calls.size(), 0);
  need[target] = 1;
  for (size_t i = calls.size(); i-- > 0;) {
    const CallSlots& c = calls[i];
    bool t = false;
    for (int s : c.writes) t = t || need[s] || written_later[s];
    for (int s : c.reads) t = t || written_later[s];
    if (!t) continue;
    take[i] = 1;
    for (int s : c.reads) need[s] = 1;
    for (int s : c.writes) written_later[s] = 1;
  }
  for (size_t i = 0; i < calls.size(); ++i) (take[i] ? first : rest).push_back(static_cast<int>(i));
}

bool is_prefix(const std::vector<int>& first) {
  return !first.empty() && static_cast<size_t>(first.back()) == first.size() - 1;
}

// Calls left to run after a needed part: to pay for a second program, and when the
// needed part runs ahead while the host records them.
constexpr size_t kMinRest = 64, kMinRestAhead = 16;

// A second program costs a launch and extra outputs. It pays when the host has
// many calls to record while the rest runs (an MLP step with 29 of 36 calls in
// the rest was slower split, a GPT step with 82 of 151 faster), or when the
// needed part is the graph's first calls, which read-ahead then runs while the
// host records the others (the MLP step is faster split that way).
bool split_pays(const std::vector<int>& first, size_t rest_size, bool read_ahead_on) {
  return rest_size >= (read_ahead_on && is_prefix(first) ? kMinRestAhead : kMinRest);
}

size_t read_ahead_point(const std::vector<int>& first, size_t n_calls) {
  if (first.empty()) return 0;
  const size_t k = static_cast<size_t>(first.back()) + 1;  // `first` is in recording order
  return n_calls >= k + kMinRestAhead ? k : 0;
}

uint64_t extend_prefix(uint64_t prefix, uint64_t call_hash, std::span<const int> slots) {
  prefix = prefix * 0x100000001b3ULL ^ call_hash;
  for (int slot : slots) prefix = prefix * 31 + slot;
  return prefix;
}

uint64_t cut_point(uint64_t prefix, size_t nodes) {
  return prefix ^ (0x9e3779b97f4a7c15ULL * (nodes + 1));
}

void ReadAhead::learn(uint64_t prefix_at_k, size_t k) {
  if (points_.size() >= kMaxPoints) points_.clear();
  points_.insert(cut_point(prefix_at_k, k));
}

bool ReadAhead::cut_here(uint64_t prefix, size_t nodes) const {
  return points_.count(cut_point(prefix, nodes)) > 0;
}

}  // namespace torchtpu::graph
