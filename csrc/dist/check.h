// Never a silent hang: before each collective the ranks exchange a
// fingerprint of the call (kind, sequence number, reduce op, root, dtypes,
// shapes) and only then move data. A mismatch, or a rank that does not
// arrive within the timeout, ends every surviving rank with an error that
// names each rank's collective, its sequence number and its Python line.
#pragma once
#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <vector>

namespace torchtpu::dist {

// What one rank is about to run.
struct Call {
  std::string kind;                 // "all_reduce", "broadcast", ...
  std::string detail;               // reduce op, root, split sizes: must match across ranks
  std::vector<at::Tensor> tensors;  // the payload; dtypes and shapes must match
  std::string where;                // Python "file:line" that issued it, if known

  // "all_reduce(SUM) float32[4, 8] at train.py:42" (without `where` when `bare`).
  std::string describe(bool bare = false) const;
  uint64_t hash() const;
};

// The error text both backends raise. A disagreement: `lines[r]` is rank r's
// "#seq description". A failed or timed-out collective: `seen[r]` is what rank
// r was running ("#seq description"), empty when it never arrived; `known`
// false when that could not be found out.
std::string disagreement_report(const std::string& backend, uint64_t seq, int rank, int size,
                                const std::vector<std::string>& lines);
std::string failure_report(const std::string& backend, uint64_t seq, int rank, int size,
                           std::chrono::milliseconds timeout, const std::string& error,
                           const std::vector<std::string>& seen, bool known, uint64_t last_agreed,
                           const std::string& last_call);

class Checker {
 public:
  // `host`: the group used for the exchange; `store`: where ranks post what
  // they were doing when a collective fails; `detail` exchanges the full
  // description every time (TORCH_DISTRIBUTED_DEBUG=DETAIL), else a hash.
  Checker(c10::intrusive_ptr<c10d::Backend> host, c10::intrusive_ptr<c10d::Store> store, int rank,
          int size, std::chrono::milliseconds timeout, bool detail);

  // Returns once every rank announced the same call as collective `seq`;
  // throws c10::DistBackendError otherwise.
  void agree(uint64_t seq, const Call& call);
  // A collective that failed after agreement (a rank left mid-transfer):
  // gathers what each rank was doing through the store and throws.
  [[noreturn]] void fail(uint64_t seq, const Call& call, const std::string& error);

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::vector<std::string> exchange(uint64_t seq, const Call& call, size_t bytes, bool with_text);

  c10::intrusive_ptr<c10d::Backend> host_;
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  bool detail_;
  uint64_t last_agreed_ = 0;
  std::string last_call_;
};

}  // namespace torchtpu::dist
