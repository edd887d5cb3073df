#include "dist/local_rendezvous.h"

#include <c10/util/Exception.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "dist/backend.h"

namespace torchtpu::dist {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void raise(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

}  // namespace

struct Round {
  std::vector<std::optional<Entry>> in;
  int arrived = 0, taken = 0;
  bool done = false;
  // A failure: each rank formats the report from its own side.
  enum { None, Disagree, Missing, Problem } failed = None;
  std::vector<std::string> lines;  // per rank: "#seq description" (or why it is absent)
  std::string error;
  std::vector<Bufs> out;
  Metas metas;
};

class Rendezvous {
 public:
  explicit Rendezvous(std::vector<int> devices)
      : size_(int(devices.size())),
        devices_(std::move(devices)),
        left_(size_),
        mailbox_(make_mailbox(size_)) {}
  int size() const { return size_; }
  const std::vector<int>& devices() const { return devices_; }
  const std::shared_ptr<Mailbox>& mailbox() const { return mailbox_; }

  // Blocks until every rank brought step `step` (0, or 1 for the second
  // round of an uneven all_to_all) of collective `seq`; returns this rank's
  // outputs and every rank's meta.
  Met meet(uint64_t seq, int step, int rank, Entry entry, const Program& prog,
           std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!broken_.empty())
      raise("tpu_local: this group stopped at an earlier failure; collective #" +
            std::to_string(seq) + " on rank " + std::to_string(rank) + " is not run:\n" + broken_);
    const std::pair<uint64_t, int> key{seq, step};
    Round& r = rounds_[key];
    if (r.in.empty()) r.in.resize(size_);
    r.in[rank] = std::move(entry);
    r.arrived++;
    if (r.arrived == size_) {
      settle(r, seq, prog);
      cv_.notify_all();
    } else if (absent_left(r, seq)) {
      cv_.notify_all();
    } else {
      auto deadline = Clock::now() + timeout;
      bool ready = cv_.wait_until(lock, deadline, [&] { return r.done || r.failed; });
      if (!ready) {
        missing(r, seq, "timed out waiting for the other ranks");
        cv_.notify_all();
      }
    }
    r.taken++;
    if (r.failed) {
      std::string msg = report(r, seq, rank, timeout);
      if (broken_.empty()) broken_ = msg;
      raise(msg);
    }
    Met met{r.out.empty() ? Bufs{} : r.out[rank], r.metas};
    if (r.taken == size_) rounds_.erase(key);
    return met;
  }

  void leave(int rank, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    left_[rank] = why.empty() ? "left" : why;
    for (auto& [key, r] : rounds_)
      if (!r.done && !r.failed) absent_left(r, key.first);
    cv_.notify_all();
    mailbox_leave(*mailbox_, rank, left_[rank]);
  }

 private:
  // Every rank is here: agree, then launch once for all.
  void settle(Round& r, uint64_t seq, const Program& prog) {
    for (int k = 0; k < size_; ++k) {
      r.lines.push_back("#" + std::to_string(seq) + " " + r.in[k]->call.describe());
      if (!r.in[k]->problem.empty()) {
        r.failed = Round::Problem;
        r.error += "\n  rank " + std::to_string(k) + ": " + r.in[k]->problem;
      }
    }
    if (r.failed) return;
    const uint64_t h = r.in[0]->call.hash();
    for (int k = 1; k < size_; ++k)
      if (r.in[k]->call.hash() != h) r.failed = Round::Disagree;
    if (r.failed) return;
    for (int k = 0; k < size_; ++k) r.metas.push_back(r.in[k]->meta);
    if (prog.check) {
      std::string bad = prog.check(r.metas);
      if (!bad.empty()) {
        r.failed = Round::Problem;
        r.error = "\n  " + bad;
        return;
      }
    }
    try {
      r.out = launch(r, prog);
    } catch (const std::exception& e) {
      r.failed = Round::Problem;
      r.error = std::string("\n  the device program failed: ") + e.what();
      return;
    }
    r.done = true;
    last_agreed_ = seq;
    last_call_ = r.in[0]->call.describe(true);
  }

  std::vector<Bufs> launch(Round& r, const Program& prog) {
    if (prog.parts.empty()) return {};
    ReplicatedProgram p =
        replicated_program(prog.kind, prog.parts, prog.reduce, prog.dim, prog.dim2, {}, devices_);
    std::vector<std::vector<pjrt::Buffer*>> args(size_);
    for (int k = 0; k < size_; ++k) {
      TORCH_CHECK(r.in[k]->inputs.size() == prog.parts.size(), "rank ", k, " brought ",
                  r.in[k]->inputs.size(), " buffers for ", prog.parts.size(), " parts");
      for (auto& b : r.in[k]->inputs) args[k].push_back(b.get());
    }
    return run_replicated(*p.exe, args);
  }

  // A rank that left the group and is absent from round `seq` fails it now.
  bool absent_left(Round& r, uint64_t seq) {
    for (int k = 0; k < size_; ++k)
      if (!left_[k].empty() && !r.in[k]) {
        missing(r, seq, "rank " + std::to_string(k) + " left the group (" + left_[k] + ")");
        return true;
      }
    return false;
  }

  void missing(Round& r, uint64_t seq, const std::string& why) {
    r.failed = Round::Missing;
    r.error = why;
    r.lines.assign(size_, "");
    for (int k = 0; k < size_; ++k) {
      if (r.in[k])
        r.lines[k] = "#" + std::to_string(seq) + " " + r.in[k]->call.describe();
      else if (!left_[k].empty())
        r.lines[k] =
            "left the group before collective #" + std::to_string(seq) + " (" + left_[k] + ")";
    }
  }

  std::string report(const Round& r, uint64_t seq, int rank, std::chrono::milliseconds timeout) {
    if (r.failed == Round::Disagree)
      return disagreement_report("tpu_local", seq, rank, size_, r.lines);
    if (r.failed == Round::Missing)
      return failure_report("tpu_local", seq, rank, size_, timeout, r.error, r.lines, true,
                            last_agreed_, last_call_);
    std::string s = "tpu_local: collective #" + std::to_string(seq) + " failed on rank " +
                    std::to_string(rank) + " of " + std::to_string(size_) + ":" + r.error;
    for (int k = 0; k < size_; ++k) s += "\n  rank " + std::to_string(k) + " ran " + r.lines[k];
    return s;
  }

  const int size_;
  const std::vector<int> devices_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<uint64_t, int>, Round> rounds_;
  std::vector<std::string> left_;
  std::shared_ptr<Mailbox> mailbox_;
  std::string broken_;  // the first failure: the group runs nothing after it
  uint64_t last_agreed_ = 0;
  std::string last_call_;
};

// The group's rendezvous, held here until every rank joined: a rank may
// finish (and drop its backend) before a slower one joins, which must still
// find it and see that rank gone.
std::shared_ptr<Rendezvous> rendezvous(const std::string& session,
                                       const std::vector<int>& devices) {
  const int size = int(devices.size());
  struct Joining {
    std::shared_ptr<Rendezvous> held;  // until `size` ranks joined
    std::weak_ptr<Rendezvous> weak;
    int joined = 0;
  };
  static std::mutex mu;
  static std::map<std::string, Joining> all;
  std::lock_guard<std::mutex> lock(mu);
  for (auto it = all.begin(); it != all.end();)
    it = !it->second.held && it->second.weak.expired() ? all.erase(it) : std::next(it);
  Joining& j = all[session];
  auto p = j.weak.lock();
  if (p) {
    TORCH_CHECK_VALUE(
        p->devices() == devices, "tpu_local: group '", session, "' runs on devices ",
        c10::IntArrayRef(std::vector<int64_t>(p->devices().begin(), p->devices().end())),
        ", a rank joined with devices ",
        c10::IntArrayRef(std::vector<int64_t>(devices.begin(), devices.end())));
  } else {
    p = std::make_shared<Rendezvous>(devices);
    j = Joining{p, p, 0};
  }
  if (++j.joined >= size) j.held.reset();
  return p;
}

Met meet(Rendezvous& rv, uint64_t seq, int step, int rank, Entry entry, const Program& prog,
         std::chrono::milliseconds timeout) {
  return rv.meet(seq, step, rank, std::move(entry), prog, timeout);
}

void leave(Rendezvous& rv, int rank, const std::string& why) { rv.leave(rank, why); }

const std::shared_ptr<Mailbox>& mailbox(Rendezvous& rv) { return rv.mailbox(); }

}  // namespace torchtpu::dist
