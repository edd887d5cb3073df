#include "dist/check.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

namespace torchtpu::dist {
namespace {

constexpr size_t kHashBytes = 16;   // sequence number + hash
constexpr size_t kTextBytes = 496;  // + the description, when names are needed

std::string signature(const at::Tensor& t) {
  std::ostringstream s;
  s << c10::toString(t.scalar_type()) << "[";
  for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  s << "]";
  return s.str();
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string first_line(const std::string& s) {
  auto n = s.find('\n');
  return n == std::string::npos ? s : s.substr(0, n);
}

[[noreturn]] void raise(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

}  // namespace

std::string Call::describe(bool bare) const {
  std::ostringstream s;
  s << kind;
  if (!detail.empty()) s << "(" << detail << ")";
  constexpr size_t kShown = 3;
  for (size_t i = 0; i < tensors.size() && i < kShown; ++i) s << " " << signature(tensors[i]);
  if (tensors.size() > kShown) s << " ... (" << tensors.size() << " tensors)";
  if (!bare && !where.empty()) s << " at " << where;
  return s.str();
}

uint64_t Call::hash() const {
  std::string all = kind + "|" + detail;
  for (auto& t : tensors) all += "|" + signature(t);
  return fnv1a(all);
}

Checker::Checker(c10::intrusive_ptr<c10d::Backend> host, c10::intrusive_ptr<c10d::Store> store,
                 int rank, int size, std::chrono::milliseconds timeout, bool detail)
    : host_(std::move(host)),
      store_(std::move(store)),
      rank_(rank),
      size_(size),
      timeout_(timeout),
      detail_(detail) {}

// One allgather of [seq, hash, text?] over the host group; returns each
// rank's record as raw bytes.
std::vector<std::string> Checker::exchange(uint64_t seq, const Call& call, size_t bytes,
                                           bool with_text) {
  auto opts = at::TensorOptions().dtype(at::kByte);
  at::Tensor mine = at::empty({int64_t(bytes)}, opts).zero_();
  auto* p = mine.data_ptr<uint8_t>();
  uint64_t h = call.hash();
  std::memcpy(p, &seq, 8);
  std::memcpy(p + 8, &h, 8);
  if (with_text) {
    std::string text = call.describe();
    std::memcpy(p + kHashBytes, text.data(), std::min(text.size(), bytes - kHashBytes - 1));
  }
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < size_; ++r) outs[0].push_back(at::empty({int64_t(bytes)}, opts));
  std::vector<at::Tensor> ins{mine};
  try {
    host_->allgather(outs, ins)->wait();
  } catch (const std::exception& e) {
    fail(seq, call, e.what());
  }
  std::vector<std::string> records;
  for (auto& t : outs[0]) records.emplace_back(reinterpret_cast<const char*>(t.data_ptr()), bytes);
  return records;
}

void Checker::agree(uint64_t seq, const Call& call) {
  size_t bytes = detail_ ? kHashBytes + kTextBytes : kHashBytes;
  auto records = exchange(seq, call, bytes, detail_);
  bool same = std::all_of(records.begin(), records.end(), [&](const std::string& r) {
    return r.compare(0, kHashBytes, records[0], 0, kHashBytes) == 0;
  });
  if (same) {
    last_agreed_ = seq;
    last_call_ = call.describe();
    return;
  }
  // Every rank saw the same records, so every rank takes this branch: fetch
  // the descriptions (if not already exchanged) and stop together.
  if (!detail_) records = exchange(seq, call, kHashBytes + kTextBytes, true);
  std::vector<std::string> lines;
  for (int r = 0; r < size_; ++r) {
    uint64_t their_seq;
    std::memcpy(&their_seq, records[r].data(), 8);
    lines.push_back("#" + std::to_string(their_seq) + " " +
                    std::string(records[r].c_str() + kHashBytes));
  }
  raise(disagreement_report("tpu_dist", seq, rank_, size_, lines));
}

void Checker::fail(uint64_t seq, const Call& call, const std::string& error) {
  const std::string key = "tpu_dist_fault/" + std::to_string(seq) + "/";
  std::vector<std::string> seen(size_);
  bool store_ok = true;
  try {
    std::string mine = call.describe();
    store_->set(key + std::to_string(rank_), std::vector<uint8_t>(mine.begin(), mine.end()));
    // Survivors fail at about the same time; give them a moment to post.
    auto deadline =
        std::chrono::steady_clock::now() + std::min(timeout_, std::chrono::milliseconds(5000));
    for (;;) {
      int missing = 0;
      for (int r = 0; r < size_; ++r) {
        if (!seen[r].empty()) continue;
        if (store_->check({key + std::to_string(r)})) {
          auto v = store_->get(key + std::to_string(r));
          seen[r].assign(v.begin(), v.end());
        } else {
          ++missing;
        }
      }
      if (!missing || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception&) {
    store_ok = false;
  }
  for (auto& v : seen)
    if (!v.empty()) v = "#" + std::to_string(seq) + " " + v;
  raise(failure_report("tpu_dist", seq, rank_, size_, timeout_, first_line(error), seen, store_ok,
                       last_agreed_, last_call_));
}

std::string disagreement_report(const std::string& backend, uint64_t seq, int rank, int size,
                                const std::vector<std::string>& lines) {
  std::ostringstream s;
  s << backend << ": ranks disagree on collective #" << seq << " (rank " << rank << " of " << size
    << " reporting); every rank stops here:";
  for (size_t r = 0; r < lines.size(); ++r) s << "\n  rank " << r << ": " << lines[r];
  s << "\nEvery rank must issue the same collectives in the same order with the same "
       "shapes and dtypes (rank-specific work between collectives is fine).";
  return s.str();
}

std::string failure_report(const std::string& backend, uint64_t seq, int rank, int size,
                           std::chrono::milliseconds timeout, const std::string& error,
                           const std::vector<std::string>& seen, bool known, uint64_t last_agreed,
                           const std::string& last_call) {
  std::ostringstream s;
  s << backend << ": collective #" << seq << " failed on rank " << rank << " of " << size
    << " after waiting at most " << timeout.count() / 1000.0 << " s: " << error;
  for (int r = 0; r < size; ++r) {
    s << "\n  rank " << r << ": ";
    if (!seen[r].empty()) {
      s << seen[r];
    } else if (!known) {
      s << "unknown (the store is unreachable)";
    } else {
      s << "did not reach collective #" << seq << " (exited, stuck, or running other code)";
      if (last_agreed) s << "; its last agreed collective was #" << last_agreed;
    }
  }
  if (last_agreed)
    s << "\nLast collective every rank agreed on: #" << last_agreed << " " << last_call;
  s << "\nThe timeout is TORCHTPU_DIST_TIMEOUT seconds (or init_process_group(timeout=...) "
       "when shorter).";
  return s.str();
}

}  // namespace torchtpu::dist
