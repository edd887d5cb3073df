// Output metadata of a call: PyTorch's meta kernel (or, where it fails or
// disagrees with the CPU kernel, the CPU's answer), and the sizes out=
// arguments are resized to.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <exception>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "aten/program.h"
#include "lower/types.h"

namespace torchtpu::aten {

using hlo::Type;
using lower::to_dtype;

namespace {

// The tensors of an argument (a tensor, or a list holding tensors) mapped by f;
// a tpu device argument becomes `device` and a generator none.
c10::IValue map_tensors(const c10::IValue& v, at::Tensor (*f)(const at::Tensor&),
                        c10::DeviceType device) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorList()) l.push_back(f(t));
    return l;
  }
  if (v.isList()) {
    auto src = v.toList();
    c10::impl::GenericList l(src.elementType());
    for (const c10::IValue& e : src) l.push_back(map_tensors(e, f, device));
    return l;
  }
  if (v.isGenerator()) return c10::IValue();
  if (v.isDevice() && v.toDevice().is_privateuseone()) return c10::Device(device);
  return v;
}

// CPU tensors stay on the CPU (so device mismatches raise as in eager), except
// 0-dim scalars, which mix with any device.
at::Tensor meta_of(const at::Tensor& t) {
  if (!t.defined() || (!t.device().is_privateuseone() && t.dim() > 0)) return t;
  return at::empty_strided(t.sizes(), t.strides(),
                           c10::TensorOptions().dtype(t.scalar_type()).device(c10::kMeta));
}

// A zero-filled CPU tensor with t's metadata (tpu tensors only); zeros keep
// index arguments in bounds.
at::Tensor zeros_on_cpu(const at::Tensor& t) {
  if (!t.defined() || !t.device().is_privateuseone()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU)).zero_();
}

at::Tensor as_meta(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta));
}

bool any_empty_tensor(const torch::jit::Stack& args, size_t first, size_t n) {
  auto empty = [](const at::Tensor& t) {
    return t.defined() && t.device().is_privateuseone() && t.numel() == 0;
  };
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = args[first + i];
    if (v.isTensor() && empty(v.toTensor())) return true;
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorList())
        if (empty(t)) return true;
  }
  return false;
}

// PyTorch's meta kernel gives the outputs' dtypes and sizes (and its errors).
std::vector<at::Tensor> meta_outputs(const c10::OperatorHandle& op, const OpInfo& info,
                                     const torch::jit::Stack& args, size_t first, size_t n,
                                     std::vector<int>& ret_lists) {
  metrics().meta_calls++;
  if (info.spec->meta) {
    std::vector<at::Tensor> outs = info.spec->meta({op.schema(), &args[first]});
    ret_lists.assign(outs.size(), -1);
    return outs;
  }
  torch::jit::Stack ms;
  for (size_t i = 0; i < n; ++i) ms.push_back(to_meta(args[first + i]));
  if (info.functional && !op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
    // An out= overload without a meta kernel (geqrf.a, _logcumsumexp.out):
    // its functional twin's results give the sizes its out arguments take.
    torch::jit::Stack fs(ms.begin(), ms.begin() + info.functional->schema().arguments().size());
    call_boxed_holding_args(*info.functional, &fs, c10::DispatchKey::Meta);
    TORCH_CHECK(fs.size() == info.ret_alias_arg.size(), "[tpu] ", info.name, " returns ",
                info.ret_alias_arg.size(), " values, its functional twin ", fs.size());
    torch::jit::Stack outs;
    for (size_t r = 0; r < fs.size(); ++r) {
      const int a = info.ret_alias_arg[r];
      TORCH_CHECK(a >= 0 && fs[r].isTensor(), "[tpu] ", info.name,
                  ": only out= tensors can take their functional twin's sizes");
      outs.push_back(
          at::empty(fs[r].toTensor().sizes(), ms[a].toTensor().options().device(c10::kMeta)));
    }
    ms = std::move(outs);
  } else {
    try {
      call_boxed_holding_args(op, &ms, c10::DispatchKey::Meta);
    } catch (const std::exception&) {
      // Some of PyTorch's Python meta kernels fail on empty inputs where the CPU
      // kernel does not (max_pool2d_with_indices on a batch of 0 reshapes 0
      // elements with -1). On empty inputs the CPU kernel computes nothing, so it
      // gives the metadata instead; if it fails too, the meta kernel's error stands.
      if (!any_empty_tensor(args, first, n)) throw;
      std::exception_ptr meta_error = std::current_exception();
      ms.clear();
      for (size_t i = 0; i < n; ++i)
        ms.push_back(map_tensors(args[first + i], zeros_on_cpu, c10::kCPU));
      try {
        call_boxed_holding_args(op, &ms, c10::DispatchKey::CPU);
      } catch (const std::exception&) {
        std::rethrow_exception(meta_error);
      }
      for (c10::IValue& r : ms) r = map_tensors(r, as_meta, c10::kMeta);
    }
  }
  std::vector<at::Tensor> outs;
  for (const c10::IValue& r : ms) {
    if (r.isTensor()) {
      outs.push_back(r.toTensor());
      ret_lists.push_back(-1);
    } else if (r.isTensorList()) {
      auto l = r.toTensorList();
      for (const at::Tensor& t : l) outs.push_back(t);
      ret_lists.push_back(static_cast<int>(l.size()));
    } else {
      TORCH_CHECK(false, "[tpu] ", op.schema().operator_name(), " returns a ", r.tagKind(),
                  "; only tensor results can be lowered");
    }
  }
  // Where PyTorch's meta kernel disagrees with its CPU kernel (the reference),
  // the rule's spec follows the CPU.
  if (info.spec->fix_shapes) info.spec->fix_shapes({op.schema(), &args[first]}, outs);
  return outs;
}

}  // namespace

void call_boxed_holding_args(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                             std::optional<c10::DispatchKey> key) {
  const torch::jit::Stack held = *stack;
  if (key)
    op.redispatchBoxed(c10::DispatchKeySet(*key), stack);
  else
    op.callBoxed(stack);
}

c10::IValue to_meta(const c10::IValue& v) { return map_tensors(v, meta_of, c10::kMeta); }

CallOutputs call_outputs(const c10::OperatorHandle& op, const OpInfo& info,
                         const torch::jit::Stack& args, size_t first, size_t n) {
  if (info.foreach) return foreach_outputs(*info.foreach, info, args, first);
  CallOutputs co;
  std::vector<at::Tensor> metas = meta_outputs(op, info, args, first, n, co.ret_lists);
  for (const at::Tensor& m : metas) {
    co.undefined.push_back(!m.defined());
    co.types.push_back(m.defined() ? Type{to_dtype(m.scalar_type()), m.sizes().vec()}
                                   : Type{DType::F32, {}});
  }
  return co;
}

bool resize_outs(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& args,
                 size_t first, size_t n, const std::string& key) {
  // The call key fixes the meta kernel's sizes, and ops such as arange(out=)
  // get a fresh empty out on every call: the sizes are remembered per key
  // rather than asking the meta kernel (some are Python) each time.
  using Sizes = std::vector<std::optional<std::vector<int64_t>>>;  // per return
  static std::mutex mu;
  static auto& memo = *new std::unordered_map<std::string, Sizes>();
  std::optional<Sizes> sizes;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo.find(key); it != memo.end()) sizes = it->second;
  }
  if (!sizes) {
    std::vector<int> lists;
    std::vector<at::Tensor> metas = meta_outputs(op, info, args, first, n, lists);
    sizes.emplace(metas.size());
    for (size_t r = 0; r < info.ret_alias_arg.size() && r < metas.size(); ++r)
      if (info.ret_alias_arg[r] >= 0 && lists[r] < 0) (*sizes)[r] = metas[r].sizes().vec();
    std::lock_guard<std::mutex> lock(mu);
    if (memo.size() >= 4096) memo.clear();
    memo.emplace(key, *sizes);
  }
  bool resized = false;
  for (size_t r = 0; r < sizes->size(); ++r) {
    const auto& want = (*sizes)[r];
    if (!want) continue;
    const at::Tensor& out = args[first + info.ret_alias_arg[r]].toTensor();
    if (out.sizes() != c10::IntArrayRef(*want)) {
      out.resize_(*want);
      resized = true;
    }
  }
  return resized;
}

}  // namespace torchtpu::aten
