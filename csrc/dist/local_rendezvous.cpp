#include "dist/local_rendezvous.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "aten/fused.h"
#include "aten/launch.h"
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
  bool differ = false;  // prebuilt programs that differ: none ran, no failure
  std::vector<Bufs> out;
  Metas metas;
};

class Rendezvous {
 public:
  Rendezvous(std::vector<int> devices, int64_t tag, std::chrono::milliseconds timeout)
      : size_(int(devices.size())),
        devices_(std::move(devices)),
        tag_(tag),
        timeout_(timeout),
        left_(size_),
        spmd_seq_(size_, 0),
        mailbox_(make_mailbox(size_)) {}
  int size() const { return size_; }
  int64_t tag() const { return tag_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // The next SPMD program number of `rank` (rounds of their own, step 2).
  uint64_t next_spmd(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    return ++spmd_seq_[rank];
  }
  const std::vector<int>& devices() const { return devices_; }
  const std::shared_ptr<Mailbox>& mailbox() const { return mailbox_; }

  // Blocks until every rank brought step `step` (0, or 1 for the second
  // round of an uneven all_to_all) of collective `seq`; returns this rank's
  // outputs and every rank's meta.
  Met meet(uint64_t seq, int step, int rank, Entry entry, const Program& prog,
           std::chrono::milliseconds timeout) {
    // A finished round dies after the lock is released: its calls hold the
    // ranks' tensors, and their frees run storage hooks, which must not run
    // under a lock that ranks holding their graphs wait for.
    std::optional<Round> dead;
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
    const bool last = ++r.taken == size_;
    std::string failure;
    Met met;
    if (r.failed) {
      failure = report(r, seq, rank, timeout);
      if (broken_.empty()) broken_ = failure;
    } else {
      met = Met{r.out.empty() ? Bufs{} : r.out[rank], r.metas};
      if (r.differ) met.differ = disagreement_report("tpu_local", seq, rank, size_, r.lines);
    }
    if (last) {
      dead.emplace(std::move(r));
      rounds_.erase(key);
    }
    if (!failure.empty()) raise(failure);
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
    if (r.failed && prog.exe) {
      // The ranks' graphs differ; they run their collectives one by one instead.
      r.failed = Round::None;
      r.differ = r.done = true;
      for (int k = 0; k < size_; ++k) r.metas.push_back(r.in[k]->meta);
      return;
    }
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
    if (prog.parts.empty() && !prog.exe) return {};
    pjrt::ExecutablePtr exe = prog.exe;
    if (!exe)
      exe =
          replicated_program(prog.kind, prog.parts, prog.reduce, prog.dim, prog.dim2, {}, devices_)
              .exe;
    std::vector<std::vector<pjrt::Buffer*>> args(size_);
    for (int k = 0; k < size_; ++k) {
      TORCH_CHECK(prog.exe || r.in[k]->inputs.size() == prog.parts.size(), "rank ", k, " brought ",
                  r.in[k]->inputs.size(), " buffers for ", prog.parts.size(), " parts");
      for (auto& b : r.in[k]->inputs) args[k].push_back(b.get());
    }
    return run_replicated(*exe, args);
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
      else if (std::string w = aten::rank_wait(devices_[k]); !w.empty())
        r.lines[k] = "did not reach collective #" + std::to_string(seq) + ": " + w;
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
  const int64_t tag_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<uint64_t, int>, Round> rounds_;
  std::vector<std::string> left_;
  std::vector<uint64_t> spmd_seq_;
  std::shared_ptr<Mailbox> mailbox_;
  std::string broken_;  // the first failure: the group runs nothing after it
  uint64_t last_agreed_ = 0;
  std::string last_call_;
};

// The group's rendezvous, held here until every rank joined: a rank may
// finish (and drop its backend) before a slower one joins, which must still
// find it and see that rank gone.
namespace {

std::mutex g_tags_mu;
std::map<int64_t, std::weak_ptr<Rendezvous>>& tags() {
  static auto* all = new std::map<int64_t, std::weak_ptr<Rendezvous>>();
  return *all;
}

// Runs one rank's part of a replicated program: the group's ranks meet as for
// a collective, agreeing on the program (its text's hash), and the last to
// arrive runs it for all.
std::vector<pjrt::BufferPtr> run_spmd(const aten::Launchable& e,
                                      const std::vector<pjrt::BufferPtr>& args, int device,
                                      const std::string& what) {
  std::shared_ptr<Rendezvous> rv;
  {
    std::lock_guard<std::mutex> lock(g_tags_mu);
    auto it = tags().find(e.replica_group);
    if (it != tags().end()) rv = it->second.lock();
  }
  if (!rv)
    raise("tpu_local: an SPMD program of a process group that no longer exists (" + what + ")");
  const auto& devs = rv->devices();
  const int rank = int(std::find(devs.begin(), devs.end(), device) - devs.begin());
  if (rank == rv->size())
    raise("tpu_local: an SPMD program of a group without tpu:" + std::to_string(device) + " (" +
          what + ")");
  char hash[24];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(e.replica_key));
  Entry entry{
      Call{"SPMD program", what + ", program " + hash, {}, ""}, args, {int64_t{e.replica_single}}};
  if (auto* where = aten::caller_location()) entry.call.where = *where;
  Program prog;
  prog.exe = e.exe;
  // The other ranks may need the GIL to reach their flush (this one can come
  // from any op, some called with the GIL held).
  Met met;
  const uint64_t seq = rv->next_spmd(rank);
  aten::run_without_gil(
      [&] { met = rv->meet(seq, 2, rank, std::move(entry), prog, rv->timeout()); });
  if (met.differ.empty()) return met.out;
  // Every rank brought one collective alone, and they differ: a real mismatch.
  if (std::all_of(met.metas.begin(), met.metas.end(),
                  [](const auto& m) { return !m.empty() && m[0] == 1; }))
    raise(met.differ);
  throw aten::ProgramsDiffer(met.differ);
}

struct RegisterRunner {
  RegisterRunner() { aten::set_replicated_runner(&run_spmd); }
} register_runner;

}  // namespace

int64_t group_tag(const Rendezvous& rv) { return rv.tag(); }

std::shared_ptr<Rendezvous> rendezvous(const std::string& session, const std::vector<int>& devices,
                                       std::chrono::milliseconds timeout) {
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
    static int64_t next_tag = 0;
    p = std::make_shared<Rendezvous>(devices, next_tag++, timeout);
    j = Joining{p, p, 0};
    std::lock_guard<std::mutex> tl(g_tags_mu);
    for (auto it = tags().begin(); it != tags().end();)
      it = it->second.expired() ? tags().erase(it) : std::next(it);
    tags()[p->tag()] = p;
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
