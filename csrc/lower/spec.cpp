#include "lower/spec.h"

#include <unordered_map>

namespace torchtpu::lower {

namespace {
std::unordered_map<std::string, Spec>& specs() {
  static std::unordered_map<std::string, Spec> t;
  return t;
}
}  // namespace

void spec(const std::string& base, Spec s) { specs()[base] = std::move(s); }

const Spec& spec_of(const std::string& base) {
  static const Spec none;
  auto it = specs().find(base);
  return it == specs().end() ? none : it->second;
}

std::string base_name(const std::string& op) {
  std::string base = op.substr(0, op.find('.'));
  if (base.size() > 1 && base.back() == '_') base.pop_back();
  return base;
}

}  // namespace torchtpu::lower
