#include "aten/executor.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/max.h>
#include <ATen/ops/min.h>
#include <c10/core/TensorOptions.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "aten/fused.h"
#include "aten/generator.h"
#include "aten/program.h"
#include "cache/compile_cache.h"
#include "lower/helpers.h"
#include "lower/types.h"
#include "lower/view.h"

namespace torchtpu::aten {

using hlo::Builder;
using hlo::Type;
using hlo::Value;
using lower::to_dtype;

namespace {

struct OutSpec {
  bool write;  // true: new value of storage `slot`; false: a fresh tensor
  int slot;
  DType dtype;
  std::vector<int64_t> sizes;
  bool undefined = false;  // an output the op leaves undefined (masked-off grads)
};

struct Entry {
  pjrt::ExecutablePtr exe;
  std::vector<InputSource> inputs;
  std::vector<ScalarSource> scalars;
  std::vector<std::pair<DType, int>> packs;
  std::vector<OutSpec> outs;   // fresh outputs first, then storage writes
  std::vector<int> ret_lists;  // per return: -1 single tensor, n = Tensor[] of n
  int64_t rng_numel = -1;
};

template <typename T>
void put(std::string& k, const T& v) {
  k.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

int slot_index(std::vector<DeviceStorage*>& storages, DeviceStorage* s) {
  for (size_t i = 0; i < storages.size(); ++i)
    if (storages[i] == s) return static_cast<int>(i);
  storages.push_back(s);
  return static_cast<int>(storages.size()) - 1;
}

void key_tensor(std::string& k, const at::Tensor& t, std::vector<DeviceStorage*>& slots,
                bool host_ok = false) {
  if (!t.defined()) {
    k.push_back('u');
    return;
  }
  put(k, static_cast<int8_t>(t.scalar_type()));
  put(k, static_cast<int8_t>(t.dim()));
  for (int64_t s : t.sizes()) put(k, s);
  if (!t.device().is_privateuseone()) {
    // Host tensors are uploaded per call: 0-dim scalars anywhere, and index
    // tensors of Tensor?[] lists (as CUDA accepts CPU indices).
    TORCH_CHECK(t.dim() == 0 || host_ok,
                "Expected all tensors to be on the same device, but "
                "found at least two devices, tpu and ",
                t.device(), "! Move the tensor with .to('tpu').");
    k.push_back('H');
    return;
  }
  k.push_back('T');
  for (int64_t s : t.strides()) put(k, s);
  put(k, t.storage_offset());
  auto& st = device_storage(t.storage());
  put(k, static_cast<int16_t>(slot_index(slots, &st)));
  put(k, static_cast<uint64_t>(st.nbytes));
  put(k, st.has_value() ? static_cast<int8_t>(st.dtype) : int8_t(-1));
}

void key_ivalue(std::string& k, const c10::IValue& v, bool scalar,
                std::vector<DeviceStorage*>& slots) {
  if (v.isNone()) {
    k.push_back('n');
  } else if (v.isTensor()) {
    key_tensor(k, v.toTensor(), slots);
  } else if (v.isTensorList()) {
    k.push_back('L');
    auto l = v.toTensorList();
    put(k, static_cast<int32_t>(l.size()));
    for (const at::Tensor& t : l) key_tensor(k, t, slots);
  } else if (v.isList()) {
    k.push_back('G');
    auto l = v.toList();
    put(k, static_cast<int32_t>(l.size()));
    for (const c10::IValue& e : l) {
      if (e.isTensor())
        key_tensor(k, e.toTensor(), slots, /*host_ok=*/true);
      else
        key_ivalue(k, e, scalar, slots);
    }
  } else if (scalar) {
    // Runtime input: only its kind shapes the program (type promotion).
    k.push_back(v.isDouble() ? 'f' : v.isBool() ? 'b' : 'i');
  } else if (v.isInt()) {
    put(k, 'i');
    put(k, v.toInt());
  } else if (v.isDouble()) {
    put(k, 'd');
    put(k, v.toDouble());
  } else if (v.isBool()) {
    put(k, v.toBool() ? 'T' : 'F');
  } else if (v.isString()) {
    k.push_back('s');
    k.append(v.toStringRef());
    k.push_back('\0');
  } else if (v.isGenerator()) {
    k.push_back('g');
  } else if (v.isDevice()) {
    k.push_back('D');
  } else {
    // Layout, memory format and other enums arrive as ints; anything else is
    // keyed by its printed form.
    std::ostringstream os;
    os << v;
    k.append(os.str());
    k.push_back('\0');
  }
}

std::mutex cache_mu;
std::unordered_map<std::string, std::shared_ptr<Entry>>& cache() {
  static auto* c = new std::unordered_map<std::string, std::shared_ptr<Entry>>();
  return *c;
}

DType scalar_dtype(const c10::IValue& v) {
  if (v.isDouble()) return DType::F64;
  if (v.isBool()) return DType::Bool;
  return DType::I64;
}

// What a lowering rule sees of one call inside a Program.
class CallCtx final : public lower::Ctx {
 public:
  CallCtx(Program& p, int node, const OpInfo& info, const torch::jit::Stack& args, size_t first,
          const SlotOf& slot_of, const CallOutputs& outs)
      : Ctx(p.b),
        p_(p),
        node_(node),
        info_(info),
        args_(args),
        first_(first),
        slot_of_(slot_of),
        outs_(outs) {}

  const c10::IValue& arg(int i) const override { return args_[first_ + i]; }
  int num_args() const override { return static_cast<int>(info_.scalar_arg.size()); }
  const Type& out(int k) const override { return outs_.types.at(k); }
  int num_outputs() const override { return static_cast<int>(outs_.types.size()); }
  const std::string& op_name() const override { return info_.name; }

  Value in(int i) override {
    const c10::IValue& v = arg(i);
    TORCH_CHECK(v.isTensor(), "[tpu] ", info_.name, ": argument ", i, " is not a tensor");
    return load(v.toTensor(), i, -1);
  }

  std::vector<Value> list(int i) override {
    std::vector<Value> out;
    const c10::IValue& v = arg(i);
    if (v.isTensorList()) {
      auto l = v.toTensorList();
      for (size_t j = 0; j < l.size(); ++j) out.push_back(load(l[j], i, static_cast<int>(j)));
    } else {
      auto l = v.toList();
      for (size_t j = 0; j < l.size(); ++j) {
        c10::IValue e = l.get(j);
        bool absent = e.isNone() || (e.isTensor() && !e.toTensor().defined());
        out.push_back(absent ? Value{} : load(e.toTensor(), i, static_cast<int>(j)));
      }
    }
    return out;
  }

  Value scalar(int i, DType as) override { return packed(arg(i), i, -1, as); }
  Value scalar_at(int i, int e, DType as) override {
    return packed(arg(i).toList().get(e), i, e, as);
  }

  void update(int i, Value v) override {
    if (!is_none(i)) write(arg(i).toTensor(), v);
  }

  Value rng_state(int64_t numel) override {
    TORCH_CHECK(rng_numel_ < 0, "[tpu] ", info_.name, ": one random stream per op");
    rng_numel_ = numel;
    p_.inputs.push_back({InputSource::Rng, node_, -1, -1, DType::U64, 2});
    return b.param(Type{DType::U64, {2}});
  }

  void write(const at::Tensor& t, Value v) { p_.write(slot_of_(t), t, v, info_.name); }
  int64_t rng_numel() const { return rng_numel_; }

 private:
  Value load(const at::Tensor& t, int i, int sub) {
    DType d = to_dtype(t.scalar_type());
    int slot = slot_of_(t);
    if (slot < 0 && t.dim() == 0) {  // a Python number or a CPU scalar: a packed scalar
      p_.scalars.push_back({node_, i, sub, pack_dtype(d)});
      return b.convert(b.packed_scalar(pack_dtype(d)), d);
    }
    if (slot < 0) {
      p_.inputs.push_back({InputSource::Host, node_, i, sub, d, 0});
      return b.param(Type{d, t.sizes().vec()});
    }
    Value flat = b.reinterpret_flat(p_.storage(slot, d), d);  // maybe viewed as another dtype
    return lower::read_view(b, flat, view_geom(t));
  }

  // A runtime scalar (argument i, element sub) read from the program's pack.
  Value packed(const c10::IValue& v, int i, int sub, DType as) {
    DType d = scalar_dtype(v);
    p_.scalars.push_back({node_, i, sub, d});
    return b.convert(b.packed_scalar(d), as);
  }

  Program& p_;
  int node_;
  const OpInfo& info_;
  const torch::jit::Stack& args_;
  size_t first_;
  const SlotOf& slot_of_;
  const CallOutputs& outs_;
  int64_t rng_numel_ = -1;
};

// Builds the program of one call (on a cache miss).
std::shared_ptr<Entry> compile_call(const c10::OperatorHandle& op, const OpInfo& info,
                                    const torch::jit::Stack& args, size_t first, size_t n,
                                    std::vector<DeviceStorage*>& storages) {
  auto entry = std::make_shared<Entry>();
  CallOutputs outs = call_outputs(op, info, args, first, n);
  entry->ret_lists = outs.ret_lists;
  Program p;
  for (DeviceStorage* st : storages) p.add_slot({st->has_value(), st->dtype, st->nbytes});
  SlotOf slot_of = [&](const at::Tensor& t) {
    return t.device().is_privateuseone() ? slot_index(storages, &device_storage(t.storage())) : -1;
  };
  std::vector<Value> vals = lower_call(p, 0, info, args, first, slot_of, outs, &entry->rng_numel);
  std::vector<Value> results;
  for (size_t k = 0; k < vals.size(); ++k) {
    if (outs.undefined[k]) {
      entry->outs.push_back({false, -1, DType::F32, {}, true});
    } else if (vals[k].valid()) {
      results.push_back(p.b.reshape(vals[k], {outs.types[k].numel()}));
      entry->outs.push_back({false, -1, outs.types[k].dtype, outs.types[k].shape});
    }
  }
  for (int slot : p.written) {
    Value v = p.current[slot];
    results.push_back(v);
    entry->outs.push_back({true, slot, v.dtype(), v.shape()});
  }
  p.b.ret(results);
  entry->inputs = std::move(p.inputs);
  entry->scalars = std::move(p.scalars);
  entry->packs = p.b.packs();
  entry->exe = compile_cached(p.b.module());
  return entry;
}

int call_device(const std::vector<DeviceStorage*>& storages) {
  if (!storages.empty()) return storages[0]->device;
  return current_device();
}

// Buffers for the program's inputs, in the order the entry recorded them.
std::vector<pjrt::BufferPtr> gather_inputs(const Entry& entry, const torch::jit::Stack& args,
                                           size_t first, size_t n,
                                           const std::vector<DeviceStorage*>& storages,
                                           int device) {
  std::vector<pjrt::BufferPtr> owned;
  owned.reserve(entry.inputs.size());
  for (const InputSource& in : entry.inputs) {
    switch (in.kind) {
      case InputSource::Storage:
        // The key records which storages were unwritten; those never become inputs.
        TORCH_INTERNAL_ASSERT(storages[in.index]->buffer);
        owned.push_back(storages[in.index]->buffer);
        break;
      case InputSource::Host:
        owned.push_back(host_input(args[first + in.index], in.sub, device));
        break;
      case InputSource::Rng: {
        uint64_t state[2];
        philox_take(find_generator(args, first, n), device, entry.rng_numel, state);
        int64_t dims[1] = {2};
        owned.push_back(client().buffer_from_host(state, DType::U64, dims, device));
        break;
      }
    }
  }
  auto of = [&](const ScalarSource& s) { return scalar_of(args[first + s.index], s.sub); };
  for (pjrt::BufferPtr& b : scalar_packs(entry.scalars, entry.packs, of, device))
    owned.push_back(std::move(b));
  return owned;
}

// Installs the outputs: new buffers of written storages, fresh tensors, and
// the op's returns (aliased arguments for in-place/out= ops) on the stack.
void push_results(const Entry& entry, const OpInfo& info, const std::vector<pjrt::BufferPtr>& outs,
                  const std::vector<DeviceStorage*>& storages, int device, torch::jit::Stack& stack,
                  size_t first) {
  std::vector<at::Tensor> fresh;
  size_t next = 0;
  for (const OutSpec& o : entry.outs) {
    if (o.undefined) {
      fresh.emplace_back();
    } else if (o.write) {
      DeviceStorage* st = storages[o.slot];
      st->buffer = outs[next++];
      st->dtype = o.dtype;
    } else {
      fresh.push_back(wrap_buffer(outs[next++], o.sizes, lower::to_scalar_type(o.dtype), device));
    }
  }
  push_returns(info, entry.ret_lists, fresh, stack, first);
}

void check_same_device(const std::string& name, const std::vector<DeviceStorage*>& storages) {
  for (DeviceStorage* s : storages)
    TORCH_CHECK(s->device == storages[0]->device, "[tpu] ", name,
                ": expected all tensors on the same device, found tpu:", storages[0]->device,
                " and tpu:", s->device, "; move them with .to()");
}

// Debug Eager: integer index arguments must be in range before the op runs
// (XLA clamps out-of-range gathers silently).
void check_index(const std::string& op, const at::Tensor& idx, int64_t size, int64_t dim) {
  if (!idx.defined() || idx.numel() == 0 || !c10::isIntegralType(idx.scalar_type(), false)) return;
  at::Tensor h = idx.to(c10::kCPU);
  int64_t lo = h.min().item<int64_t>(), hi = h.max().item<int64_t>();
  TORCH_CHECK_INDEX(lo >= -size && hi < size, "[tpu] aten::", op, ": index ", hi >= size ? hi : lo,
                    " is out of bounds for dimension ", dim, " with size ", size);
}

void debug_index_checks(const OpInfo& info, const torch::jit::Stack& args, size_t first) {
  const std::string base = info.name.substr(0, info.name.find('.'));
  auto arg = [&](int i) -> const c10::IValue& { return args[first + i]; };
  if (base == "index_select" || base == "gather" || base == "scatter" || base == "scatter_add" ||
      base == "index_add" || base == "index_copy" || base == "index_fill") {
    const at::Tensor& self = arg(0).toTensor();
    int64_t dim = c10::maybe_wrap_dim(arg(1).toInt(), std::max<int64_t>(self.dim(), 1), true);
    check_index(info.name, arg(2).toTensor(), self.dim() ? self.size(dim) : 1, dim);
  } else if (base == "index" || base == "index_put" || base == "index_put_" ||
             base == "_index_put_impl_") {
    const at::Tensor& self = arg(0).toTensor();
    auto list = arg(1).toList();
    for (size_t k = 0; k < list.size() && static_cast<int64_t>(k) < self.dim(); ++k) {
      c10::IValue e = list.get(k);
      if (e.isTensor()) check_index(info.name, e.toTensor(), self.size(k), static_cast<int64_t>(k));
    }
  } else if (base == "embedding_dense_backward") {
    check_index(info.name, arg(1).toTensor(), arg(2).toInt(), 0);
  }
}

void debug_checks(const std::string& what, const std::vector<pjrt::BufferPtr>& outs) {
  for (const auto& o : outs) o->await_ready();
  if (!check_nans()) return;
  for (const auto& o : outs) {
    if (!is_float(o->dtype()) || o->numel() == 0) continue;
    // Host-side scan: debug mode only.
    std::vector<unsigned char> host(o->nbytes());
    o->to_host(host.data(), host.size());
    at::Tensor t = at::from_blob(host.data(), {o->numel()},
                                 c10::TensorOptions().dtype(lower::to_scalar_type(o->dtype())));
    TORCH_CHECK(t.isfinite().all().item<bool>(), "[tpu] TORCHTPU_CHECK_NANS: ", what,
                " produced NaN or Inf");
  }
}

}  // namespace

size_t program_table_limit() {
  static const size_t n = static_cast<size_t>(cache::process_config().memory_entries);
  return n;
}

pjrt::ExecutablePtr compile_cached(const std::string& mlir) {
  auto& cc = cache::process_cache(client_ptr());
  const int64_t misses = cc.stats().misses;
  auto t0 = std::chrono::steady_clock::now();
  pjrt::ExecutablePtr exe = cc.get(mlir);
  auto dt = std::chrono::steady_clock::now() - t0;
  // Disk and shared hits load a serialized executable: only misses compile.
  if (cc.stats().misses > misses) {
    metrics().compiles++;
    metrics().compile_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count();
  }
  return exe;
}

pjrt::BufferPtr zeros_buffer(DType dtype, int64_t n, int device) {
  std::vector<unsigned char> zeros(static_cast<size_t>(n) * itemsize(dtype), 0);
  int64_t dims[1] = {n};
  metrics().bytes_to_device += static_cast<int64_t>(zeros.size());
  return client().buffer_from_host(zeros.data(), dtype, dims, device);
}

at::Tensor wrap_buffer(pjrt::BufferPtr buf, c10::IntArrayRef sizes, c10::ScalarType dtype,
                       int device) {
  c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  at::Tensor t = at::empty(sizes, c10::TensorOptions().dtype(dtype).device(
                                      c10::Device(c10::DeviceType::PrivateUse1, device)));
  auto& st = device_storage(t.storage());
  st.dtype = buf->dtype();
  st.buffer = std::move(buf);
  return t;
}

hlo::Value Program::storage(int slot, DType dtype_if_empty) {
  if (current[slot].valid()) return current[slot];
  const SlotState& s = slots[slot];
  TORCH_INTERNAL_ASSERT(!s.produced, "[tpu] a fused value was read before it was produced");
  DType d = s.has_value ? s.dtype : dtype_if_empty;
  int64_t n = storage_elems(s.nbytes, d);
  if (!s.has_value) {
    // Never written: zeros made on the device, nothing uploaded.
    current[slot] = b.splat(0, Type{d, {n}});
    return current[slot];
  }
  param_of_slot[slot] = b.num_params();
  inputs.push_back({InputSource::Storage, 0, slot, -1, d, n});
  current[slot] = b.param(Type{d, {n}}, s.donate);
  return current[slot];
}

void Program::write(int slot, const at::Tensor& t, hlo::Value v, const std::string& op) {
  DType d = to_dtype(t.scalar_type());
  auto g = view_geom(t);
  int64_t n = storage_elems(slots[slot].nbytes, d);
  // As eager: no writes into expanded views, except the fills CPU allows.
  const std::string base = op.substr(0, op.find('.'));
  if (base != "fill_" && base != "zero_" && base != "masked_fill_")
    at::assert_no_internal_overlap(t);
  v = lower::coerce(b, v, Type{d, t.sizes().vec()});
  if (g.contiguous() && g.offset == 0 && g.numel() == n) {
    current[slot] = b.reshape(v, {n});  // whole overwrite: the old value is never read
  } else {
    Value flat = storage(slot, d);
    DType held = flat.dtype();
    // Write in the view's dtype, then store back in the storage's dtype.
    current[slot] =
        b.reinterpret_flat(lower::write_view(b, b.reinterpret_flat(flat, d), g, v), held);
  }
  if (std::find(written.begin(), written.end(), slot) == written.end()) written.push_back(slot);
}

std::vector<hlo::Value> lower_call(Program& p, int node, const OpInfo& info,
                                   const torch::jit::Stack& args, size_t first,
                                   const SlotOf& slot_of, const CallOutputs& outs,
                                   int64_t* rng_numel) {
  // An in-place foreach op's results are its list's new values.
  CallOutputs list_outs;
  if (info.list_write_arg >= 0) {
    for (const at::Tensor& t : args[first + info.list_write_arg].toTensorList()) {
      list_outs.types.push_back(Type{to_dtype(t.scalar_type()), t.sizes().vec()});
      list_outs.undefined.push_back(false);
    }
  }
  const CallOutputs& co = info.list_write_arg >= 0 ? list_outs : outs;
  CallCtx ctx(p, node, info, args, first, slot_of, co);
  // Every output empty (a batch of 0): the meta kernel has checked the call and
  // there is nothing to compute or write; rules need not handle empty shapes.
  const bool empty = !co.types.empty() && std::all_of(co.types.begin(), co.types.end(),
                                                      [](const Type& t) { return t.numel() == 0; });
  std::vector<Value> vals;
  if (empty) {
    for (const Type& t : co.types) vals.push_back(p.b.splat(0, t));
  } else {
    vals = (*info.rule)(ctx);
  }
  TORCH_CHECK(vals.size() == co.types.size(), "[tpu] lowering of ", info.name, " returned ",
              vals.size(), " values for ", co.types.size(), " outputs");
  if (info.list_write_arg >= 0 && !empty) {
    auto list = args[first + info.list_write_arg].toTensorList();
    for (size_t k = 0; k < vals.size(); ++k) ctx.write(list[k], vals[k]);
  }
  std::vector<Value> fresh(outs.types.size());
  size_t k = 0;
  for (size_t r = 0; r < outs.ret_lists.size(); ++r) {
    int cnt = outs.ret_lists[r] < 0 ? 1 : outs.ret_lists[r];
    int alias = r < info.ret_alias_arg.size() ? info.ret_alias_arg[r] : -1;
    for (int j = 0; j < cnt; ++j, ++k) {
      if (alias >= 0 && !empty)
        ctx.write(args[first + alias].toTensor(), vals[k]);
      else if (alias < 0 && !outs.undefined[k])
        fresh[k] = lower::coerce(p.b, vals[k], outs.types[k]);
    }
  }
  *rng_numel = ctx.rng_numel();
  return fresh;
}

CallKey key_call(const c10::OperatorHandle& op, const OpInfo& info,
                 const torch::jit::Stack& stack) {
  CallKey c;
  c.n = op.schema().arguments().size();
  c.first = stack.size() - c.n;
  c.key.reserve(256);
  put(c.key, &info);
  for (size_t i = 0; i < c.n; ++i)
    key_ivalue(c.key, stack[c.first + i], info.scalar_arg[i] != 0, c.storages);
  check_same_device(info.name, c.storages);
  for (DeviceStorage* st : c.storages)
    if (st->error) TORCH_CHECK(false, *st->error);
  return c;
}

int64_t storage_elems(size_t nbytes, DType dtype) {
  size_t is = itemsize(dtype);
  TORCH_CHECK(nbytes % is == 0, "[tpu] storage of ", nbytes,
              " bytes cannot hold whole elements of size ", is);
  return static_cast<int64_t>(nbytes / is);
}

DType pack_dtype(DType d) {
  if (d == DType::Bool) return DType::Bool;
  return is_float(d) ? DType::F64 : DType::I64;
}

c10::Scalar scalar_of(const c10::IValue& v, int sub) {
  if (!v.isTensor() && !v.isList() && !v.isTensorList()) return v.toScalar();
  if (v.isList() && !v.isTensorList()) {
    c10::IValue e = v.toList().get(sub);
    if (!e.isTensor()) return e.toScalar();  // a Scalar[] element
  }
  at::Tensor t =
      sub < 0 ? v.toTensor()
              : (v.isTensorList() ? v.toTensorList().get(sub) : v.toList().get(sub).toTensor());
  return t.item();
}

// Scalar values repeat from run to run (learning rates, constants), so the
// pack buffers are kept per content.
std::vector<pjrt::BufferPtr> scalar_packs(const std::vector<ScalarSource>& scalars,
                                          const std::vector<std::pair<DType, int>>& packs,
                                          const std::function<c10::Scalar(const ScalarSource&)>& of,
                                          int device) {
  static std::mutex mu;
  static auto& memo = *new std::unordered_map<std::string, pjrt::BufferPtr>();
  std::vector<pjrt::BufferPtr> out;
  for (const auto& [dtype, count] : packs) {
    std::string bytes;
    bytes.reserve(static_cast<size_t>(count) * 8 + 2);
    for (const ScalarSource& s : scalars) {
      if (s.dtype != dtype) continue;
      c10::Scalar v = of(s);
      if (dtype == DType::F64) {
        put(bytes, v.toDouble());
      } else if (dtype == DType::Bool) {
        put(bytes, static_cast<uint8_t>(v.toBool()));
      } else {
        put(bytes, v.toLong());
      }
    }
    const size_t nbytes = bytes.size();
    TORCH_INTERNAL_ASSERT(nbytes == static_cast<size_t>(count) * itemsize(dtype));
    bytes.push_back(static_cast<char>(dtype));
    bytes.push_back(static_cast<char>(device));
    std::lock_guard<std::mutex> lock(mu);
    auto it = memo.find(bytes);
    if (it == memo.end()) {
      int64_t dims[1] = {count};
      auto buf = client().buffer_from_host(bytes.data(), dtype, dims, device);
      metrics().bytes_to_device += static_cast<int64_t>(nbytes);
      if (memo.size() > 4096) memo.clear();
      it = memo.emplace(std::move(bytes), std::move(buf)).first;
    }
    out.push_back(it->second);
  }
  return out;
}

pjrt::BufferPtr host_input(const c10::IValue& v, int sub, int device) {
  at::Tensor t =
      sub < 0 ? v.toTensor()
              : (v.isTensorList() ? v.toTensorList().get(sub) : v.toList().get(sub).toTensor());
  t = t.contiguous();
  metrics().bytes_to_device += static_cast<int64_t>(t.nbytes());
  return client().buffer_from_host(t.data_ptr(), to_dtype(t.scalar_type()), t.sizes(), device);
}

std::optional<at::Generator> find_generator(const torch::jit::Stack& args, size_t first, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (args[first + i].isGenerator()) return args[first + i].toGenerator();
  return std::nullopt;
}

void push_returns(const OpInfo& info, const std::vector<int>& ret_lists,
                  std::vector<at::Tensor>& fresh, torch::jit::Stack& stack, size_t first) {
  torch::jit::Stack args(stack.begin() + first, stack.end());
  stack.erase(stack.begin() + first, stack.end());
  size_t f = 0;
  for (size_t r = 0; r < ret_lists.size(); ++r) {
    int alias = r < info.ret_alias_arg.size() ? info.ret_alias_arg[r] : -1;
    if (alias >= 0) {
      stack.push_back(args[alias]);
    } else if (ret_lists[r] < 0) {
      stack.push_back(std::move(fresh[f++]));
    } else {
      c10::List<at::Tensor> l;
      for (int j = 0; j < ret_lists[r]; ++j) l.push_back(std::move(fresh[f++]));
      stack.push_back(l);
    }
  }
}

void run_lowered(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack) {
  if (mode() == Mode::Fused) return fused_record(op, info, stack);
  CallKey call = key_call(op, info, *stack);
  const size_t n = call.n, first = call.first;
  std::vector<DeviceStorage*>& storages = call.storages;
  const std::string& key = call.key;
  // Another thread's fused graph may hold newer values of these storages.
  for (DeviceStorage* st : storages) fused_sync(*st, "strict_op");
  if (mode() == Mode::Debug) debug_index_checks(info, *stack, first);

  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache().find(key);
    if (it != cache().end()) entry = it->second;
  }
  if (entry) {
    metrics().cache_hits++;
  } else {
    // out= tensors of the wrong size are resized first (then the key changes).
    if (info.is_out && resize_outs(op, info, *stack, first, n, key))
      return run_lowered(op, info, stack);
    entry = compile_call(op, info, *stack, first, n, storages);
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache().size() >= program_table_limit()) cache().clear();
    cache().emplace(key, entry);
  }
  const int device = call_device(storages);
  std::vector<pjrt::BufferPtr> owned = gather_inputs(*entry, *stack, first, n, storages, device);
  std::vector<pjrt::Buffer*> raw(owned.size());
  for (size_t i = 0; i < owned.size(); ++i) raw[i] = owned[i].get();
  std::vector<pjrt::BufferPtr> outs = entry->exe->execute(raw, device);
  metrics().executions++;
  if (mode() == Mode::Debug)
    debug_checks(describe(info.name, *stack, first, n), outs);
  else if (!outs.empty())
    track_inflight(outs.back());

  push_results(*entry, info, outs, storages, device, *stack, first);
}

std::string describe(const std::string& op, const torch::jit::Stack& args, size_t first, size_t n) {
  std::ostringstream os;
  os << "aten::" << op << "(";
  auto tensor = [&](const at::Tensor& t) {
    if (!t.defined()) {
      os << "None";
      return;
    }
    os << c10::toString(t.scalar_type()) << t.sizes();
    if (!t.device().is_privateuseone()) os << "@" << t.device();
  };
  for (size_t i = 0; i < n; ++i) {
    if (i) os << ", ";
    const c10::IValue& v = args[first + i];
    if (v.isTensor())
      tensor(v.toTensor());
    else if (v.isTensorList()) {
      os << "[";
      for (const at::Tensor& t : v.toTensorList()) {
        tensor(t);
        os << " ";
      }
      os << "]";
    } else
      os << v;
  }
  os << ")";
  return os.str();
}

}  // namespace torchtpu::aten
