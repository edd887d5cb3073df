#include "aten/op_info.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torchtpu::aten {

std::string op_name(const c10::FunctionSchema& s) {
  std::string name = s.name();
  if (name.rfind("aten::", 0) == 0) name = name.substr(6);
  return s.overload_name().empty() ? name : name + "." + s.overload_name();
}

namespace {

bool is_scalar_type(const c10::TypePtr& t) {
  if (t->kind() == c10::TypeKind::NumberType) return true;
  if (auto o = t->cast<c10::OptionalType>())
    return o->getElementType()->kind() == c10::TypeKind::NumberType;
  return false;
}

// The functional overload whose arguments are this out= op's non-out ones
// (out arguments are kwarg-only and last, so positions agree), if it has a rule.
std::optional<c10::OperatorHandle> functional_twin(const c10::FunctionSchema& s) {
  std::vector<std::string> want;
  for (const auto& a : s.arguments())
    if (!a.is_out()) want.push_back(a.type()->str());
  for (const std::string& cand : lower::registered_ops()) {
    std::string base = cand.substr(0, cand.find('.'));
    if ("aten::" + base != s.name()) continue;
    std::string overload =
        cand.find('.') == std::string::npos ? "" : cand.substr(cand.find('.') + 1);
    auto h = c10::Dispatcher::singleton().findSchema({s.name(), overload});
    if (!h) continue;
    std::vector<std::string> got;
    for (const auto& a : h->schema().arguments()) got.push_back(a.type()->str());
    if (got == want) return h;
  }
  return std::nullopt;
}

std::unique_ptr<OpInfo> make_info(const c10::FunctionSchema& s) {
  auto info = std::make_unique<OpInfo>();
  info->name = op_name(s);
  for (const auto& a : s.arguments()) {
    info->scalar_arg.push_back(is_scalar_type(a.type()) ? 1 : 0);
    info->is_out |= a.is_out();
  }
  for (const auto& r : s.returns()) {
    int alias = -1;
    if (r.alias_info() && r.alias_info()->isWrite()) {
      for (size_t i = 0; i < s.arguments().size(); ++i) {
        const auto* ai = s.arguments()[i].alias_info();
        if (ai && ai->isWrite() && ai->beforeSets() == r.alias_info()->beforeSets())
          alias = static_cast<int>(i);
      }
    }
    info->ret_alias_arg.push_back(alias);
  }
  info->rule = lower::find_rule(info->name);
  std::string base = s.name().substr(6);
  if (!info->rule && !base.empty() && base.back() == '_' && !info->is_out) {
    std::string f = base.substr(0, base.size() - 1);
    if (!s.overload_name().empty()) f += "." + s.overload_name();
    info->rule = lower::find_rule(f);
  }
  if (info->is_out) info->functional = functional_twin(s);
  if (!info->rule && info->functional)
    info->rule = lower::find_rule(op_name(info->functional->schema()));
  if (!info->rule && base.rfind("_foreach_", 0) == 0) {
    info->foreach = foreach_op(s, info->scalar_arg);
    if (info->foreach) info->rule = foreach_rule(*info->foreach);
    // In place (`self`) or out= (`out`): the first written list gets the results.
    for (size_t i = 0; info->foreach && s.returns().empty() && i < s.arguments().size(); ++i) {
      const auto* a = s.arguments()[i].alias_info();
      if (a && a->isWrite()) {
        info->list_write_arg = static_cast<int>(i);
        break;
      }
    }
  }
  info->spec = &lower::spec_of(lower::base_name(info->name));
  for (int i : info->spec->attribute_scalars)
    if (i < static_cast<int>(info->scalar_arg.size())) info->scalar_arg[i] = 0;
  for (int i : info->spec->runtime_floats)
    if (i < static_cast<int>(s.arguments().size()) &&
        s.arguments()[i].type()->kind() == c10::TypeKind::FloatType)
      info->scalar_arg[i] = 1;
  return info;
}

}  // namespace

const OpInfo& op_info(const c10::OperatorHandle& op) {
  // Every op call asks: a per-thread map answers without the lock.
  thread_local std::unordered_map<const c10::FunctionSchema*, const OpInfo*> seen;
  const c10::FunctionSchema* key = &op.schema();
  if (auto it = seen.find(key); it != seen.end()) return *it->second;
  static std::mutex mu;
  static std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpInfo>> infos;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = infos[key];
  if (!slot) slot = make_info(op.schema());
  seen.emplace(key, slot.get());
  return *slot;
}

bool has_lowering(const std::string& qualified) {
  const size_t dot = qualified.find('.');
  const std::string name = qualified.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : qualified.substr(dot + 1);
  auto h = c10::Dispatcher::singleton().findSchema({name, overload});
  return h && op_info(*h).rule != nullptr;
}

}  // namespace torchtpu::aten
