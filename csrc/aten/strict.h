// Strict and Debug Eager: every op call runs at once as one cached program
// (asynchronously in Strict; Debug waits for it and checks indices and NaNs).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <vector>

#include "aten/op_info.h"
#include "aten/program.h"

namespace torchtpu::aten {

// A call's program inputs from its stack and storages; `extras` are the
// runner-computed scalars (ScalarSource::extra) of a bucketed call.
class StackFeed final : public InputFeed {
 public:
  StackFeed(const ProgramEntry& e, const CallKey& call, const torch::jit::Stack& stack, int device,
            std::vector<int64_t> extras = {});
  pjrt::BufferPtr storage(int slot) override;
  pjrt::BufferPtr host(const InputSource& in) override;
  void rng(const InputSource& in, uint64_t state[2]) override;
  c10::Scalar scalar(const ScalarSource& s) override;

 private:
  const ProgramEntry& e_;
  const CallKey& call_;
  const torch::jit::Stack& stack_;
  int device_;
  std::vector<int64_t> extras_;
};

// Runs `op` through info.rule, writing in-place results into their storages.
void strict_run(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack);

}  // namespace torchtpu::aten
