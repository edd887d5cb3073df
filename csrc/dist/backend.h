// The `tpu_dist` c10d backend: every collective of torch.distributed on tpu
// tensors. Ranks first agree on what they are about to run (check.h), then
// the tensors go through a transport (transport.h): host memory and a gloo
// group across processes today; device programs behind the same seam.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <utility>
#include <vector>

namespace torchtpu::dist {

// `host` is a gloo backend over the same ranks (made in Python: gloo's
// headers are not shipped); `store` is the group's store (fault reports).
c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size,
                                               const c10::intrusive_ptr<c10d::Backend>& host,
                                               std::chrono::milliseconds timeout);

// "SUM", "AVG", ...: how errors and fingerprints name a reduce op.
std::string reduce_name(const c10d::ReduceOp& op);

// A Work that is already complete with `outputs` (its future on their tpu
// devices, as DDP comm hooks expect).
c10::intrusive_ptr<c10d::Work> completed_work(const std::vector<at::Tensor>& outputs);

// startCoalescing .. endCoalescing for both backends: their calls run at once,
// and the end's Work carries every call's outputs.
class Coalescing {
 public:
  void start() {
    on_ = true;
    held_.clear();
  }
  c10::intrusive_ptr<c10d::Work> end() {
    auto w = completed_work(held_);
    on_ = false;
    held_.clear();
    return w;
  }
  // A finished call's Work; its outputs are kept for the end while coalescing.
  c10::intrusive_ptr<c10d::Work> done(const std::vector<at::Tensor>& outputs) {
    if (on_) held_.insert(held_.end(), outputs.begin(), outputs.end());
    return completed_work(outputs);
  }

 private:
  bool on_ = false;
  std::vector<at::Tensor> held_;
};

// Per collective kind: calls, payload bytes, bytes copied between host and
// device, and wall seconds inside the call (metrics()["collectives"]).
struct KindCount {
  std::string kind;
  int64_t calls = 0, bytes = 0, host_copy_bytes = 0;
  double seconds = 0;
};
std::vector<KindCount> collective_report();
void count_collective(const std::string& kind, int64_t bytes, int64_t host_copy_bytes,
                      double seconds);
void reset_collective_report();

}  // namespace torchtpu::dist
