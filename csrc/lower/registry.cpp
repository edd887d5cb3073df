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

namespace {
std::unordered_map<std::string, std::vector<int>>& attr_table() {
  static std::unordered_map<std::string, std::vector<int>> t;
  return t;
}
}  // namespace

void attribute_scalars(const std::string& base, std::vector<int> args) {
  attr_table()[base] = std::move(args);
}

const std::vector<int>& attribute_scalars_of(const std::string& base) {
  static const std::vector<int> none;
  auto it = attr_table().find(base);
  return it == attr_table().end() ? none : it->second;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> names;
  for (auto& [k, v] : table()) names.push_back(k);
  return names;
}

}  // namespace torchtpu::lower
