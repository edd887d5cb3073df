// Strict and Debug Eager: every op call runs at once as one cached program
// (asynchronously in Strict; Debug waits for it and checks indices and NaNs).
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "aten/op_info.h"

namespace torchtpu::aten {

// Runs `op` through info.rule, writing in-place results into their storages.
void strict_run(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack);

}  // namespace torchtpu::aten
