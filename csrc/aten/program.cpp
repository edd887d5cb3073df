#include "aten/program.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "aten/generator.h"
#include "lower/helpers.h"
#include "lower/types.h"

namespace torchtpu::aten {

using hlo::Type;
using hlo::Value;
using lower::to_dtype;

namespace {

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
  // A size-1 dim's stride moves no element (a growing sequence's last column
  // has the length as one): programs read such views alike.
  for (int64_t d = 0; d < t.dim(); ++d) put(k, t.size(d) == 1 ? int64_t{0} : t.stride(d));
  put(k, t.storage_offset());
  auto& st = device_storage(t.storage());
  put(k, static_cast<int16_t>(slot_index(slots, &st)));
  put(k, static_cast<uint64_t>(st.nbytes));
  put(k, st.has_value() ? static_cast<int8_t>(st.dtype) : int8_t(-1));
}

void key_ivalue(std::string& k, const c10::IValue& v, bool scalar,
                std::vector<DeviceStorage*>& slots);

}  // namespace

bool uniform_scalars(const c10::List<c10::IValue>& l) {
  if (l.size() < 2) return false;
  const c10::IValue first = l.get(0);
  for (const c10::IValue& e : l) {
    if (e.isDouble() && first.isDouble()) {
      if (e.toDouble() != first.toDouble()) return false;
    } else if (e.isInt() && first.isInt()) {
      if (e.toInt() != first.toInt()) return false;
    } else if (e.isBool() && first.isBool()) {
      if (e.toBool() != first.toBool()) return false;
    } else {
      return false;
    }
  }
  return true;
}

namespace {

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
    // A runtime Scalar[] whose values are all equal (AdamW's bias corrections)
    // lets a flat foreach use one scalar (foreach.cpp), so that is keyed.
    if (scalar && uniform_scalars(l)) k.push_back('u');
  } else if (scalar) {
    // Runtime input: only its kind shapes the program (type promotion).
    k.push_back(v.isDouble() ? 'f' : v.isBool() ? 'b' : v.isComplexDouble() ? 'c' : 'i');
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

DType scalar_dtype(const c10::IValue& v) {
  if (v.isDouble()) return DType::F64;
  if (v.isComplexDouble()) return DType::C128;
  if (v.isBool()) return DType::Bool;
  return DType::I64;
}

// The pack a scalar of `d` travels in.
DType pack_dtype(DType d) {
  if (d == DType::Bool) return DType::Bool;
  if (is_complex(d)) return DType::C128;
  return is_float(d) ? DType::F64 : DType::I64;
}

void check_same_device(const std::string& name, const std::vector<DeviceStorage*>& storages) {
  for (DeviceStorage* s : storages)
    TORCH_CHECK(s->device == storages[0]->device, "[tpu] ", name,
                ": expected all tensors on the same device, found tpu:", storages[0]->device,
                " and tpu:", s->device, "; move them with .to()");
}

}  // namespace

void key_value(std::string& k, const c10::IValue& v, bool scalar,
               std::vector<DeviceStorage*>& slots) {
  key_ivalue(k, v, scalar, slots);
}

int slot_index(std::vector<DeviceStorage*>& storages, DeviceStorage* s) {
  for (size_t i = 0; i < storages.size(); ++i)
    if (storages[i] == s) return static_cast<int>(i);
  storages.push_back(s);
  return static_cast<int>(storages.size()) - 1;
}

// ---- what a rule sees of a call

Value CallCtx::in(int i) {
  const c10::IValue& v = arg(i);
  TORCH_CHECK(v.isTensor(), "[tpu] ", info_.name, ": argument ", i, " is not a tensor");
  return load(v.toTensor(), i, -1);
}

std::vector<Value> CallCtx::list(int i) {
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

Value CallCtx::flat_list(int i) {
  const c10::IValue& v = arg(i);
  if (v.isTensorList()) {
    if (auto tile = tiling(v.toTensorList(), slot_of_)) {
      DType d = to_dtype(v.toTensorList().get(0).scalar_type());
      Value flat = b.reinterpret_flat(p_.storage(tile->slot, d), d);
      if (tile->begin == 0 && tile->end == flat.type.numel()) return flat;
      return b.slice(flat, {tile->begin}, {tile->end}, {1});
    }
  }
  return Ctx::flat_list(i);
}

Value CallCtx::rng_state(int64_t numel) {
  TORCH_CHECK(rng_numel_ < 0, "[tpu] ", info_.name, ": one random stream per op");
  rng_numel_ = numel;
  p_.inputs.push_back({InputSource::Rng, node_, -1, -1, DType::U64, 2});
  return b.param(Type{DType::U64, {2}});
}

Value CallCtx::load(const at::Tensor& t, int i, int sub) {
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

Value CallCtx::packed(const c10::IValue& v, int i, int sub, DType as) {
  DType d = scalar_dtype(v);
  p_.scalars.push_back({node_, i, sub, d});
  return b.convert(b.packed_scalar(d), as);
}

// ---- a program

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
  inputs.push_back({InputSource::Storage, 0, slot, -1, d, n});
  current[slot] = b.param(Type{d, {n}}, s.donate);
  return current[slot];
}

void Program::write(int slot, const at::Tensor& t, hlo::Value v, const lower::Spec& spec) {
  DType d = to_dtype(t.scalar_type());
  auto g = view_geom(t);
  int64_t n = storage_elems(slots[slot].nbytes, d);
  // As eager: no writes into expanded views, except the fills CPU allows.
  if (!spec.writes_expanded_views) at::assert_no_internal_overlap(t);
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

std::optional<Tiling> tiling(const c10::List<at::Tensor>& list, const SlotOf& slot_of) {
  if (list.size() < 2) return std::nullopt;
  const at::Tensor first = list[0];
  if (!first.defined()) return std::nullopt;
  const int slot = slot_of(first);
  if (slot < 0) return std::nullopt;
  int64_t end = first.storage_offset();
  for (const at::Tensor& t : list) {
    if (!t.defined() || slot_of(t) != slot || t.scalar_type() != first.scalar_type() ||
        t.numel() == 0 || t.storage_offset() != end || !t.is_contiguous())
      return std::nullopt;
    end += t.numel();
  }
  return Tiling{slot, first.storage_offset(), end};
}

namespace {

// A foreach op writing a list that tiles one storage range writes the range
// once, as the concatenation of the results (which XLA folds away when they
// are slices of one flat result), instead of once per tensor.
bool write_tiled(Program& p, const OpInfo& info, const c10::List<at::Tensor>& list,
                 const SlotOf& slot_of, const std::vector<Value>& vals) {
  auto tile = tiling(list, slot_of);
  if (!tile) return false;
  std::vector<Value> parts;
  parts.reserve(vals.size());
  for (size_t k = 0; k < vals.size(); ++k) {
    const at::Tensor t = list[k];
    Value v = lower::coerce(p.b, vals[k], hlo::Type{to_dtype(t.scalar_type()), t.sizes().vec()});
    parts.push_back(p.b.reshape(v, {t.numel()}));
  }
  const at::Tensor first = list[0];
  at::Tensor range = at::empty({tile->end}, first.options().device(c10::kMeta))
                         .as_strided({tile->end - tile->begin}, {1}, tile->begin);
  p.write(tile->slot, range, p.b.concatenate(parts, 0), *info.spec);
  return true;
}

}  // namespace

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
    if (!write_tiled(p, info, list, slot_of, vals))
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

void Program::finish(const std::vector<Value>& results, ProgramEntry& entry, CodegenParts parts,
                     const char* dump_dir) {
  b.ret(results);
  entry.inputs = std::move(inputs);
  entry.scalars = std::move(scalars);
  entry.packs = b.packs();
  std::string text = b.module();
  if (const char* dir = dump_dir ? std::getenv(dump_dir) : nullptr) {
    static std::atomic<int> count{0};
    std::string path = std::string(dir) + "/fused_" + std::to_string(count++) + ".mlir";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
  }
  const hlo::Builder::Replication& rep = b.replication();
  if (rep.tag < 0) return compile_program(text, entry, parts);
  // Every replica runs this build: no tiers.
  entry.exe = compile_cached(text, replica_options(rep.devices));
  entry.replica_group = rep.tag;
  entry.replica_key = std::hash<std::string>{}(text);
}

std::shared_ptr<ProgramEntry> compile_call(const c10::OperatorHandle& op, const OpInfo& info,
                                           const torch::jit::Stack& args, size_t first, size_t n,
                                           std::vector<DeviceStorage*>& storages,
                                           const std::vector<int>& donate) {
  auto entry = std::make_shared<ProgramEntry>();
  CallOutputs outs = call_outputs(op, info, args, first, n);
  entry->ret_lists = outs.ret_lists;
  Program p;
  for (DeviceStorage* st : storages) p.add_slot({st->has_value(), st->dtype, st->nbytes});
  for (int slot : donate) p.slots[slot].donate = true;
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
  p.finish(results, *entry);
  return entry;
}

CallKey key_call(const c10::OperatorHandle& op, const OpInfo& info,
                 const torch::jit::Stack& stack) {
  CallKey c;
  c.n = op.schema().arguments().size();
  c.first = stack.size() - c.n;
  c.key.reserve(256);
  c.storages.reserve(4);
  c.key.push_back('S');  // the program table's keys start with their runner's letter
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

c10::Scalar scalar_of(const c10::IValue& v, int sub) {
  if (!v.isTensor() && !v.isList() && !v.isTensorList()) return v.toScalar();
  if (v.isList() && !v.isTensorList()) {
    c10::IValue e = v.toList().get(sub);
    if (!e.isTensor()) return e.toScalar();  // a Scalar[] element
  }
  at::Tensor t =
      sub < 0 ? v.toTensor()
              : (v.isTensorList() ? v.toTensorList().get(sub) : v.toList().get(sub).toTensor());
  // A host scalar (a Python number's wrapped tensor) is read in place: item()
  // would go through the dispatcher on every op call.
  if (t.device().is_cpu() && t.numel() == 1) {
    const void* p = t.const_data_ptr();
    switch (t.scalar_type()) {
      case c10::kDouble: return *static_cast<const double*>(p);
      case c10::kFloat: return *static_cast<const float*>(p);
      case c10::kLong: return *static_cast<const int64_t*>(p);
      case c10::kInt: return *static_cast<const int32_t*>(p);
      case c10::kBool: return *static_cast<const bool*>(p);
      default: break;
    }
  }
  return t.item();
}

namespace {

// Scalar values repeat from run to run (learning rates, constants), so the
// pack buffers are kept per content.
void add_scalar_packs(const ProgramEntry& entry, InputFeed& feed, int device,
                      std::vector<pjrt::BufferPtr>& out) {
  static std::mutex mu;
  static auto& memo = *new std::unordered_map<std::string, pjrt::BufferPtr>();
  for (const auto& [dtype, count] : entry.packs) {
    std::string bytes;
    bytes.reserve(static_cast<size_t>(count) * 8 + 2);
    for (const ScalarSource& s : entry.scalars) {
      if (s.dtype != dtype) continue;
      c10::Scalar v = feed.scalar(s);
      if (dtype == DType::F64) {
        put(bytes, v.toDouble());
      } else if (dtype == DType::C128) {
        c10::complex<double> z = v.toComplexDouble();
        put(bytes, z.real());
        put(bytes, z.imag());
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
}

}  // namespace

std::vector<pjrt::BufferPtr> gather_inputs(const ProgramEntry& entry, InputFeed& feed, int device) {
  std::vector<pjrt::BufferPtr> owned;
  owned.reserve(entry.inputs.size() + entry.packs.size());
  for (const InputSource& in : entry.inputs) {
    switch (in.kind) {
      case InputSource::Storage: owned.push_back(feed.storage(in.index)); break;
      case InputSource::Host: owned.push_back(feed.host(in)); break;
      case InputSource::Rng: {
        uint64_t state[2];
        feed.rng(in, state);
        int64_t dims[1] = {2};
        owned.push_back(client().buffer_from_host(state, DType::U64, dims, device));
        break;
      }
    }
  }
  add_scalar_packs(entry, feed, device, owned);
  return owned;
}

pjrt::BufferPtr host_input(const c10::IValue& v, int sub, int device) {
  at::Tensor t =
      sub < 0 ? v.toTensor()
              : (v.isTensorList() ? v.toTensorList().get(sub) : v.toList().get(sub).toTensor());
  t = t.contiguous();
  return upload(t.data_ptr(), to_dtype(t.scalar_type()), t.sizes(), device);
}

std::optional<at::Generator> find_generator(const torch::jit::Stack& args, size_t first, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (args[first + i].isGenerator()) return args[first + i].toGenerator();
  return std::nullopt;
}

void push_returns(const OpInfo& info, const std::vector<int>& ret_lists,
                  c10::SmallVectorImpl<at::Tensor>& fresh, torch::jit::Stack& stack, size_t first) {
  // Returns replace the arguments; aliased ones are kept aside first (most ops alias none).
  c10::SmallVector<c10::IValue, 2> aliased;
  for (int alias : info.ret_alias_arg)
    if (alias >= 0) aliased.push_back(stack[first + alias]);
  stack.erase(stack.begin() + first, stack.end());
  size_t f = 0, a = 0;
  for (size_t r = 0; r < ret_lists.size(); ++r) {
    int alias = r < info.ret_alias_arg.size() ? info.ret_alias_arg[r] : -1;
    if (alias >= 0) {
      stack.push_back(std::move(aliased[a++]));
    } else if (ret_lists[r] < 0) {
      stack.push_back(std::move(fresh[f++]));
    } else {
      c10::List<at::Tensor> l;
      for (int j = 0; j < ret_lists[r]; ++j) l.push_back(std::move(fresh[f++]));
      stack.push_back(l);
    }
  }
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
