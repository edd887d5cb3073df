// How large the loops of a StableHLO module are, read from its text: the
// runtime picks XLA:CPU's compile settings by it (aten/launch.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "hlo/builder.h"

namespace torchtpu::hlo {

struct ModuleWork {
  // The most elements of a tensor that an elementwise, reduction or
  // data-movement op reads or writes. Gathers and slices count their results
  // (they read what they return); reshapes and @main's arguments count not
  // at all (a reshape of a flat storage is a bitcast).
  int64_t loop = 0;
  // The most elements of a dot or convolution operand or result.
  int64_t dot = 0;
  // Whether an op has a region that XLA emits as more than a loop over its
  // result: reduce, reduce_window, scatter, select_and_scatter, sort, while.
  bool regions = false;
  // Whether every op is IEEE 754 arithmetic that rounds exactly (add, multiply,
  // divide, sqrt, ...), a comparison, a select or data movement: LLVM's loop
  // unrolling and vectorization cannot change such a program's results, so
  // its quick and optimized builds agree bit for bit.
  bool exact = true;
};

// Of a module in the generic form Builder::module() writes (one op a line).
ModuleWork module_work(std::string_view text);

// @main's result types, read from its signature; nullopt when the text has no
// @main or a result type this reader does not know.
std::optional<std::vector<Type>> module_results(std::string_view text);

}  // namespace torchtpu::hlo
