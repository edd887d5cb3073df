#include "lower/registry.h"

#include <unordered_map>

namespace torchtpu::lower {

namespace {
struct Entry {
  Rule rule;
  std::source_location loc;
};
// Node-based: find_rule's pointers stay valid as rules are added.
std::unordered_map<std::string, Entry>& table() {
  static std::unordered_map<std::string, Entry> t;
  return t;
}
}  // namespace

void register_rule(const std::string& op, Rule rule, std::source_location loc) {
  table()[op] = Entry{std::move(rule), loc};
}

Value Ctx::flat_list(int i) {
  std::vector<Value> parts;
  for (const Value& v : list(i)) parts.push_back(b.reshape(v, {v.type.numel()}));
  return parts.size() == 1 ? parts[0] : b.concatenate(parts, 0);
}

const Rule* find_rule(const std::string& op) {
  auto it = table().find(op);
  return it == table().end() ? nullptr : &it->second.rule;
}

std::optional<std::pair<std::string, int>> rule_location(const Rule* rule) {
  for (const auto& [name, e] : table())
    if (&e.rule == rule)
      return std::pair{std::string(e.loc.file_name()), static_cast<int>(e.loc.line())};
  return std::nullopt;
}

std::vector<std::string> registered_ops() {
  std::vector<std::string> names;
  for (auto& [k, v] : table()) names.push_back(k);
  return names;
}

}  // namespace torchtpu::lower
