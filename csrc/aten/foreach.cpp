// Foreach ops (`_foreach_add_.List`, `_foreach_norm.Scalar`, ...) as one call
// per list. PyTorch's default kernel loops over the tensors, one op call each,
// so an AdamW step over 28 parameters records about 250 calls. Here the rule
// of the op a foreach op applies per element is found from the schemas and run
// on each element inside one lowering.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "aten/program.h"
#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::aten {

using hlo::Type;
using hlo::Value;

// The element op of a foreach op, and how its arguments come from the foreach call's.
struct ForeachOp {
  std::optional<c10::OperatorHandle> op;  // the element op
  const lower::Rule* element = nullptr;   // its rule
  std::string name;                       // "add.Tensor", for errors
  std::vector<int> src;                   // per element argument: foreach argument, or -1 (default)
  std::vector<c10::IValue> fixed;         // per element argument: its default (src -1)
  std::vector<char> per_element;          // per foreach argument: a T[] list indexed per element
  lower::Rule rule;                       // the foreach op's rule

  // Number of elements of the call's lists.
  size_t count(const std::function<const c10::IValue&(int)>& arg) const {
    for (size_t i = 0; i < per_element.size(); ++i)
      if (per_element[i]) return arg(static_cast<int>(i)).toList().size();
    return 0;
  }
  // Argument j of element e's call.
  c10::IValue element_arg(const std::function<const c10::IValue&(int)>& arg, size_t j,
                          size_t e) const {
    const int i = src[j];
    if (i < 0) return fixed[j];
    return per_element[i] ? arg(i).toList().get(e) : arg(i);
  }
};

namespace {

// Element ops computed value by value: a foreach op over them can run once on
// its lists flattened, so XLA makes one kernel for the whole list.
bool pointwise(const std::string& element) {
  static const std::set<std::string> ops = {
      "add",       "sub",   "mul",   "div",        "lerp",    "addcmul", "addcdiv",
      "sqrt",      "rsqrt", "neg",   "abs",        "exp",     "expm1",   "log",
      "log1p",     "log2",  "log10", "reciprocal", "sigmoid", "sign",    "clamp_min",
      "clamp_max", "pow",   "tanh",  "sin",        "cos",     "trunc",   "floor",
      "ceil",      "round", "frac",  "erf",        "erfc"};
  return ops.count(lower::base_name(element)) > 0;
}

// What the element op's lowering sees: element e of every list argument, or
// (`flat`: the whole lists' output, rank 1) all elements at once, each
// Tensor[] argument flattened and each Scalar[] one (all its values equal,
// which the call's key records: flat_sizes) by its first value. With
// `vector`, element e's tensors are seen as rank 1 (vector_type).
class ElementCtx final : public lower::Ctx {
 public:
  ElementCtx(lower::Ctx& outer, const ForeachOp& m, int e, std::vector<std::vector<Value>>& lists,
             std::vector<Value>& singles, std::optional<Type> flat = std::nullopt,
             std::optional<Type> vector = std::nullopt)
      : Ctx(outer.b),
        outer_(outer),
        m_(m),
        e_(e),
        flat_(std::move(flat)),
        vector_(std::move(vector)),
        lists_(lists),
        singles_(singles) {
    auto arg = [&](int i) -> const c10::IValue& { return outer.arg(i); };
    const std::optional<Type>& rank1 = flat_ ? flat_ : vector_;
    for (size_t j = 0; j < m.src.size(); ++j) {
      c10::IValue a = m.element_arg(arg, j, e);
      if (rank1 && m.src[j] >= 0 && m.per_element[m.src[j]] && a.isTensor())
        a = at::empty(rank1->shape, a.toTensor().options().device(c10::kMeta));
      args_.push_back(std::move(a));
    }
  }

  const c10::IValue& arg(int j) const override { return args_.at(j); }
  int num_args() const override { return static_cast<int>(args_.size()); }
  const Type& out(int k) const override {
    TORCH_CHECK(k == 0, "[tpu] ", op_name(), ": ", m_.name, " has one output per element");
    return flat_ ? *flat_ : vector_ ? *vector_ : outer_.out(e_);
  }
  int num_outputs() const override { return 1; }
  const std::string& op_name() const override { return outer_.op_name(); }

  Value in(int j) override {
    const int i = source(j);
    if (m_.per_element[i]) {
      if (lists_[i].empty())
        lists_[i] = flat_ ? std::vector<Value>{outer_.flat_list(i)} : outer_.list(i);
      if (vector_) return b.reshape(lists_[i].at(e_), vector_->shape);
      return lists_[i].at(flat_ ? 0 : e_);
    }
    if (!singles_[i].valid()) singles_[i] = outer_.in(i);
    return singles_[i];
  }
  std::vector<Value> list(int j) override { return outer_.list(source(j)); }
  Value scalar(int j, DType as) override {
    if (m_.src[j] < 0) return b.constant(arg(j).toScalar().toDouble(), as);
    const int i = m_.src[j];
    return m_.per_element[i] ? outer_.scalar_at(i, e_, as) : outer_.scalar(i, as);
  }
  Value scalar_at(int j, int k, DType as) override { return outer_.scalar_at(source(j), k, as); }
  void update(int, Value) override { unsupported("writes an argument"); }
  void update_at(int, int, Value) override { unsupported("writes an argument"); }
  Value rng_state(int64_t) override { unsupported("draws random numbers"); }

 private:
  int source(int j) const {
    TORCH_CHECK(m_.src.at(j) >= 0, "[tpu] ", op_name(), ": argument ", j, " of ", m_.name,
                " is not an argument of the foreach op");
    return m_.src[j];
  }
  [[noreturn]] void unsupported(const char* what) const {
    TORCH_CHECK(false, "[tpu] ", op_name(), ": its element op ", m_.name, " ", what,
                ", which a foreach lowering does not support");
  }

  lower::Ctx& outer_;
  const ForeachOp& m_;
  int e_;  // 0 when flat: Scalar[] lists are uniform then
  std::optional<Type> flat_, vector_;
  std::vector<c10::IValue> args_;
  std::vector<std::vector<Value>>& lists_;
  std::vector<Value>& singles_;
};

// Whether the call's single (not per-element) tensors are all 0-dim or
// undefined: then they broadcast to any element as a scalar does.
bool singles_are_0dim(lower::Ctx& c, const ForeachOp& f) {
  for (size_t i = 0; i < f.per_element.size(); ++i) {
    const c10::IValue& a = c.arg(static_cast<int>(i));
    if (!f.per_element[i] && a.isTensor() && a.toTensor().defined() && a.toTensor().dim() != 0)
      return false;
  }
  return true;
}

// The element sizes when the call can run flat (ElementCtx with `flat`): a pointwise element
// op, every list element shaped like its output, one output dtype, single
// tensors 0-dim, Scalar[] lists of one kind; nullopt otherwise.
std::optional<std::vector<int64_t>> flat_sizes(lower::Ctx& c, const ForeachOp& f, size_t n) {
  if (n < 2 || !pointwise(f.name)) return std::nullopt;
  std::vector<int64_t> numels;
  for (size_t e = 0; e < n; ++e) {
    const Type& t = c.out(static_cast<int>(e));
    if (t.dtype != c.out(0).dtype || t.numel() == 0) return std::nullopt;
    numels.push_back(t.numel());
  }
  // Flat pays where a list is one storage range; else it only adds a copy.
  bool any_tiled = false;
  for (size_t i = 0; i < f.per_element.size(); ++i)
    any_tiled = any_tiled || (f.per_element[i] && c.arg(static_cast<int>(i)).isTensorList() &&
                              c.tiles(static_cast<int>(i)));
  if (!any_tiled || !singles_are_0dim(c, f)) return std::nullopt;
  for (size_t i = 0; i < f.per_element.size(); ++i) {
    if (!f.per_element[i]) continue;
    const c10::IValue& a = c.arg(static_cast<int>(i));
    auto l = a.toList();
    if (l.size() != n) return std::nullopt;
    if (!a.isTensorList() && !uniform_scalars(l)) return std::nullopt;
    for (size_t e = 0; e < n; ++e) {
      c10::IValue v = l.get(e);
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        if (!t.defined() || t.sizes() != c10::IntArrayRef(c.out(static_cast<int>(e)).shape) ||
            t.scalar_type() != l.get(0).toTensor().scalar_type())
          return std::nullopt;
      } else if (!v.isScalar() || v.isComplexDouble() || v.isDouble() != l.get(0).isDouble() ||
                 v.isBool() != l.get(0).isBool()) {
        return std::nullopt;
      }
    }
  }
  return numels;
}

// Element e of a pointwise foreach op as rank 1, where its tensors are all
// shaped like its output and single tensors are 0-dim. Read from and written
// back to its storage, the element is then the storage's own rank-1 value, with
// no reshape between: XLA:CPU copies a donated input before a fusion that
// updates it in place through a reshape (an AdamW step over 2-D parameters
// copied them all, into a temporary of their size allocated per run). Only
// for elements of at least 256 KiB: on small ones the copies cost less than
// what the reshapes change (the bench GPT's Fused step, all of its parameters
// under 64 KiB, was 9% slower).
std::optional<Type> vector_type(lower::Ctx& c, const ForeachOp& f, int e) {
  constexpr size_t kVectorBytes = 256 << 10;
  const Type& t = c.out(e);
  if (!pointwise(f.name) || t.rank() < 2 ||
      static_cast<size_t>(t.numel()) * itemsize(t.dtype) < kVectorBytes)
    return std::nullopt;
  if (!singles_are_0dim(c, f)) return std::nullopt;
  for (size_t i = 0; i < f.per_element.size(); ++i) {
    const c10::IValue& a = c.arg(static_cast<int>(i));
    if (!f.per_element[i] || !a.isTensorList()) continue;  // Scalar[] elements fit any shape
    c10::IValue v = a.toList().get(static_cast<size_t>(e));
    if (!v.isTensor() || !v.toTensor().defined() ||
        v.toTensor().sizes() != c10::IntArrayRef(t.shape))
      return std::nullopt;
  }
  return Type{t.dtype, {t.numel()}};
}

// The type one element sees of a foreach argument: T of a Tensor[] or
// Scalar[] list (indexed per element), else the argument's own type.
c10::TypePtr element_type(const c10::Argument& a, bool& per_element) {
  per_element = false;
  if (auto l = a.type()->cast<c10::ListType>()) {
    c10::TypePtr t = l->getElementType();
    if (t->kind() == c10::TypeKind::TensorType || t->kind() == c10::TypeKind::NumberType) {
      per_element = true;
      return t;
    }
  }
  return a.type();
}

// Maps the element op's arguments to the foreach op's: by position (the
// usual case: `_foreach_add.List(Tensor[] self, Tensor[] other, *, Scalar
// alpha)` and `add.Tensor`), else by name (`_foreach_norm` and
// `linalg_vector_norm`); arguments left over need defaults.
bool match(const c10::FunctionSchema& e, const std::vector<c10::Argument>& fa,
           const std::vector<c10::TypePtr>& types, bool by_name, std::vector<int>& src) {
  const auto& ea = e.arguments();
  src.assign(ea.size(), -1);
  size_t used = 0;
  for (size_t j = 0; j < ea.size(); ++j) {
    int i = -1;
    if (!by_name && j < fa.size()) i = static_cast<int>(j);
    for (size_t k = 0; by_name && k < fa.size(); ++k)
      if (fa[k].name() == ea[j].name()) i = static_cast<int>(k);
    if (i >= 0 && *types[i] == *ea[j].type()) {
      src[j] = i;
      ++used;
    } else if (i >= 0 && !by_name) {
      return false;
    } else if (!ea[j].default_value()) {
      return false;
    }
  }
  return used == fa.size();
}

// A functional op returning one tensor, with a rule.
bool usable(const c10::FunctionSchema& e) {
  if (e.returns().size() != 1 || e.returns()[0].type()->kind() != c10::TypeKind::TensorType)
    return false;
  for (const auto& a : e.arguments())
    if (a.is_out() || (a.alias_info() && a.alias_info()->isWrite())) return false;
  return true;
}

std::string qualified(const c10::OperatorName& n) {
  std::string s = n.name.substr(6);
  return n.overload_name.empty() ? s : s + "." + n.overload_name;
}

std::unique_ptr<ForeachOp> derive(const c10::FunctionSchema& s) {
  std::string base = s.name().substr(std::string("aten::_foreach_").size());
  if (!base.empty() && base.back() == '_') base.pop_back();
  // The element op matches the inputs; an out= list only receives results.
  std::vector<c10::Argument> ins;
  std::vector<c10::TypePtr> types;
  std::vector<int> index;  // per input: its argument position
  auto m = std::make_unique<ForeachOp>();
  for (size_t i = 0; i < s.arguments().size(); ++i) {
    const c10::Argument& a = s.arguments()[i];
    bool per = false;
    c10::TypePtr t = element_type(a, per);
    m->per_element.push_back(per && !a.is_out());
    if (a.is_out()) continue;
    ins.push_back(a);
    types.push_back(t);
    index.push_back(static_cast<int>(i));
  }
  if (std::find(m->per_element.begin(), m->per_element.end(), 1) == m->per_element.end())
    return nullptr;
  // Ops whose element op has another name (PyTorch's per-tensor loop calls these).
  static const std::map<std::string, std::string> other_name = {
      {"maximum", "clamp_min"}, {"minimum", "clamp_max"}, {"norm", "linalg_vector_norm"}};
  static const auto* overloads = [] {
    auto* r = new std::multimap<std::string, c10::OperatorName>();
    for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) r->emplace(n.name, n);
    return r;
  }();
  std::vector<std::string> names = {base};
  if (auto it = other_name.find(base); it != other_name.end()) names.push_back(it->second);
  for (bool by_name : {false, true}) {
    for (const std::string& name : names) {
      auto [lo, hi] = overloads->equal_range("aten::" + name);
      for (auto it = lo; it != hi; ++it) {
        auto h = c10::Dispatcher::singleton().findOp(it->second);
        if (!h || !usable(h->schema())) continue;
        const lower::Rule* rule = lower::find_rule(qualified(it->second));
        if (!rule || !match(h->schema(), ins, types, by_name, m->src)) continue;
        for (int& i : m->src)
          if (i >= 0) i = index[i];
        m->op = *h;
        m->element = rule;
        m->name = qualified(it->second);
        for (size_t j = 0; j < m->src.size(); ++j) {
          auto d = h->schema().arguments()[j].default_value();
          m->fixed.push_back(m->src[j] < 0 && d ? *d : c10::IValue());
        }
        return m;
      }
    }
  }
  return nullptr;
}

}  // namespace

const ForeachOp* foreach_op(const c10::FunctionSchema& s, std::vector<uint8_t>& scalar_arg) {
  std::unique_ptr<ForeachOp> m = derive(s);
  if (!m) return nullptr;
  // Scalars the element op bakes into its program (a norm's order) are baked
  // here too; the others are runtime inputs, list elements included.
  const auto& attrs = lower::spec_of(lower::base_name(m->name)).attribute_scalars;
  for (size_t j = 0; j < m->src.size(); ++j) {
    const int i = m->src[j];
    if (i < 0) continue;
    bool per = false;
    if (element_type(s.arguments()[i], per)->kind() != c10::TypeKind::NumberType) continue;
    const bool attr = std::find(attrs.begin(), attrs.end(), static_cast<int>(j)) != attrs.end();
    scalar_arg[i] = attr ? 0 : 1;
  }
  const ForeachOp* f = m.get();
  m->rule = [f](lower::Ctx& c) -> std::vector<Value> {
    const size_t n = f->count([&](int i) -> const c10::IValue& { return c.arg(i); });
    std::vector<std::vector<Value>> lists(f->per_element.size());
    std::vector<Value> singles(f->per_element.size());
    auto run = [&](ElementCtx&& ec) {
      std::vector<Value> v = (*f->element)(ec);
      TORCH_CHECK(v.size() == 1, "[tpu] ", c.op_name(), ": ", f->name, " returned ", v.size(),
                  " values for one output");
      return v[0];
    };
    std::vector<Value> out;
    if (auto numels = flat_sizes(c, *f, n)) {
      int64_t total = 0;
      for (int64_t k : *numels) total += k;
      Value all = lower::broadcast_to(
          c.b, run(ElementCtx(c, *f, 0, lists, singles, Type{c.out(0).dtype, {total}})), {total});
      // Each element's output is its slice (hlo::Builder joins adjacent slices again).
      int64_t at = 0;
      for (size_t e = 0; e < n; ++e) {
        const Type& t = c.out(static_cast<int>(e));
        out.push_back(c.b.reshape(c.b.slice(all, {at}, {at + t.numel()}, {1}), t.shape));
        at += t.numel();
      }
      return out;
    }
    for (size_t e = 0; e < n; ++e) {
      const int k = static_cast<int>(e);
      if (auto v = vector_type(c, *f, k))
        out.push_back(c.b.reshape(run(ElementCtx(c, *f, k, lists, singles, std::nullopt, v)),
                                  c.out(k).shape));
      else
        out.push_back(run(ElementCtx(c, *f, k, lists, singles)));
    }
    return out;
  };
  // Kept for the process: OpInfos point at it.
  return m.release();
}

const lower::Rule* foreach_rule(const ForeachOp& f) { return &f.rule; }
const lower::Rule* foreach_element_rule(const ForeachOp& f) { return f.element; }

CallOutputs foreach_outputs(const ForeachOp& f, const OpInfo& info, const torch::jit::Stack& args,
                            size_t first) {
  auto arg = [&](int i) -> const c10::IValue& { return args[first + i]; };
  const size_t n = f.count(arg);
  CallOutputs co;
  std::vector<at::Tensor> dst;  // in place or out=: the tensors written
  if (info.list_write_arg >= 0) dst = arg(info.list_write_arg).toTensorList().vec();
  for (size_t e = 0; e < n; ++e) {
    torch::jit::Stack ms;
    for (size_t j = 0; j < f.src.size(); ++j) ms.push_back(to_meta(f.element_arg(arg, j, e)));
    call_boxed_holding_args(*f.op, &ms, c10::DispatchKey::Meta);
    const at::Tensor& m = ms.at(0).toTensor();
    if (info.list_write_arg >= 0) {
      // As PyTorch's per-tensor loop: the result must fit the tensor written.
      TORCH_CHECK(e < dst.size() && dst[e].sizes() == m.sizes(), "[tpu] ", info.name, ": result ",
                  e, " has shape ", m.sizes(), " but the tensor it is written to has ",
                  e < dst.size() ? dst[e].sizes() : c10::IntArrayRef{});
      TORCH_CHECK(c10::canCast(m.scalar_type(), dst[e].scalar_type()), "[tpu] ", info.name,
                  ": result ", e, " is ", m.scalar_type(), ", which cannot be written into a ",
                  dst[e].scalar_type(), " tensor");
      continue;
    }
    co.types.push_back(Type{lower::to_dtype(m.scalar_type()), m.sizes().vec()});
    co.undefined.push_back(false);
  }
  if (info.list_write_arg < 0) co.ret_lists.push_back(static_cast<int>(n));
  return co;
}

}  // namespace torchtpu::aten
