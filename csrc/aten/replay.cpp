#include "aten/replay.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "aten/copy.h"
#include "aten/fused.h"
#include "aten/fused_graph.h"
#include "aten/generator.h"
#include "aten/host_ops.h"
#include "aten/launch.h"
#include "aten/program.h"

namespace torchtpu::aten {
namespace {

constexpr int kDrop = -3;

// An argument's layout as the program saw it: a replay needs the same.
struct ArgSig {
  int device;
  c10::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
  size_t nbytes;
  DType st_dtype;
  bool has_value;
  int same_as;  // an earlier argument with the same storage, or -1
};

// An output: a view of a storage the program created, or of an argument's.
struct OutView {
  bool fresh;
  int index;  // fresh storage (by result) or argument
  c10::ScalarType dtype;
  std::vector<int64_t> sizes, strides;
  int64_t offset;
};

struct Replay {
  std::shared_ptr<const ProgramEntry> entry;
  int device = 0;
  std::vector<ArgSig> args;
  // Per program input: an argument's storage (>= 0), a constant (-1: the
  // captured buffer: host tensors, packed scalars) or random numbers (-2).
  std::vector<int> in_arg;
  std::vector<pjrt::BufferPtr> in_const;
  std::vector<int64_t> in_rng;
  std::vector<char> in_donated;
  // Per result: written to an argument's storage (>= 0), fresh (-1) or
  // dropped (kDrop: its storage died before the graph ran).
  std::vector<int> res_arg;
  std::vector<size_t> res_nbytes;
  std::vector<OutView> outs;
};

std::mutex g_mu;
// Leaked, as the runtime's client: captures alive at exit hold buffers and
// storages, which must not be freed by static destructors after the runtime.
auto& g_replays = *new std::unordered_map<int64_t, std::shared_ptr<const Replay>>();
int64_t g_next = 0;

// This thread's counts (runtime.h ThreadWork): other threads' work never spoils a capture.
struct Counters {
  int64_t executions, fused_ops, host_syncs, fallbacks, host_ops;
  static Counters now() {
    const ThreadWork& w = thread_work();
    return {w.executions, w.fused_ops, thread_host_syncs(), w.fallbacks, w.host_ops};
  }
  // Why what this thread did since `before` did not all go into `g` as recorded
  // calls (a program ran, a host read, a CPU op, a cut), or "" when it did.
  std::string spoiled_since(const Counters& before, const fused::Graph& g) const {
    if (host_syncs != before.host_syncs)
      return "the host read a tpu value during the capture (.item(), .cpu(), printing, "
             "a data-dependent size)";
    if (fallbacks != before.fallbacks || host_ops != before.host_ops)
      return "an op ran on the CPU during the capture";
    if (executions != before.executions)
      return "a program ran during the capture (a graph cut, or an op run on its own)";
    if (g.nodes.empty()) return "it recorded no tpu ops";
    if (fused_ops - before.fused_ops != static_cast<int64_t>(g.nodes.size()))
      return "ops it recorded ran before its end (ops on another tpu device, or another "
             "thread's read of a value it made)";
    return "";
  }
};
thread_local std::optional<Counters> t_begin;

// Fresh Philox state for a replayed program's random-number input.
pjrt::BufferPtr rng_input(int device, int64_t numel) {
  uint64_t state[2];
  philox_take(std::nullopt, device, numel, state);
  int64_t dims[1] = {2};
  return client().buffer_from_host(state, DType::U64, dims, device);
}

int index_of(const std::vector<DeviceStorage*>& v, const DeviceStorage* s) {
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == s) return static_cast<int>(i);
  return -1;
}

ArgSig signature(const at::Tensor& t, const std::vector<DeviceStorage*>& seen) {
  const DeviceStorage& st = device_storage(t.storage());
  return {st.device, t.scalar_type(), t.sizes().vec(), t.strides().vec(),  t.storage_offset(),
          st.nbytes, st.dtype,        st.has_value(),  index_of(seen, &st)};
}

// signature(t, seen) == sig, without building the signature.
bool matches(const at::Tensor& t, const DeviceStorage& st, const ArgSig& sig,
             const std::vector<DeviceStorage*>& seen) {
  if (st.device != sig.device || t.scalar_type() != sig.dtype || st.nbytes != sig.nbytes ||
      st.dtype != sig.st_dtype || st.has_value() != sig.has_value ||
      t.storage_offset() != sig.offset || !t.sizes().equals(sig.sizes) ||
      !t.strides().equals(sig.strides))
    return false;
  // Shares a storage with the same earlier argument as in the capture (or none).
  return index_of(seen, &st) == sig.same_as;
}

bool on_device(const at::Tensor& t) { return t.defined() && t.device().is_privateuseone(); }

// The arguments' storages, or nullopt when one is not a tpu tensor.
std::optional<std::vector<DeviceStorage*>> storages_of(at::TensorList args) {
  std::vector<DeviceStorage*> st;
  st.reserve(args.size());
  for (const at::Tensor& t : args) {
    if (!on_device(t)) return std::nullopt;
    st.push_back(&device_storage(t.storage()));
  }
  return st;
}

thread_local std::string t_why;

std::shared_ptr<Replay> refuse(std::string why) {
  t_why = std::move(why);
  return nullptr;
}

// The replay of what the flush ran, or null (t_why says why) when something escapes it.
std::shared_ptr<Replay> build(const fused::FlushCapture& c, at::TensorList args,
                              at::TensorList outs, int device) {
  auto st = storages_of(args);
  if (!st) return refuse("an argument is not a tpu tensor");
  if (c.parts != 1 || !c.entry)
    return refuse("the graph ran as " + std::to_string(c.parts) + " programs");
  if (c.replicated) return refuse("the graph holds SPMD collectives");
  auto r = std::make_shared<Replay>();
  r->entry = c.entry;
  r->device = device;
  std::vector<DeviceStorage*> seen;
  for (const at::Tensor& a : args) {
    r->args.push_back(signature(a, seen));
    seen.push_back(&device_storage(a.storage()));
  }
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const bool is_input = i < c.entry->inputs.size();
    const auto kind = is_input ? c.entry->inputs[i].kind : InputSource::Host;
    int arg = -1;
    if (kind == InputSource::Storage) {
      arg = index_of(*st, c.in_storage[i]);
      if (arg < 0) return refuse("the graph reads a tpu storage that is not an argument");
    } else if (kind == InputSource::Rng) {
      if (c.rng_generator[i]) return refuse("the graph draws from an explicit generator");
      arg = -2;
    }
    r->in_arg.push_back(arg);
    r->in_const.push_back(arg == -1 ? c.inputs[i] : nullptr);
    r->in_rng.push_back(kind == InputSource::Rng ? c.rng_numel[i] : -1);
    r->in_donated.push_back(c.donated[i]);
  }
  std::vector<DeviceStorage*> results;
  for (size_t k = 0; k < c.out_storage.size(); ++k) {
    DeviceStorage* s = c.out_storage[k];
    int arg = s ? index_of(*st, s) : kDrop;
    if (arg == -1 && !c.out_fresh[k])
      return refuse("the graph writes a tpu storage that is not an argument");
    r->res_arg.push_back(arg);
    r->res_nbytes.push_back(s ? s->nbytes : 0);
    results.push_back(s);
  }
  std::vector<char> used(results.size(), 0);
  for (const at::Tensor& o : outs) {
    if (!on_device(o)) return refuse("an output is not a tpu tensor");
    const DeviceStorage* s = &device_storage(o.storage());
    OutView v{false,           index_of(*st, s),  o.scalar_type(),
              o.sizes().vec(), o.strides().vec(), o.storage_offset()};
    if (v.index < 0) {
      int k = index_of(results, s);
      if (k < 0 || r->res_arg[k] >= 0) return refuse("an output was made outside the program");
      v = {true, k, v.dtype, std::move(v.sizes), std::move(v.strides), v.offset};
      used[k] = 1;
    }
    r->outs.push_back(std::move(v));
  }
  // A fresh value that no output holds lives somewhere a replay cannot reach.
  for (size_t k = 0; k < results.size(); ++k)
    if (r->res_arg[k] == -1 && !used[k])
      return refuse("a value the graph made is held outside its outputs");
  return r;
}

// A new tensor viewing `st` (a tpu storage) with the recorded geometry.
at::Tensor view_of(const c10::Storage& st, const OutView& v) {
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(st), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::scalarTypeToTypeMeta(v.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(v.sizes, v.strides, v.offset);
  return t;
}

c10::Storage fresh_storage(size_t nbytes, pjrt::BufferPtr buf, int device) {
  std::optional<c10::DeviceGuard> guard;
  if (device != current_device())
    guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device)));
  c10::Storage s(c10::Storage::use_byte_size_t(), nbytes, allocator(), /*resizable=*/true);
  DeviceStorage& d = device_storage(s);
  d.dtype = buf->dtype();
  d.buffer = std::move(buf);
  return s;
}

// Runs the graph; with `cap`, the flush reports its program into it.
void flush_reporting(fused::Graph& g, fused::FlushCapture* cap, const char* reason) {
  g.capture = cap;
  try {
    fused::flush_locked(g, reason);
  } catch (...) {
    g.capture = nullptr;
    throw;
  }
  g.capture = nullptr;
}

}  // namespace

void capture_begin() { t_begin = Counters::now(); }

int64_t capture_end(at::TensorList args, at::TensorList outs) {
  // The graph of the device the compiled graph ran on.
  int on = -1;
  for (at::TensorList l : {outs, args})
    for (const at::Tensor& t : l)
      if (on < 0 && t.defined() && t.device().is_privateuseone()) on = t.device().index();
  fused::Graph& g = fused::graph(on < 0 ? current_device() : on);
  fused::GraphLock lock(g);
  std::optional<Counters> before = std::exchange(t_begin, std::nullopt);
  // Everything the graph did was recorded into this one graph.
  const std::string why =
      before ? Counters::now().spoiled_since(*before, g) : "no capture was started";
  fused::FlushCapture cap;
  const int device = g.device;
  flush_reporting(g, why.empty() ? &cap : nullptr, "compiled_graph");
  if (!why.empty()) {
    t_why = why;
    return 0;
  }
  std::shared_ptr<Replay> r = build(cap, args, outs, device);
  if (!r) return 0;
  std::lock_guard<std::mutex> l(g_mu);
  g_replays.emplace(++g_next, std::move(r));
  return g_next;
}

std::optional<std::vector<at::Tensor>> replay_graph(int64_t handle, at::TensorList args) {
  std::shared_ptr<const Replay> r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_replays.find(handle);
    TORCH_CHECK(it != g_replays.end(), "[tpu] no captured graph ", handle);
    r = it->second;
  }
  auto st = storages_of(args);
  if (!st || args.size() != r->args.size()) return std::nullopt;
  // Values still recorded by Fused Eager run first (their buffers are read).
  for (DeviceStorage* s : *st)
    if (s->pending) {
      fused_flush("compiled_graph");
      break;
    }
  std::vector<DeviceStorage*> seen;
  seen.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    if ((*st)[i]->error) TORCH_CHECK(false, *(*st)[i]->error);
    if (!matches(args[i], *(*st)[i], r->args[i], seen)) return std::nullopt;
    seen.push_back((*st)[i]);
  }
  const size_t n_in = r->in_arg.size();
  // A donated buffer must have no other holder (the program consumes it).
  for (size_t i = 0; i < n_in; ++i) {
    if (!r->in_donated[i]) continue;
    const pjrt::BufferPtr& b = (*st)[r->in_arg[i]]->buffer;
    if (!b || b.use_count() - b->queued_uses() != 1) return std::nullopt;
  }
  std::vector<pjrt::BufferPtr> inputs(n_in);
  for (size_t i = 0; i < n_in; ++i) {
    const int a = r->in_arg[i];
    if (a >= 0) {
      inputs[i] = (*st)[a]->buffer;
    } else if (a == -1) {
      inputs[i] = r->in_const[i];
    } else {
      inputs[i] = rng_input(r->device, r->in_rng[i]);
    }
  }
  std::vector<pjrt::BufferPtr> results = launch(*r->entry, inputs, r->device);
  inputs.clear();
  metrics().graph_replays++;
  std::vector<c10::Storage> fresh(results.size());
  for (size_t k = 0; k < results.size(); ++k) {
    const int a = r->res_arg[k];
    if (a >= 0) {
      (*st)[a]->dtype = results[k]->dtype();
      (*st)[a]->buffer = std::move(results[k]);
      // As the graph's own in-place ops would: autograd sees the argument changed.
      for (size_t i = 0; i < args.size(); ++i)
        if ((*st)[i] == (*st)[a] && !args[i].is_inference())
          args[i].unsafeGetTensorImpl()->bump_version();
    } else if (a == -1) {
      fresh[k] = fresh_storage(r->res_nbytes[k], std::move(results[k]), r->device);
    }
  }
  std::vector<at::Tensor> outs;
  outs.reserve(r->outs.size());
  for (const OutView& v : r->outs)
    outs.push_back(view_of(v.fresh ? fresh[v.index] : args[v.index].storage(), v));
  return outs;
}

const std::string& capture_refusal() { return t_why; }

void refuse_capture(const std::string& why) {
  t_begin.reset();
  t_why = why;
}

void release_graph(int64_t handle) {
  std::lock_guard<std::mutex> l(g_mu);
  g_replays.erase(handle);
}

namespace {

// A captured region: per program input, the storage it reads (kept alive), or
// a constant buffer, or random numbers; per result, the storage it becomes.
struct Region {
  std::shared_ptr<const ProgramEntry> entry;
  int device = 0;
  std::vector<c10::Storage> in_storage;  // undefined: not a storage input
  std::vector<pjrt::BufferPtr> in_const;
  std::vector<int64_t> in_rng;
  std::vector<char> in_donated;
  struct Layout {
    DType dtype;
    int64_t numel;
    size_t nbytes;
  };
  std::vector<Layout> in_layout;  // storage inputs: the buffer's dtype and size, the storage's
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> out_storage;
  // Returned outputs (region_end's `outs`): a view of a result that each replay
  // wraps in a new storage (`fresh`, and that result is not written back), or of
  // a storage the region keeps.
  std::vector<char> res_returned;
  std::vector<size_t> res_nbytes;
  std::vector<OutView> outs;
  std::vector<c10::Storage> out_kept;  // per output: the kept storage (not fresh)
};

// Under g_mu; leaked like g_replays.
auto& g_regions = *new std::unordered_map<int64_t, std::shared_ptr<const Region>>();
thread_local fused::Graph* t_region_graph = nullptr;
thread_local fused::RegionStorages* t_region_seen = nullptr;

// Stops recording this thread's region; returns what it saw.
std::unique_ptr<fused::RegionStorages> leave_region(fused::Graph& g) {
  std::unique_ptr<fused::RegionStorages> seen(std::exchange(t_region_seen, nullptr));
  g.region = nullptr;
  t_region_graph = nullptr;
  return seen;
}

std::shared_ptr<Region> build_region(const fused::FlushCapture& c,
                                     const fused::RegionStorages& seen, at::TensorList outs,
                                     int device) {
  if (c.parts != 1 || !c.entry)
    throw std::runtime_error("it ran as " + std::to_string(c.parts) + " programs");
  // SPMD collectives (thread ranks): each rank replays its replica; launch meets the others.
  auto r = std::make_shared<Region>();
  r->entry = c.entry;
  r->device = device;
  auto storage_of = [&](const DeviceStorage* st) -> c10::Storage {
    auto it = seen.find(st);
    if (it == seen.end()) return {};
    auto impl = it->second.lock();
    return impl ? c10::Storage(std::move(impl)) : c10::Storage();
  };
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const bool is_input = i < c.entry->inputs.size();
    const auto kind = is_input ? c.entry->inputs[i].kind : InputSource::Host;
    c10::Storage st;
    if (kind == InputSource::Storage && c.in_storage[i]) {
      st = storage_of(c.in_storage[i]);
      if (!st) throw std::runtime_error("it reads a tpu storage it cannot keep");
    } else if (kind == InputSource::Rng && c.rng_generator[i]) {
      throw std::runtime_error("it draws from an explicit generator");
    }
    // A storage that died during the capture keeps the value it had then.
    const bool rng = kind == InputSource::Rng;
    r->in_layout.push_back({c.inputs[i] ? c.inputs[i]->dtype() : DType::U8,
                            c.inputs[i] ? c.inputs[i]->numel() : 0,
                            st ? device_storage(st).nbytes : 0});
    r->in_storage.push_back(std::move(st));
    r->in_const.push_back(r->in_storage.back() || rng ? nullptr : c.inputs[i]);
    r->in_rng.push_back(rng ? c.rng_numel[i] : -1);
    r->in_donated.push_back(c.donated[i]);
  }
  for (const DeviceStorage* st : c.out_storage) {
    auto it = st ? seen.find(st) : seen.end();
    r->out_storage.push_back(it == seen.end() ? c10::weak_intrusive_ptr<c10::StorageImpl>(
                                                    c10::intrusive_ptr<c10::StorageImpl>())
                                              : it->second);
    r->res_nbytes.push_back(st ? st->nbytes : 0);
  }
  r->res_returned.assign(c.out_storage.size(), 0);
  for (const at::Tensor& o : outs) {
    if (!on_device(o)) throw std::runtime_error("it returns a tensor that is not on tpu");
    const DeviceStorage* s = &device_storage(o.storage());
    OutView v{false, -1, o.scalar_type(), o.sizes().vec(), o.strides().vec(), o.storage_offset()};
    for (size_t k = 0; k < c.out_storage.size() && v.index < 0; ++k)
      if (c.out_storage[k] == s && c.out_fresh[k])
        v = {true, static_cast<int>(k), v.dtype, v.sizes, v.strides, v.offset};
    if (v.fresh) r->res_returned[v.index] = 1;
    r->out_kept.push_back(v.fresh ? c10::Storage() : o.storage());
    r->outs.push_back(std::move(v));
  }
  return r;
}

}  // namespace

bool region_capturing() { return t_region_graph != nullptr; }

void region_begin() {
  TORCH_CHECK(!t_region_graph, "[tpu] a graph capture is already running on this thread");
  fused_flush("graph_capture");
  fused::Graph& g = fused::graph(current_device());
  fused::GraphLock lock(g);
  TORCH_CHECK(!g.region, "[tpu] another thread captures a graph on tpu:", g.device);
  t_region_seen = new fused::RegionStorages();
  g.region = t_region_seen;
  t_region_graph = &g;
  t_begin = Counters::now();
}

void region_abort() {
  if (!t_region_graph) return;
  fused::Graph& g = *t_region_graph;
  fused::GraphLock lock(g);
  leave_region(g);
  t_begin.reset();
  fused::flush_locked(g, "graph_capture");
}

int64_t region_end(at::TensorList outs) {
  TORCH_CHECK(t_region_graph, "[tpu] no graph capture is running on this thread");
  fused::Graph& g = *t_region_graph;
  fused::GraphLock lock(g);
  std::unique_ptr<fused::RegionStorages> seen = leave_region(g);
  const Counters before = *std::exchange(t_begin, std::nullopt);
  std::string why = Counters::now().spoiled_since(before, g);
  fused::FlushCapture cap;
  flush_reporting(g, why.empty() ? &cap : nullptr, "graph_capture");
  std::shared_ptr<Region> r;
  if (why.empty()) {
    try {
      r = build_region(cap, *seen, outs, g.device);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  TORCH_CHECK(r, "[tpu] torch.tpu.graph: the captured region cannot be replayed: ", why,
              ". The region's work ran once, as recorded. Warm up before capturing (the "
              "first steps compile and create optimizer state), keep host reads and "
              "CPU work outside the region, and use capturable=True optimizers.");
  std::lock_guard<std::mutex> l(g_mu);
  g_regions.emplace(++g_next, std::move(r));
  return g_next;
}

std::vector<at::Tensor> region_replay(int64_t handle) {
  std::shared_ptr<const Region> r;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = g_regions.find(handle);
    TORCH_CHECK(it != g_regions.end(), "[tpu] no captured graph ", handle);
    r = it->second;
  }
  TORCH_CHECK(!t_region_graph, "[tpu] TPUGraph.replay() inside a graph capture");
  // Work recorded before the replay comes before it.
  fused_flush_device(r->device, "graph_replay");
  const size_t n = r->in_storage.size();
  std::vector<pjrt::BufferPtr> inputs(n);
  for (size_t i = 0; i < n; ++i) {
    if (r->in_rng[i] >= 0) {
      inputs[i] = rng_input(r->device, r->in_rng[i]);
      continue;
    }
    if (!r->in_storage[i]) {
      inputs[i] = r->in_const[i];
      continue;
    }
    DeviceStorage& st = device_storage(r->in_storage[i]);
    if (st.error) TORCH_CHECK(false, *st.error);
    const Region::Layout& want = r->in_layout[i];
    TORCH_CHECK(st.buffer && st.buffer->dtype() == want.dtype && st.buffer->numel() == want.numel &&
                    st.nbytes == want.nbytes,
                "[tpu] TPUGraph.replay(): a tensor the graph reads changed its storage's "
                "size or dtype since the capture (",
                st.nbytes, " bytes of ", mlir_name(st.dtype), ", captured ", want.nbytes,
                " bytes of ", mlir_name(want.dtype), "); capture again");
    inputs[i] = st.buffer;
    // The program consumes a donated buffer: one that another storage shares
    // (a whole-tensor copy_ shares buffers) is copied for it.
    if (r->in_donated[i] && inputs[i].use_count() - inputs[i]->queued_uses() != 2)
      inputs[i] = buffer_copy(inputs[i], r->device);
  }
  std::vector<pjrt::BufferPtr> results = launch(*r->entry, inputs, r->device);
  inputs.clear();
  metrics().graph_replays++;
  std::vector<c10::Storage> fresh(results.size());
  for (size_t k = 0; k < results.size(); ++k) {
    if (r->res_returned[k]) {
      fresh[k] = fresh_storage(r->res_nbytes[k], std::move(results[k]), r->device);
      continue;
    }
    c10::intrusive_ptr<c10::StorageImpl> impl = r->out_storage[k].lock();
    if (!impl) continue;
    DeviceStorage& st = device_storage(c10::Storage(std::move(impl)));
    st.dtype = results[k]->dtype();
    st.buffer = std::move(results[k]);
  }
  std::vector<at::Tensor> outs;
  outs.reserve(r->outs.size());
  for (size_t i = 0; i < r->outs.size(); ++i) {
    const OutView& v = r->outs[i];
    outs.push_back(view_of(v.fresh ? fresh[v.index] : r->out_kept[i], v));
  }
  return outs;
}

void region_release(int64_t handle) {
  std::lock_guard<std::mutex> l(g_mu);
  g_regions.erase(handle);
}

namespace {

int64_t capture_end_op(at::TensorList args, at::TensorList outs) { return capture_end(args, outs); }
int64_t region_end_op(at::TensorList outs) { return region_end(outs); }
std::vector<at::Tensor> region_replay_op(int64_t handle) { return region_replay(handle); }
// (false, []) when the layout differs: a graph may have no tensor outputs.
std::tuple<bool, std::vector<at::Tensor>> replay_op(int64_t handle, at::TensorList args) {
  auto outs = replay_graph(handle, args);
  if (!outs) return {false, {}};
  return {true, std::move(*outs)};
}

}  // namespace

// Through the dispatcher, so Python hands tensors without torch's Python API.
TORCH_LIBRARY_FRAGMENT(torchtpu, m) {
  m.def("_graph_capture_end(Tensor[] args, Tensor[] outs) -> int", TORCH_FN(capture_end_op));
  m.def("_graph_replay(int handle, Tensor[] args) -> (bool, Tensor[])", TORCH_FN(replay_op));
  m.def("_region_end(Tensor[] outs) -> int", TORCH_FN(region_end_op));
  m.def("_region_replay(int handle) -> Tensor[]", TORCH_FN(region_replay_op));
}

}  // namespace torchtpu::aten
