#include "dist/local_p2p.h"

#include <c10/util/Exception.h>

#include <condition_variable>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "dist/backend.h"

namespace torchtpu::dist {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void raise(const std::string& msg) { C10_THROW_ERROR(DistBackendError, msg); }

// One send or receive, from its post until it was matched with its peer
// (posts match in order: the oldest fitting one of the other kind).
struct Post {
  int src = 0, dst = 0, tag = 0;  // src < 0: a receive from any rank
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> sizes;
  std::string where, what;  // the caller's line; how errors about it start
  pjrt::BufferPtr buf;      // a send's snapshot; a receive's letter once matched
  int from = -1;            // a receive: the sender once matched
  bool matched = false;
  std::string error;  // a mismatch, on both sides

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }
  std::string describe() const {
    return c10::str(dtype, c10::IntArrayRef(sizes), where.empty() ? "" : " at " + where);
  }
  bool fits(const Post& send) const {
    return send.dst == dst && send.tag == tag && (src < 0 || send.src == src);
  }
};
using PostPtr = std::shared_ptr<Post>;

std::string secs(std::chrono::milliseconds ms) { return c10::str(ms.count() / 1000.0, " s"); }

}  // namespace

class Mailbox {
 public:
  explicit Mailbox(int size) : left_(size) {}

  void send(const PostPtr& s) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it)
      if ((*it)->fits(*s)) {
        match(*s, **it);
        recvs_.erase(it);
        return;
      }
    sends_.push_back(s);
  }

  void recv(const PostPtr& r) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = sends_.begin(); it != sends_.end(); ++it)
      if (r->fits(**it)) {
        match(**it, *r);
        sends_.erase(it);
        return;
      }
    recvs_.push_back(r);
  }

  // True once `p` (a send or receive) was matched; false while it waits (when
  // not `block`). Throws on a mismatch, when the peer left, or when nothing
  // matched within `timeout` (the post is withdrawn then).
  bool await(const PostPtr& p, bool is_send, bool block, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto settled = [&] { return p->matched || gone(*p, is_send); };
    if (block)
      cv_.wait_until(lock, Clock::now() + timeout, settled);
    else if (!settled())
      return false;
    if (p->matched && !p->error.empty()) raise(p->error);
    if (p->matched) return true;
    (is_send ? sends_ : recvs_).remove(p);
    if (gone(*p, is_send)) {
      const int peer = is_send ? p->dst : p->src;
      raise(c10::str(p->what, ": ",
                     peer >= 0 ? c10::str("rank ", peer, " left the group (", left_[peer], ")")
                               : std::string("every other rank left the group"),
                     is_send ? " without receiving it" : " without sending it"));
    }
    std::string pending;
    for (auto& o : is_send ? recvs_ : sends_)
      if (o->dst == p->dst)
        pending +=
            is_send ? c10::str("\n  rank ", o->dst, " waits in ", o->what)
                    : c10::str("\n  rank ", o->src, " sent ", o->describe(), " with tag ", o->tag);
    raise(c10::str(
        p->what, is_send ? ": not received within " : ": nothing arrived within ", secs(timeout),
        pending.empty()
            ? c10::str("; no ", is_send ? "recv on" : "send to", " rank ", p->dst, " is waiting")
            : c10::str(" (check src and tag); waiting for rank ", p->dst, ":", pending)));
  }

  void leave(int rank, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    left_[rank] = why.empty() ? "left" : why;
    cv_.notify_all();
  }

 private:
  void match(Post& s, Post& r) {
    s.matched = r.matched = true;
    r.from = s.src;
    if (s.dtype != r.dtype || s.numel() != r.numel())
      s.error = r.error =
          c10::str("tpu_local: rank ", r.dst, " receives ", r.describe(), " from rank ", s.src,
                   " (tag ", s.tag, "), but rank ", s.src, " sent ", s.describe(),
                   ": a send and its recv need the same dtype and number of elements");
    else
      r.buf = s.buf;
    cv_.notify_all();
  }

  bool gone(const Post& p, bool is_send) const {
    if (is_send) return !left_[p.dst].empty();
    if (p.src >= 0) return !left_[p.src].empty();
    for (size_t k = 0; k < left_.size(); ++k)
      if (int(k) != p.dst && left_[k].empty()) return false;
    return true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::list<PostPtr> sends_, recvs_;  // not matched yet, oldest first
  std::vector<std::string> left_;
};

namespace {

// A send or receive: `step(block)` finishes it (true) or says it cannot yet
// (false, only when not blocking). Its error is kept and raised by wait().
class P2PWork final : public c10d::Work {
 public:
  P2PWork(int rank, c10d::OpType type, at::Tensor t) : Work(rank, type), tensor_(std::move(t)) {}
  void set_step(std::function<bool(bool)> step) { step_ = std::move(step); }

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(run_mu_);
    if (!done_) run(false);
    return done_;
  }
  bool isSuccess() const override { return done_ && !error_; }
  int sourceRank() const override { return source_; }
  std::vector<at::Tensor> result() override { return {tensor_}; }
  bool wait(std::chrono::milliseconds) override {
    std::lock_guard<std::mutex> lock(run_mu_);
    if (!done_) run(true);
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    wait(kNoTimeout);
    return completed_work({tensor_})->getFuture();
  }
  void set_source(int src) { source_ = src; }

 private:
  void run(bool block) {
    try {
      done_ = step_(block);
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }
  at::Tensor tensor_;
  std::function<bool(bool)> step_;
  std::mutex run_mu_;
  bool done_ = false;
  std::exception_ptr error_;
  int source_ = -1;
};

PostPtr post(const PointToPoint& p, const at::Tensor& t, int src, int dst, int tag) {
  auto q = std::make_shared<Post>();
  q->src = src;
  q->dst = dst;
  q->tag = tag;
  q->dtype = t.scalar_type();
  q->sizes = t.sizes().vec();
  q->where = p.where;
  const std::string at = p.where.empty() ? "" : " at " + p.where;
  q->what = src == p.rank
                ? c10::str("tpu_local: send of ", q->describe(), " (rank ", src, " to rank ", dst,
                           ", tag ", tag, ")")
                : c10::str("tpu_local: recv (rank ", dst,
                           src < 0 ? std::string(" from any rank") : c10::str(" from rank ", src),
                           ", tag ", tag, ")", at);
  return q;
}

}  // namespace

std::shared_ptr<Mailbox> make_mailbox(int size) { return std::make_shared<Mailbox>(size); }

void mailbox_leave(Mailbox& box, int rank, const std::string& why) { box.leave(rank, why); }

c10::intrusive_ptr<c10d::Work> local_send(const PointToPoint& p, const at::Tensor& t,
                                          pjrt::BufferPtr buf, int dst, int tag) {
  PostPtr s = post(p, t, p.rank, dst, tag);
  s->buf = std::move(buf);
  p.box->send(s);
  const int64_t bytes = t.numel() * t.element_size();
  auto start = Clock::now();
  auto work = c10::make_intrusive<P2PWork>(p.rank, c10d::OpType::SEND, t);
  work->set_step([box = p.box, s, timeout = p.timeout, bytes, start](bool block) {
    if (!box->await(s, true, block, timeout)) return false;
    std::chrono::duration<double> took = Clock::now() - start;
    count_collective("send", bytes, 0, took.count());
    return true;
  });
  return work;
}

c10::intrusive_ptr<c10d::Work> local_recv(
    const PointToPoint& p, const at::Tensor& t, int src, int tag,
    std::function<void(at::Tensor&, const pjrt::BufferPtr&)> assign) {
  PostPtr r = post(p, t, src, p.rank, tag);
  p.box->recv(r);
  auto start = Clock::now();
  auto work = c10::make_intrusive<P2PWork>(p.rank, c10d::OpType::RECV, t);
  P2PWork* self = work.get();  // the step lives in the Work it points to
  work->set_step([p, t, r, start, self, assign = std::move(assign)](bool block) {
    if (!p.box->await(r, false, block, p.timeout)) return false;
    try {
      at::Tensor dst = t;
      assign(dst, r->from == p.rank ? r->buf : r->buf->copy_to_device(p.device));
    } catch (const std::exception& e) {
      raise(c10::str(r->what, ": the copy from tpu:", r->from, " failed: ", e.what()));
    }
    r->buf = nullptr;
    self->set_source(r->from);
    std::chrono::duration<double> took = Clock::now() - start;
    count_collective("recv", t.numel() * t.element_size(), 0, took.count());
    return true;
  });
  return work;
}

}  // namespace torchtpu::dist
