// Fused Eager's recorder: each call becomes a node of the process's graph,
// with output metadata computed at once (PyTorch's meta kernel, cached per op
// signature) and output tensors whose storages are "pending". The graph's
// key grows with every call (the call's structural key plus the graph-wide
// numbers of its storages), so a graph seen before is found without building
// StableHLO. Storages are numbered by first use; their buffers at first use
// are captured as inputs.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "aten/bucketed.h"
#include "aten/events.h"
#include "aten/fused.h"
#include "aten/fused_graph.h"
#include "aten/generator.h"
#include "aten/host_ops.h"
#include "aten/strict.h"
#include "lower/types.h"

namespace torchtpu::aten {

using hlo::Type;
using namespace fused;

namespace {

const std::string* (*g_location)() = nullptr;
void (*g_wait)(c10::function_ref<void()>) = nullptr;

size_t max_ops() {
  static size_t n = [] {
    const char* v = std::getenv("TORCHTPU_FUSED_MAX_OPS");
    return v ? std::max<size_t>(1, std::atoll(v)) : size_t{8192};
  }();
  return n;
}

int slot_for(Graph& g, DeviceStorage* st) {
  auto it = g.slot_of.find(st);
  if (it != g.slot_of.end()) return it->second;
  if (st->error) TORCH_CHECK(false, *st->error);
  TORCH_INTERNAL_ASSERT(!st->pending, "[tpu] pending storage outside the fused graph");
  g.slots.push_back({st, st->buffer, SlotState{st->has_value(), st->dtype, st->nbytes}});
  int s = static_cast<int>(g.slots.size()) - 1;
  g.slot_of.emplace(st, s);
  return s;
}

// Copies one argument for the node, replacing device tensors by placeholders
// described in `descs`; host tensors are uploaded (0-dim ones read) now, as the
// caller may reuse them.
c10::IValue strip(Graph& g, Node& node, int arg, const c10::IValue& v) {
  auto one = [&](const at::Tensor& t, int sub) -> at::Tensor {
    TensorDesc d;
    if (!t.defined()) {
      d.kind = TensorDesc::Undefined;
      node.descs.push_back(std::move(d));
      return t;
    }
    if (!t.device().is_privateuseone()) {
      d.kind = TensorDesc::Host;
      node.descs.push_back(std::move(d));
      if (t.dim() == 0)
        node.host_scalars.emplace_back(arg, sub, t.item());
      else
        node.host.emplace_back(arg, sub, host_input(t, -1, g.device));
      return t;
    }
    d.kind = TensorDesc::Device;
    DeviceStorage* st = &device_storage(t.storage());
    d.slot = slot_for(g, st);
    if (g.region) g.region->insert_or_assign(st, t.storage().getWeakStorageImpl());
    d.dtype = t.scalar_type();
    d.sizes.assign(t.sizes().begin(), t.sizes().end());
    d.strides.assign(t.strides().begin(), t.strides().end());
    d.offset = t.storage_offset();
    node.descs.push_back(std::move(d));
    return at::Tensor();
  };
  if (v.isTensor()) return one(v.toTensor(), -1);
  if (v.isTensorList()) {
    auto src = v.toTensorList();
    c10::List<at::Tensor> l;
    for (size_t j = 0; j < src.size(); ++j) l.push_back(one(src[j], static_cast<int>(j)));
    return l;
  }
  if (is_tensor_list(v)) {
    auto src = v.toList();
    c10::impl::GenericList l(src.elementType());
    for (size_t j = 0; j < src.size(); ++j) {
      c10::IValue e = src.get(j);
      l.push_back(e.isTensor() ? c10::IValue(one(e.toTensor(), static_cast<int>(j))) : e);
    }
    return l;
  }
  return v;
}

// Tensor positions among a call's arguments (the descs strip makes).
size_t tensor_positions(const torch::jit::Stack& stack, size_t first, size_t n) {
  size_t k = 0;
  for (size_t i = first; i < first + n; ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor())
      ++k;
    else if (v.isTensorList() || is_tensor_list(v))
      k += v.toListRef().size();
  }
  return k;
}

// Returns the storage's graph slot.
int mark_written(Graph& g, DeviceStorage* st, DType dtype) {
  const int slot = slot_for(g, st);
  st->dtype = dtype;
  if (!st->pending) {
    st->pending = true;
    g.live_pending++;
  }
  return slot;
}

std::shared_ptr<const Template> make_template(const c10::OperatorHandle& op, const OpInfo& info,
                                              const torch::jit::Stack& args, size_t first, size_t n,
                                              std::vector<DeviceStorage*> storages) {
  auto t = std::make_shared<Template>();
  t->outs = call_outputs(op, info, args, first, n);
  // Lowering once now reports rule errors at the call and finds the random
  // stream's size; the program itself is built at the cut.
  Program p;
  for (DeviceStorage* st : storages) p.add_slot({st->has_value(), st->dtype, st->nbytes});
  SlotOf slot_of = [&](const at::Tensor& x) -> int {
    if (!x.device().is_privateuseone()) return -1;
    auto* st = &device_storage(x.storage());
    return static_cast<int>(std::find(storages.begin(), storages.end(), st) - storages.begin());
  };
  lower_call(p, 0, info, args, first, slot_of, t->outs, &t->rng_numel);
  for (int slot : p.written) t->writes.emplace_back(slot, p.current[slot].dtype());
  return t;
}

// Templates by call key, shared by every device's graph.
std::mutex g_templates_mu;
std::unordered_map<std::string, std::shared_ptr<const Template>> g_templates;

std::shared_ptr<const Template> find_template(const std::string& key) {
  std::lock_guard<std::mutex> lock(g_templates_mu);
  auto it = g_templates.find(key);
  return it == g_templates.end() ? nullptr : it->second;
}

void add_template(const std::string& key, std::shared_ptr<const Template> t) {
  std::lock_guard<std::mutex> lock(g_templates_mu);
  g_templates.emplace(key, std::move(t));
}

std::atomic<bool> g_spmd{[] {
  const char* v = std::getenv("TORCHTPU_SPMD");
  return v && *v && std::string(v) != "0";
}()};

}  // namespace

bool spmd_mode() { return g_spmd; }
void set_spmd_mode(bool on) { g_spmd = on; }

void set_location_hook(const std::string* (*hook)()) { g_location = hook; }
const std::string* caller_location() { return g_location ? g_location() : nullptr; }
void set_wait_hook(void (*hook)(c10::function_ref<void()>)) { g_wait = hook; }
void run_without_gil(c10::function_ref<void()> wait) {
  if (g_wait)
    g_wait(wait);
  else
    wait();
}

// The replica group tag of a torchtpu::spmd_collective call, else -1.
static int64_t spmd_group_of(const c10::OperatorHandle& op, const torch::jit::Stack& stack,
                             size_t first) {
  return is_spmd_op(op) ? stack[first + 5].toInt() : -1;
}

namespace {
thread_local Graph* t_held = nullptr;

// A dead storage is no slot of the graph any more (caller holds g.mu).
void forget(Graph& g, DeviceStorage* st) {
  auto it = g.slot_of.find(st);
  if (it == g.slot_of.end()) return;
  g.slots[it->second].st = nullptr;
  if (st->pending) g.live_pending--;
  g.slot_of.erase(it);
}

void forget_freed(Graph& g) {
  std::vector<DeviceStorage*> freed;
  {
    std::lock_guard<std::mutex> lock(g.freed_mu);
    freed.swap(g.freed_later);
  }
  for (DeviceStorage* st : freed) {
    forget(g, st);
    free_storage(st);
  }
}
}  // namespace

fused::GraphLock::GraphLock(Graph& g) : lock_(g.mu, std::try_to_lock) {
  if (!lock_.owns_lock()) {
    RankWait note(g);
    run_without_gil([this] { lock_.lock(); });
  }
  if (!t_held) {
    t_held = &g;
    outermost_ = true;
    forget_freed(g);
  }
}

fused::GraphLock::~GraphLock() {
  if (outermost_) t_held = nullptr;
}

void fused_record(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack) {
  CallKey call = key_call(op, info, *stack);
  const size_t n = call.n, first = call.first;
  const std::vector<DeviceStorage*>& storages = call.storages;
  const std::string& key = call.key;
  // Values whose sizes came from tensor values run op by op (host_ops.h),
  // after everything recorded before them.
  const int device = storages.empty() ? current_device() : storages[0]->device;
  if (value_sized_call(storages)) {
    // Inside nonzero & co. the cut is the data-dependent read's own.
    fused_flush_device(device, in_value_sized_scope() ? "data_dependent" : "value_sized");
    return strict_run(op, info, stack);
  }
  // A value another device's graph still owes (a copy across devices) is
  // computed first; before this graph's lock, so two graphs never wait on
  // each other.
  for (const DeviceStorage* st : storages)
    if (st->pending && st->device != device) fused_sync(*st, "device_switch");

  Graph& g = graph(device);
  GraphLock lock(g);
  // One program runs one group's SPMD collectives.
  const int64_t spmd = spmd_group_of(op, *stack, first);
  if (spmd >= 0 && g.spmd_group >= 0 && spmd != g.spmd_group) flush_locked(g, "spmd_group");

  std::shared_ptr<const Template> tmpl = find_template(key);
  if (!tmpl) {
    // out= tensors of the wrong size are resized first (then the key changes).
    if (info.is_out && resize_outs(op, info, *stack, first, n, key))
      return fused_record(op, info, stack);
    // A collective runs on the devices, at its own sizes.
    // Nor do calls of SPMD ranks: those heuristics count calls process-wide,
    // so ranks would decide differently and their programs differ.
    const bool same_on_ranks = spmd >= 0 || (spmd_mode() && rank_device(device));
    const NewShape ns =
        same_on_ranks ? NewShape::Compile : new_shape(info, *stack, first, n, storages, key);
    if (ns == NewShape::Host) return run_on_host(op, info, stack, first, n, storages);
    // Sizes that keep changing run op by op after a cut, bucketed; the graphs
    // around them keep their keys. Strict runs the call instead when it has an
    // exact program for it, or raises the error of a graph the cut ran.
    bool cut = false;
    auto cut_here = [&] {
      flush_locked(g, "bucketed");
      cut = true;
      return find_program(key) == nullptr &&
             std::none_of(storages.begin(), storages.end(),
                          [](const DeviceStorage* st) { return st->error != nullptr; });
    };
    if (!same_on_ranks && run_bucketed(op, info, stack, call, cut_here)) return;
    if (cut) return strict_run(op, info, stack);
    if (ns == NewShape::BucketedElseHost) return run_on_host(op, info, stack, first, n, storages);
    tmpl = make_template(op, info, *stack, first, n, storages);
    add_template(key, tmpl);
  }

  const uint64_t h = std::hash<std::string>{}(key);
  // A compiled graph or a capture region is one program: its own boundaries are the cuts.
  const bool compiled = in_compiled_graph() || g.region;
  if (!g.nodes.empty()) {
    if (!compiled && g.loop.cut_before(h)) {
      flush_locked(g, "loop_boundary");
    } else if (!compiled && !g.read_ahead.empty() &&
               g.read_ahead.cut_here(g.prefix, g.nodes.size())) {
      flush_locked(g, "read_ahead");
      g.ahead = true;
    } else if (g.nodes.size() >= max_ops() && !g.region) {  // a capture region is one program
      flush_locked(g, "size_cap");
    }
  }
  if (spmd >= 0) g.spmd_group = spmd;

  Node node{op, &info};
  node.tmpl = tmpl;
  if (g.key.empty()) g.key.push_back('F');  // the program table's key of a fused graph
  g.key += key;
  c10::SmallVector<int, 8> slots;
  for (DeviceStorage* st : storages) {
    slots.push_back(slot_for(g, st));
    put(g.key, static_cast<int32_t>(slots.back()));
  }
  const uint64_t prefix = graph::extend_prefix(g.prefix, h, slots);
  node.args.reserve(n);
  node.descs.reserve(tensor_positions(*stack, first, n));
  for (size_t i = 0; i < n; ++i)
    node.args.push_back(strip(g, node, static_cast<int>(i), (*stack)[first + i]));
  if (tmpl->rng_numel >= 0)
    philox_take(find_generator(*stack, first, n), device, tmpl->rng_numel, node.rng);
  if (debug_fusion() && g_location) node.where = g_location();
  const int64_t live_before = g.live_pending;
  g.prefix_at.push_back(std::exchange(g.prefix, prefix));

  for (auto [slot, dtype] : tmpl->writes)
    node.writes.push_back(mark_written(g, storages[slot], dtype));
  // Fresh outputs: real tensors whose storages wait for the graph.
  const CallOutputs& co = tmpl->outs;
  c10::SmallVector<at::Tensor, 4> fresh;
  node.out_slots.assign(co.types.size(), -1);
  size_t k = 0;
  for (size_t r = 0; r < co.ret_lists.size(); ++r) {
    int cnt = co.ret_lists[r] < 0 ? 1 : co.ret_lists[r];
    bool alias = r < info.ret_alias_arg.size() && info.ret_alias_arg[r] >= 0;
    for (int j = 0; j < cnt; ++j, ++k) {
      if (alias) continue;
      if (co.undefined[k]) {
        fresh.emplace_back();
        continue;
      }
      const Type& t = co.types[k];
      at::Tensor out = empty_on_device(t.shape, lower::to_scalar_type(t.dtype), device);
      DeviceStorage* st = &device_storage(out.storage());
      st->dtype = t.dtype;
      st->pending = true;
      g.live_pending++;
      g.slots.push_back({st, nullptr, SlotState{false, t.dtype, st->nbytes, true}});
      node.out_slots[k] = static_cast<int>(g.slots.size()) - 1;
      g.slot_of.emplace(st, node.out_slots[k]);
      if (g.region) g.region->insert_or_assign(st, out.storage().getWeakStorageImpl());
      fresh.push_back(std::move(out));
    }
  }
  g.nodes.push_back(std::move(node));
  if (!g.counted) {
    g.counted = true;
    g_nonempty++;
  }
  metrics().fused_ops++;
  thread_work().fused_ops++;

  if (auto cut = g.loop.recorded(h, live_before)) {
    count_cut("loop_detected");
    if (debug_fusion())
      std::fprintf(stderr, "[tpu fused] loop of %zu ops detected after %zu ops; cut before %s\n",
                   cut->period, g.nodes.size(), g.nodes[cut->at].info->name.c_str());
  }
  push_returns(info, co.ret_lists, fresh, *stack, first);
}

namespace {
thread_local bool t_compiled_graph = false;
}
void set_compiled_graph(bool on) { t_compiled_graph = on; }
bool in_compiled_graph() { return t_compiled_graph; }

bool fused_holds(const DeviceStorage& st) {
  if (!g_nonempty) return false;
  Graph& g = graph(st.device);
  GraphLock lock(g);
  return g.slot_of.count(&st) > 0;
}

namespace {

// A storage died, so its pending value is no program output. The free never
// waits for the graph's lock: it may come from a thread holding another
// graph's lock or a rendezvous lock that the graph's holder waits for (a
// garbage collection, a collective's round freeing another rank's tensor).
// When the lock is busy, the graph's next locker forgets and frees it.
bool storage_freed(DeviceStorage* st) {
  if (!g_nonempty) return false;
  Graph& g = graph(st->device);
  std::unique_lock<std::recursive_mutex> lock(g.mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    std::lock_guard<std::mutex> later(g.freed_mu);
    g.freed_later.push_back(st);
    return true;
  }
  forget(g, st);
  return false;
}

// Fused Eager's part in the runtime's events.
struct Subscriptions {
  Subscriptions() {
    subscribe(Event::ModeLeft, &fused_flush);
    subscribe(Event::SyncRequested, &fused_flush);
    subscribe_storage_freed(&storage_freed);
  }
} subscriptions;

}  // namespace

}  // namespace torchtpu::aten
