#include "pjrt/tuning.h"

#include <algorithm>
#include <string_view>

namespace torchtpu::pjrt {

CompileOptions TuningOverrides::known(const CompileOptions& o) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (missing_.empty()) return o;
  CompileOptions out = o;
  std::erase_if(out.overrides, [&](const OptionOverride& v) { return missing_.contains(v.name); });
  return out;
}

bool TuningOverrides::learn(const std::string& error, const CompileOptions& o) {
  // XLA's wording when an override names no DebugOptions field.
  static constexpr std::string_view kSays = "No such compile option: '";
  size_t at = error.find(kSays);
  if (at == std::string::npos) return false;
  at += kSays.size();
  size_t end = error.find('\'', at);
  if (end == std::string::npos) return false;
  const std::string name = error.substr(at, end - at);
  if (std::none_of(o.overrides.begin(), o.overrides.end(),
                   [&](const OptionOverride& v) { return v.name == name; }))
    return false;
  std::lock_guard<std::mutex> lock(mu_);
  missing_.insert(name);  // Maybe already learned by a build that raced this one.
  return true;
}

std::set<std::string> TuningOverrides::missing() const {
  std::lock_guard<std::mutex> lock(mu_);
  return missing_;
}

}  // namespace torchtpu::pjrt
