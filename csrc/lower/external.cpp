// torchtpu::jax_call: inlines a registered external function into the program
// being built and calls it, so a JAX kernel joins the surrounding Fused graph
// or compiled program instead of running beside it.
#include "lower/external.h"

#include <mutex>
#include <unordered_map>

#include "lower/helpers.h"

namespace torchtpu::lower {
namespace {

std::mutex mu;
std::unordered_map<int64_t, std::shared_ptr<const ExternalFunction>>& table() {
  static auto* t = new std::unordered_map<int64_t, std::shared_ptr<const ExternalFunction>>();
  return *t;
}

std::string types_str(const std::vector<Value>& vs) {
  std::string s;
  for (const Value& v : vs) s += (s.empty() ? "" : ", ") + v.type.str();
  return s;
}

}  // namespace

void register_external(int64_t key, ExternalFunction f) {
  std::lock_guard<std::mutex> lock(mu);
  table().try_emplace(key, std::make_shared<const ExternalFunction>(std::move(f)));
}

std::shared_ptr<const ExternalFunction> find_external(int64_t key) {
  std::lock_guard<std::mutex> lock(mu);
  auto it = table().find(key);
  return it == table().end() ? nullptr : it->second;
}

TPU_LOWERING(external) {
  reg("torchtpu::jax_call", [](Ctx& c) -> std::vector<Value> {
    auto f = find_external(c.i64(1));
    if (!f)
      throw hlo::BuildError("[torchtpu::jax_call] no function registered under key " +
                            std::to_string(c.i64(1)) + " (define it with torchtpu.jax_op)");
    std::vector<Value> args = c.list(0);
    bool same = args.size() == f->args.size();
    for (size_t i = 0; same && i < args.size(); ++i) same = args[i].type == f->args[i];
    if (!same) {
      std::string want;
      for (const auto& t : f->args) want += (want.empty() ? "" : ", ") + t.str();
      throw hlo::BuildError("[" + f->name + "] was exported for (" + want + "), called with (" +
                            types_str(args) + ")");
    }
    c.b.add_functions(f->callee, f->text);
    return c.b.call(f->callee, args, f->results);
  });
}

}  // namespace torchtpu::lower
