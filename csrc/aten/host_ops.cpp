#include "aten/host_ops.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>

#include "aten/copy.h"
#include "aten/events.h"
#include "aten/fused.h"
#include "aten/program.h"
#include "lower/types.h"

namespace torchtpu::aten {

using lower::to_dtype;

namespace {

constexpr size_t kMaxStorageBytes = 64 << 10;

// Programs of one op and argument structure compiled before new shapes of
// it run on the host (0: never).
int churn_limit() {
  const char* v = std::getenv("TORCHTPU_HOST_CHURN");
  return v && *v ? std::atoi(v) : 2;
}

std::mutex mu;
// Per op signature: programs compiled, and calls run on the host.
struct Churn {
  int programs = 0;
  int64_t host_runs = 0;
  bool again = false;  // a growing sequence came back: bucketed programs pay off
};
std::unordered_map<std::string, Churn>& churn_per_signature() {
  static std::unordered_map<std::string, Churn> m;
  return m;
}
// A call key that ran on the host: how often, and the signature's host runs
// at its last one.
struct KeyRuns {
  int runs = 0;
  int64_t last = 0;
};
// Host runs of a key before it is compiled, and the most host runs of its
// signature between two of its own: a key that keeps coming back among few
// other shapes is a loop's. One that comes back only after many others is a
// growing sequence run again (`generate` once more); compiling each of those
// would compile every length at once.
constexpr int kHostRunsBeforeCompile = 8;
std::unordered_map<std::string, KeyRuns>& host_runs() {
  static std::unordered_map<std::string, KeyRuns> m;
  return m;
}
std::map<std::string, int64_t>& host_calls() {
  static std::map<std::string, int64_t> m;
  return m;
}

void sig_tensor(std::string& s, const at::Tensor& t) {
  if (!t.defined()) {
    s.push_back('u');
    return;
  }
  s.push_back(static_cast<char>(t.scalar_type()));
  s.push_back(static_cast<char>(t.dim()));
  s.push_back(t.device().is_privateuseone() ? 'T' : 'H');
}

}  // namespace

std::string call_signature(const OpInfo& info, const torch::jit::Stack& stack, size_t first,
                           size_t n) {
  std::string s = info.name;
  s.push_back('|');
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      sig_tensor(s, v.toTensor());
    } else if (v.isTensorList()) {
      s.push_back('L');
      s.push_back(static_cast<char>(v.toTensorList().size()));
      for (const at::Tensor& t : v.toTensorList()) sig_tensor(s, t);
    } else if (v.isList()) {
      s.push_back('l');
      for (const c10::IValue& e : v.toList())
        if (e.isTensor()) sig_tensor(s, e.toTensor());
    } else {
      s.push_back(static_cast<char>(v.tagKind().size()));
    }
  }
  return s;
}

namespace {

// Calls f on each tensor of an argument or return: a Tensor, the elements
// of a Tensor[] and the present elements of a Tensor?[].
template <class F>
void each_tensor(const c10::IValue& v, F&& f) {
  if (v.isTensor()) f(v.toTensor());
  if (v.isTensorList())
    for (const at::Tensor& t : v.toTensorList()) f(t);
  if (v.isList())
    for (const c10::IValue& e : v.toList())
      if (e.isTensor()) f(e.toTensor());
}

bool small_int_tensor(const at::Tensor& t) {
  return !t.defined() || c10::isIntegralType(t.scalar_type(), /*includeBool=*/true);
}

// Integer and bool tensors only (exact on any device), no random stream
// (the host's generator is not the device's), small storages.
bool eligible(const torch::jit::Stack& stack, size_t first, size_t n,
              const std::vector<DeviceStorage*>& storages) {
  if (storages.empty()) return false;
  size_t bytes = 0;
  for (const DeviceStorage* st : storages) bytes += st->nbytes;
  if (bytes > kMaxStorageBytes) return false;
  bool ok = true;
  for (size_t i = 0; i < n; ++i) {
    if (stack[first + i].isGenerator()) return false;
    each_tensor(stack[first + i], [&](const at::Tensor& t) { ok = ok && small_int_tensor(t); });
  }
  return ok;
}

// Host copies of whole device storages, so every view reads and writes the
// host bytes without a program per view geometry.
class HostStorages {
 public:
  at::Tensor view(const at::Tensor& t, bool write) {
    if (!t.defined() || !t.device().is_privateuseone()) return t;
    DeviceStorage& st = device_storage(t.storage());
    auto it = flats_.find(&st);
    if (it == flats_.end()) {
      if (write) fused_sync(st, "host_op", true);
      at::Tensor bytes = storage_bytes_to_host(t, "host_op");
      it = flats_.emplace(&st, Entry{bytes, to_dtype(t.scalar_type()), false}).first;
    } else if (write && !it->second.written) {
      fused_sync(st, "host_op", true);
    }
    if (write) {
      it->second.written = true;
      it->second.dtype = st.buffer ? st.dtype : to_dtype(t.scalar_type());
    }
    return view_of_bytes(it->second.flat, t);
  }
  // Uploads every written storage whole.
  void write_back() {
    for (auto& [st, e] : flats_) {
      if (!e.written) continue;
      int64_t dims[1] = {static_cast<int64_t>(st->nbytes / itemsize(e.dtype))};
      st->buffer = upload(e.flat.data_ptr(), e.dtype, dims, st->device);
      st->dtype = e.dtype;
    }
  }

 private:
  struct Entry {
    at::Tensor flat;
    DType dtype;
    bool written;
  };
  std::unordered_map<DeviceStorage*, Entry> flats_;
};

at::Tensor to_device(const at::Tensor& host, int device) {
  if (!host.defined()) return host;
  at::Tensor c = host.contiguous();
  int64_t dims[1] = {c.numel()};
  return wrap_buffer(upload(c.data_ptr(), to_dtype(c.scalar_type()), dims, device), c.sizes(),
                     c.scalar_type(), device);
}

void host_run(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
              size_t first, size_t n, int device) {
  SyncReason why("host_op");
  const auto& args = op.schema().arguments();
  HostStorages host;
  torch::jit::Stack cpu;
  cpu.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[first + i];
    const bool write = args[i].alias_info() && args[i].alias_info()->isWrite();
    if (v.isTensor()) {
      cpu.emplace_back(host.view(v.toTensor(), write));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList()) l.push_back(host.view(t, write));
      cpu.emplace_back(l);
    } else if (v.isList() && v.toList().elementType()->kind() == c10::TypeKind::OptionalType) {
      c10::List<std::optional<at::Tensor>> l;
      for (const c10::IValue& e : v.toList())
        l.push_back(e.isTensor() ? std::optional<at::Tensor>(host.view(e.toTensor(), write))
                                 : std::nullopt);
      cpu.emplace_back(l);
    } else {
      cpu.push_back(v);
    }
  }
  call_boxed_holding_args(op, &cpu);
  host.write_back();

  const auto& rets = op.schema().returns();
  torch::jit::Stack out;
  for (size_t r = 0; r < rets.size(); ++r) {
    // An out= or in-place return is its (device) argument.
    if (const c10::AliasInfo* a = rets[r].alias_info()) {
      for (size_t i = 0; i < n; ++i)
        if (args[i].alias_info() && args[i].alias_info()->beforeSets() == a->beforeSets()) {
          out.push_back((*stack)[first + i]);
          break;
        }
      continue;
    }
    const c10::IValue& v = cpu[r];
    if (v.isTensor()) {
      out.emplace_back(to_device(v.toTensor(), device));
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> l;
      for (const at::Tensor& t : v.toTensorList()) l.push_back(to_device(t, device));
      out.emplace_back(l);
    } else {
      out.push_back(v);
    }
  }
  TORCH_INTERNAL_ASSERT(out.size() == rets.size(), "[tpu] ", info.name,
                        ": a host run could not match its returns to the arguments");
  torch::jit::drop(*stack, n);
  for (c10::IValue& v : out) stack->push_back(std::move(v));
}

}  // namespace

NewShape new_shape(const OpInfo& info, const torch::jit::Stack& stack, size_t first, size_t n,
                   const std::vector<DeviceStorage*>& storages, const std::string& key) {
  if (churn_limit() <= 0 || !eligible(stack, first, n, storages)) return NewShape::Compile;
  return shape_churn(call_signature(info, stack, first, n), key);
}

void run_on_host(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack,
                 size_t first, size_t n, const std::vector<DeviceStorage*>& storages) {
  count_host_call(info.name);
  host_run(op, info, stack, first, n, storages[0]->device);
}

void count_host_call(const std::string& name) {
  thread_work().host_ops++;
  std::lock_guard<std::mutex> lock(mu);
  ++host_calls()[name];
}

NewShape shape_churn(const std::string& signature, const std::string& key) {
  const int limit = churn_limit();
  if (limit <= 0) return NewShape::Compile;
  std::lock_guard<std::mutex> lock(mu);
  Churn& c = churn_per_signature()[signature];
  auto& runs = host_runs();
  if (runs.size() > 4096) runs.clear();
  bool compile = c.programs < limit;
  if (!compile) {
    KeyRuns& k = runs[key];
    const bool near = k.runs == 0 || c.host_runs - k.last <= kHostRunsBeforeCompile;
    // A key back after many other shapes: the sequence runs again.
    if (!near) c.again = true;
    k.runs = near ? k.runs + 1 : 1;
    k.last = ++c.host_runs;
    compile = k.runs > kHostRunsBeforeCompile;
  }
  if (compile) {
    ++c.programs;
    runs.erase(key);
    return NewShape::Compile;
  }
  return c.again ? NewShape::BucketedElseHost : NewShape::Host;
}

namespace {

thread_local int value_sized_depth = 0;
std::mutex sizes_mu;
// The last few value-read sizes (one MoE step reads a count per expert and layer).
std::array<int64_t, 64> recent_sizes;
size_t recent_count = 0;

bool recent_size(int64_t n) {
  std::lock_guard<std::mutex> lock(sizes_mu);
  const size_t k = std::min(recent_count, recent_sizes.size());
  return std::find(recent_sizes.begin(), recent_sizes.begin() + k, n) != recent_sizes.begin() + k;
}

void mark(const at::Tensor& t, const std::vector<DeviceStorage*>& inputs) {
  if (!t.defined() || !t.device().is_privateuseone()) return;
  DeviceStorage& st = device_storage(t.storage());
  if (std::find(inputs.begin(), inputs.end(), &st) != inputs.end()) return;
  for (int64_t s : t.sizes())
    if (recent_size(s)) {
      st.value_sized = true;
      return;
    }
}

}  // namespace

void note_value_size(int64_t n) {
  std::lock_guard<std::mutex> lock(sizes_mu);
  recent_sizes[recent_count++ % recent_sizes.size()] = n;
}

ValueSizedScope::ValueSizedScope() { ++value_sized_depth; }
ValueSizedScope::~ValueSizedScope() { --value_sized_depth; }

bool in_value_sized_scope() { return value_sized_depth > 0; }

bool value_sized_call(const std::vector<DeviceStorage*>& storages) {
  if (value_sized_depth > 0) return true;
  for (const DeviceStorage* st : storages)
    if (st->value_sized) return true;
  return false;
}

std::vector<DeviceStorage*> read_storages(const c10::OperatorHandle& op,
                                          const torch::jit::Stack& stack, size_t first, size_t n) {
  std::vector<DeviceStorage*> out;
  const auto& args = op.schema().arguments();
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && t.device().is_privateuseone()) out.push_back(&device_storage(t.storage()));
  };
  for (size_t i = 0; i < n; ++i) {
    if (args[i].alias_info() && args[i].alias_info()->isWrite()) continue;
    each_tensor(stack[first + i], add);
  }
  return out;
}

void mark_value_sized_outputs(const torch::jit::Stack& stack, size_t n_returns,
                              const std::vector<DeviceStorage*>& read) {
  for (size_t i = stack.size() - n_returns; i < stack.size(); ++i)
    each_tensor(stack[i], [&](const at::Tensor& t) { mark(t, read); });
}

std::vector<std::pair<std::string, int64_t>> host_op_report() {
  std::lock_guard<std::mutex> lock(mu);
  return {host_calls().begin(), host_calls().end()};
}

void reset_host_op_report() {
  std::lock_guard<std::mutex> lock(mu);
  host_calls().clear();
}

}  // namespace torchtpu::aten
