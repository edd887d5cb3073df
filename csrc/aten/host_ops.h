// Small integer ops whose shapes keep changing run on the host. Bookkeeping
// such as `generate`'s growing token ids (a `cat` per token, `isin` on the
// last column) would otherwise compile a new program for every length, at
// 60-100 ms each, to move a few bytes. After TORCHTPU_HOST_CHURN (default 2)
// programs of one op and argument structure, further new shapes of it run on
// PyTorch's CPU kernels when every tensor is an integer or bool tensor and the
// storages touched hold at most 64 KiB: the results are the CPU's, exactly. A
// shape that keeps coming back with at most 8 other host runs of its op
// between is compiled after its 8th host run. A growing sequence run again
// (every length coming back once per run, `generate` called once more) is
// worth programs that serve every length: its calls then run bucketed
// (bucketed.h), one program per bucket, and on the host where they cannot.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "aten/op_info.h"
#include "aten/runtime.h"

namespace torchtpu::aten {

// A call without its sizes, strides, offsets and values: the op and each
// argument's kind, dtype, rank and device.
std::string call_signature(const OpInfo& info, const torch::jit::Stack& stack, size_t first,
                           size_t n);
// What a runner does with a call it has no program for (its out= tensors
// already sized).
enum class NewShape {
  Compile,           // compile it (bucketed when its sizes keep changing)
  Host,              // run it on the host (run_on_host)
  BucketedElseHost,  // a growing sequence run again: run it bucketed, one
                     // program per bucket; on the host when it cannot be
};
// Compile for calls that are not small integer calls; else shape_churn.
NewShape new_shape(const OpInfo& info, const torch::jit::Stack& stack, size_t first, size_t n,
                   const std::vector<DeviceStorage*>& storages, const std::string& key);
// Runs the call on PyTorch's CPU kernels, reading and writing the storages
// whole; its results equal the CPU's exactly.
void run_on_host(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                 size_t first, size_t n, const std::vector<DeviceStorage*>& storages);
// Counts a host run of `name` in host_op_report.
void count_host_call(const std::string& name);
// For the new program `key` of `signature` (a call without its sizes):
// Compile while the signature has fewer than TORCHTPU_HOST_CHURN programs,
// or once `key` ran on the host 8 times in a row with at most 8 other host
// runs of the signature between; else Host, or BucketedElseHost once some
// key of the signature came back after more than 8 others.
NewShape shape_churn(const std::string& signature, const std::string& key);
// Sizes read from tensor values (nonzero's count, ...). A fresh output of a
// call in a value-sized kernel, or on a value-sized input, is marked
// value-sized when one of its sizes is such a recent value; Fused Eager runs
// calls on marked storages op by op (Strict), so the counts never enter a
// recorded graph's key and the graphs around them stay cached.
void note_value_size(int64_t n);
// Inside a kernel whose output size depends on values: every call runs Strict.
class ValueSizedScope {
 public:
  ValueSizedScope();
  ~ValueSizedScope();
  ValueSizedScope(const ValueSizedScope&) = delete;
  ValueSizedScope& operator=(const ValueSizedScope&) = delete;
};
// True inside a ValueSizedScope (a value-dependent kernel is running).
bool in_value_sized_scope();
// True inside a ValueSizedScope or when a storage is value-sized.
bool value_sized_call(const std::vector<DeviceStorage*>& storages);
// Storages of the call's arguments that it only reads (not out= or in-place).
std::vector<DeviceStorage*> read_storages(const c10::OperatorHandle& op,
                                          const torch::jit::Stack& stack, size_t first, size_t n);
// Marks the call's outputs (the top `n_returns` of the stack) that are not
// among the storages it read.
void mark_value_sized_outputs(const torch::jit::Stack& stack, size_t n_returns,
                              const std::vector<DeviceStorage*>& read);
// Calls run on the host this way, per op.
std::vector<std::pair<std::string, int64_t>> host_op_report();
void reset_host_op_report();

}  // namespace torchtpu::aten
