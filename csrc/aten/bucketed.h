// Bucketed eager calls: an op whose sizes keep changing from call to call (a
// growing KV cache's `cat`, the attention `bmm`s and softmax over it) runs at
// bucket sizes with the real sizes as runtime values, so one program serves
// every length up to its bucket. Inputs are read as bucket-sized boxes with a
// gather over their runtime geometry; ops that mix values along a padded dim
// see it filled with their neutral element; results are written back
// compacted (contiguous, exact sizes) into storages that hold the bucket's
// capacity, so the next call's inputs have the same storage size too.
// TORCHTPU_EAGER_BUCKETS=0 turns it off.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/FunctionRef.h>

#include "aten/op_info.h"
#include "aten/program.h"

namespace torchtpu::aten {

// Called where Strict would compile a new program for `call`. Runs the call
// bucketed and returns true when its op is one of the bucketed kinds
// (pointwise, sums/max/min/all/any, softmax, mm/bmm, cat), its outputs are
// fresh and some input dim has changed size since the op's first call of this
// structure, or when (any op) an input is a view that keeps moving in a
// storage a bucketed call wrote; else returns false (and nothing ran). It
// also returns false for a call whose exact sizes came back in each of the
// last few steps (host syncs): a loop's static shape gets its exact program.
// `before` runs once the call qualifies, before its storages are read, and
// may hand it back by returning false (Fused Eager cuts its graph there, so
// the graphs around such calls keep static keys).
bool run_bucketed(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                  const CallKey& call, c10::function_ref<bool()> before = nullptr);

// Strict built an exact program for `key`: once the program table has dropped
// it, run_bucketed declines the key at once (it is rebuilt exact, not judged
// afresh as a changing shape).
void note_exact_program(const std::string& key);

}  // namespace torchtpu::aten
