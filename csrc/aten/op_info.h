// How an ATen op maps onto a lowering rule, derived once per operator from
// its schema: in-place, out= and foreach variants are never written by hand.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lower/registry.h"

namespace torchtpu::aten {

struct ForeachOp;  // foreach.cpp

// The rule of its own name, or of its functional twin (in-place `foo_` ->
// `foo`, out= -> the overload with the same inputs).
struct OpInfo {
  std::string name;                   // "add_.Tensor"
  const lower::Rule* rule = nullptr;  // rule run for this op (maybe the functional twin's)
  const lower::Spec* spec = nullptr;  // the rule's per-op facts (never null when rule is set)
  bool is_out = false;                // has out= arguments
  std::vector<uint8_t> scalar_arg;    // per argument: 1 = Scalar (a runtime input)
  std::vector<int> ret_alias_arg;     // per return: index of the argument it writes, or -1
  // In-place foreach ops (`_foreach_add_`) return nothing: the functional
  // twin's k-th result is written into element k of this Tensor(a!)[] argument.
  int list_write_arg = -1;
  const ForeachOp* foreach = nullptr;  // set for `_foreach_*` ops lowered per element
  // An out= op's functional overload (same non-out arguments), when it has a rule.
  std::optional<c10::OperatorHandle> functional;
};
const OpInfo& op_info(const c10::OperatorHandle& op);
// Whether the op "aten::name.overload" exists and has a rule (its own or its twin's).
bool has_lowering(const std::string& qualified);
// "name.overload" of a schema, without the "aten::" namespace.
std::string op_name(const c10::FunctionSchema& s);

// How a `_foreach_*` op lowers: the rule of its per-element op (`add.Tensor`
// for `_foreach_add.List`) on each element of its lists. Sets scalar_arg for
// Scalar[] arguments the element op takes at run time. Null when no element
// op with a rule matches.
const ForeachOp* foreach_op(const c10::FunctionSchema& s, std::vector<uint8_t>& scalar_arg);
const lower::Rule* foreach_rule(const ForeachOp& f);
// The rule of the element op that a foreach op applies (where it is registered).
const lower::Rule* foreach_element_rule(const ForeachOp& f);

}  // namespace torchtpu::aten
