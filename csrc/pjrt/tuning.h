// Per-compile overrides that tune a build, never its results, kept working
// across plugins built from other XLA versions.
#pragma once

#include <mutex>
#include <set>
#include <string>

#include "pjrt/pjrt.h"

namespace torchtpu::pjrt {

// A plugin built from another XLA may lack a DebugOptions field that an
// override names (the compile fails with "No such compile option: 'name'").
// Such a build goes on without that override, and later builds leave it out.
class TuningOverrides {
 public:
  // `o` less the overrides this plugin was found to lack.
  CompileOptions known(const CompileOptions& o) const;
  // True, and the override is remembered as missing, when `error` (a compile
  // error) names one of `o`'s overrides: the build should be tried again.
  bool learn(const std::string& error, const CompileOptions& o);
  std::set<std::string> missing() const;

 private:
  mutable std::mutex mu_;
  std::set<std::string> missing_;
};

}  // namespace torchtpu::pjrt
