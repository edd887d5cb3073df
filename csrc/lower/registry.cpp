#include "lower/registry.h"

#include <unordered_map>

namespace torchtpu::lower {

namespace {
std::unordered_map<std::string, Rule>& table() {
  static std::unordered_map<std::string, Rule> t;
  return t;
}
}  // namespace

void register_rule(const std::string& op, Rule rule) { table()[op] = std::move(rule); }

const Rule* find_rule(const std::string& op) {
  auto it = table().find(op);
  return it == table().end() ? nullptr : &it->second;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> names;
  for (auto& [k, v] : table()) names.push_back(k);
  return names;
}

}  // namespace torchtpu::lower
