// Programs from other producers (a JAX export) called from ours: each is
// registered once under a content key and inlined as private functions into
// every program that calls it, through the op `torchtpu::jax_call(Tensor[]
// args, int key) -> Tensor[]`.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hlo/builder.h"

namespace torchtpu::lower {

struct ExternalFunction {
  std::string name;    // what errors call it ("mylib::softmax")
  std::string callee;  // the entry function's symbol in `text`
  std::string text;    // `func.func private` definitions, entry first
  std::vector<hlo::Type> args, results;
};

// Registering a key again replaces nothing: the key names the content.
void register_external(int64_t key, ExternalFunction f);
std::shared_ptr<const ExternalFunction> find_external(int64_t key);

}  // namespace torchtpu::lower
