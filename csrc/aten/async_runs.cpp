#include "aten/async_runs.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "aten/runtime.h"

namespace torchtpu::aten::async_runs {

namespace {

// Compile completions: one condition for every entry (waits are short and rare).
std::mutex compiled_mu;
std::condition_variable compiled_cv;

// Wakes the waiters of compiles (an entry's state has just been set).
void compiled() {
  std::lock_guard<std::mutex> lock(compiled_mu);
  compiled_cv.notify_all();
}

// Threads are parked, never joined: at exit wait_idle (atexit) has emptied
// the queues, and the objects are leaked so no destructor races the exit.
class Pool {
 public:
  void submit(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    if (threads_ == 0) {
      threads_ = std::max(1, compile_threads());
      for (int i = 0; i < threads_; ++i) std::thread([this] { work(); }).detach();
    }
    tasks_.push_back(std::move(task));
    cv_.notify_one();
  }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return tasks_.empty() && busy_ == 0; });
  }
  void hold(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = on;
    cv_.notify_all();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !tasks_.empty() && !held_; });
        task = std::move(tasks_.front());
        tasks_.pop_front();
        busy_++;
      }
      task();  // sets its entry's state; never throws
      compiled();
      std::lock_guard<std::mutex> lock(mu_);
      busy_--;
      if (tasks_.empty() && busy_ == 0) idle_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<void()>> tasks_;
  int threads_ = 0, busy_ = 0;
  bool held_ = false;
};

Pool& pool() {
  static auto* p = new Pool();
  return *p;
}

struct Job {
  std::shared_ptr<const Launchable> entry;
  std::vector<pjrt::BufferPtr> args;
  // Weak: a queued run is no holder of its outputs (it would keep them from
  // being donated to the next run); an output nobody holds is not filled.
  std::vector<std::weak_ptr<pjrt::Buffer>> outs;
  int device;
  RunFn run;
};

// One thread hands queued runs to PJRT in the host's order.
class Runner {
 public:
  void push(Job job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { work(); }).detach();
      std::atexit([] { async_runs::wait_idle(); });
    }
    jobs_.push_back(std::move(job));
    pending_.fetch_add(1, std::memory_order_release);
    cv_.notify_one();
  }
  bool busy() const { return pending_.load(std::memory_order_acquire) > 0; }
  void wait_idle() {
    std::unique_lock<std::mutex> lock(mu_);
    idle_.wait(lock, [this] { return pending_.load() == 0; });
  }

 private:
  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      execute(job);
      for (const auto& a : job.args) a->add_queued_uses(-1);
      job = Job{};  // drops the arguments before the count says idle
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) idle_.notify_all();
    }
  }
  static void execute(Job& job) {
    const Launchable& e = *job.entry;
    wait_compiled(e);
    const std::string what = e.what.empty() ? "a program" : e.what;
    std::string error;
    if (e.state.load(std::memory_order_acquire) == Launchable::Failed) {
      error = "[tpu] compiling " + what + " failed: " + e.compile_error;
    } else {
      try {
        std::vector<pjrt::BufferPtr> made = job.run(e, job.args, job.device);
        for (size_t i = 0; i < job.outs.size() && i < made.size(); ++i)
          if (pjrt::BufferPtr out = job.outs[i].lock()) out->fill(*made[i]);
        if (made.size() != job.outs.size())
          error = "[tpu] " + what + ": the program returned " + std::to_string(made.size()) +
                  " outputs, its text names " + std::to_string(job.outs.size());
      } catch (const std::exception& err) {
        error = err.what();  // an argument's producer failed, or PJRT refused the run
      }
    }
    if (!error.empty())
      for (auto& o : job.outs)
        if (pjrt::BufferPtr out = o.lock()) out->fail(error);
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Job> jobs_;
  std::atomic<int64_t> pending_{0};
  bool started_ = false;
};

Runner& runner() {
  static auto* r = new Runner();
  return *r;
}

}  // namespace

bool enabled() {
  static const bool on = env_default_on("TORCHTPU_ASYNC_COMPILE");
  return on;
}

int compile_threads() {
  static const int n = env_int("TORCHTPU_COMPILE_THREADS",
                               std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  return n;
}

void submit_compile(std::function<void()> task) { pool().submit(std::move(task)); }

void wait_compiled(const Launchable& e) {
  if (e.state.load(std::memory_order_acquire) != Launchable::Compiling) return;
  std::unique_lock<std::mutex> lock(compiled_mu);
  compiled_cv.wait(
      lock, [&] { return e.state.load(std::memory_order_acquire) != Launchable::Compiling; });
}

std::vector<pjrt::BufferPtr> enqueue(std::shared_ptr<const Launchable> e,
                                     std::vector<pjrt::BufferPtr> args, int device, RunFn run) {
  std::vector<pjrt::BufferPtr> outs;
  outs.reserve(e->results.size());
  for (const auto& [dtype, dims] : e->results)
    outs.push_back(pjrt::Buffer::placeholder(client_ptr(), dtype, dims));
  for (const auto& a : args) a->add_queued_uses(1);
  runner().push(Job{std::move(e), std::move(args), {outs.begin(), outs.end()}, device, run});
  return outs;
}

bool busy() { return runner().busy(); }

void wait_idle() {
  runner().wait_idle();
  pool().wait_idle();
}

void hold(bool on) { pool().hold(on); }

}  // namespace torchtpu::aten::async_runs
