// Fused Eager: a per-process graph of recorded op calls, run as one program.
//
// Recording computes output metadata (PyTorch's meta kernel, cached per op
// signature) and creates output tensors whose storages are "pending". The
// graph's cache key grows with every call (the call's structural key plus the
// graph-wide numbers of its storages), so a graph seen before is found without
// building StableHLO. Storages are numbered by first use; their buffers at
// first use are captured as inputs. At a cut the live pending storages become
// the program's outputs, and inputs that only those storages hold are donated.
#include "aten/fused.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "aten/executor.h"
#include "aten/generator.h"
#include "aten/program.h"
#include "lower/types.h"

namespace torchtpu::aten {

using hlo::Type;
using hlo::Value;
using lower::to_dtype;

namespace {

template <typename T>
void put(std::string& k, const T& v) {
  k.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

// A feature that is on unless `name` is "0".
bool env_default_on(const char* name) {
  const char* v = std::getenv(name);
  return !v || std::string(v) != "0";
}

bool debug_fusion() {
  static bool on = env_flag("TORCHTPU_DEBUG_FUSION");
  return on;
}

// TORCHTPU_FUSED_DONATE=0 turns donation off (to compare memory and speed).
bool donation() {
  static bool on = env_default_on("TORCHTPU_FUSED_DONATE");
  return on;
}

size_t max_ops() {
  static size_t n = [] {
    const char* v = std::getenv("TORCHTPU_FUSED_MAX_OPS");
    return v ? std::max<size_t>(1, std::atoll(v)) : size_t{8192};
  }();
  return n;
}

// How a recorded call's tensor argument is kept without keeping its storage alive.
struct TensorDesc {
  enum Kind : uint8_t { Undefined, Host, Device } kind;
  int slot = -1;
  c10::ScalarType dtype = c10::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
};

// Per op signature: outputs and random-number use, known without lowering.
struct Template {
  CallOutputs outs;
  int64_t rng_numel = -1;
  // Storages the call writes (by the call's storage numbering) and their dtype
  // afterwards: aliased returns, Tensor(a!) arguments, and writes the schema
  // does not declare (native_batch_norm's running stats).
  std::vector<std::pair<int, DType>> writes;
};

struct Node {
  c10::OperatorHandle op;
  const OpInfo* info;
  torch::jit::Stack args;         // device tensors replaced by undefined placeholders
  std::vector<TensorDesc> descs;  // every tensor position, in traversal order
  std::shared_ptr<const Template> tmpl;
  std::vector<int> out_slots;  // per output: graph slot of a fresh tensor, or -1
  std::vector<int> writes;     // graph slots written in place
  std::vector<std::tuple<int, int, pjrt::BufferPtr>> host;      // (argument, element, upload)
  std::vector<std::tuple<int, int, c10::Scalar>> host_scalars;  // 0-dim host tensors' values
  uint64_t rng[2] = {0, 0};
  const std::string* where = nullptr;
};

struct GraphSlot {
  DeviceStorage* st;  // null once the storage died
  pjrt::BufferPtr captured;
  SlotState state;
};

struct FusedEntry {
  pjrt::ExecutablePtr exe;
  std::vector<InputSource> inputs;
  std::vector<ScalarSource> scalars;
  std::vector<std::pair<DType, int>> packs;
};

// Loop detection: a period of the op stream and the call pair that starts an
// iteration; once known, the graph is cut before that pair's second call.
struct Loop {
  bool active = false;
  size_t period = 0;
  uint64_t prev = 0, first = 0;
  size_t since = 0;  // graph size when found (0 after each cut)
};

struct Graph {
  std::recursive_mutex mu;
  std::vector<Node> nodes;
  std::vector<GraphSlot> slots;
  std::unordered_map<const DeviceStorage*, int> slot_of;
  std::string key;
  int device = 0;
  std::vector<uint64_t> hist;    // per node: hash of its call key
  std::vector<int64_t> live_at;  // per node: live pending storages before it
  int64_t live_pending = 0;
  Loop loop;
  uint64_t prefix = 0;                      // hash of the calls recorded so far
  std::vector<uint64_t> prefix_at;          // per node: `prefix` before it
  std::unordered_set<uint64_t> read_ahead;  // learned cut points (cut_point)
  bool ahead = false;  // the last cut was a read-ahead cut; the read is still to come
  std::unordered_map<std::string, std::shared_ptr<const Template>> templates;
  std::unordered_map<std::string, std::shared_ptr<FusedEntry>> programs;
  std::map<std::string, int64_t> cuts;
};

// Leaked: storages may die after static destructors run.
Graph& graph() {
  static auto* g = new Graph();
  return *g;
}
std::atomic<bool> g_nonempty{false};
const std::string* (*g_location)() = nullptr;
thread_local const char* t_reason = nullptr;

bool is_tensor_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  auto t = v.toList().elementType();
  if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
  return t->kind() == c10::TypeKind::TensorType;
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
    d.slot = slot_for(g, &device_storage(t.storage()));
    d.dtype = t.scalar_type();
    d.sizes = t.sizes().vec();
    d.strides = t.strides().vec();
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

// The inverse of strip for lowering: placeholders become meta tensors with
// the recorded geometry, mapped to their graph slots.
c10::IValue rebuild(const Node& node, const c10::IValue& v, size_t& pos,
                    std::unordered_map<const c10::TensorImpl*, int>& slots) {
  auto one = [&](const at::Tensor& t) -> at::Tensor {
    const TensorDesc& d = node.descs.at(pos++);
    if (d.kind != TensorDesc::Device) return t;
    // A meta base large enough for the view (as_strided checks bounds).
    int64_t extent = d.offset + 1;
    bool empty = std::find(d.sizes.begin(), d.sizes.end(), 0) != d.sizes.end();
    for (size_t i = 0; i < d.sizes.size() && !empty; ++i) extent += (d.sizes[i] - 1) * d.strides[i];
    at::Tensor m = at::empty({extent}, c10::TensorOptions().dtype(d.dtype).device(c10::kMeta))
                       .as_strided(d.sizes, d.strides, d.offset);
    slots[m.unsafeGetTensorImpl()] = d.slot;
    return m;
  };
  if (v.isTensor()) return one(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> l;
    for (const at::Tensor& t : v.toTensorList()) l.push_back(one(t));
    return l;
  }
  if (is_tensor_list(v)) {
    auto src = v.toList();
    c10::impl::GenericList l(src.elementType());
    for (const c10::IValue& e : src) l.push_back(e.isTensor() ? c10::IValue(one(e.toTensor())) : e);
    return l;
  }
  return v;
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

// Z-function of the reversed history: the shortest period p such that the
// last half of the graph repeats with period p, and the number of live
// pending values repeats with it (up to a small drift per period: a loop may
// keep each step's loss). The second test rejects repeated layers inside one
// step: each layer leaves several more (forward) or fewer (backward) saved
// values alive.
size_t find_period(const std::vector<uint64_t>& h, const std::vector<int64_t>& live) {
  const size_t n = h.size();
  std::vector<uint64_t> r(h.rbegin(), h.rend());
  std::vector<size_t> z(n, 0);
  for (size_t i = 1, l = 0, rr = 0; i < n; ++i) {
    if (i < rr) z[i] = std::min(rr - i, z[i - l]);
    while (i + z[i] < n && r[z[i]] == r[i + z[i]]) ++z[i];
    if (i + z[i] > rr) l = i, rr = i + z[i];
  }
  constexpr size_t kMinPeriod = 8;
  for (size_t p = kMinPeriod; 2 * p <= n; ++p) {
    if (z[p] < p || z[p] + p < n / 2) continue;
    const int64_t drift = live[n - 1] - live[n - 1 - p];
    bool steady = drift >= -2 && drift <= 2;
    for (size_t i = n - p; i < n && steady; ++i) steady = live[i] - live[i - p] == drift;
    if (steady) return p;
  }
  return 0;
}

void detect_loop(Graph& g) {
  size_t p = find_period(g.hist, g.live_at);
  if (!p) return;
  const size_t n = g.hist.size();
  // Cut where the fewest pending values are alive (between iterations), at a
  // call pair that occurs once per period.
  size_t best = 0;
  for (size_t j = n - p + 1; j < n; ++j) {
    int same = 0;
    for (size_t i = n - p + 1; i < n; ++i)
      same += g.hist[i] == g.hist[j] && g.hist[i - 1] == g.hist[j - 1];
    if (same != 1) continue;
    if (!best || g.live_at[j] < g.live_at[best]) best = j;
  }
  if (!best) return;
  g.loop = {true, p, g.hist[best - 1], g.hist[best], n};
  g.cuts["loop_detected"]++;
  if (debug_fusion())
    std::fprintf(stderr, "[tpu fused] loop of %zu ops detected after %zu ops; cut before %s\n", p,
                 n, g.nodes[best].info->name.c_str());
}

void clear(Graph& g) {
  for (GraphSlot& s : g.slots)
    if (s.st) s.st->pending = false;
  g.nodes.clear();
  g.slots.clear();
  g.slot_of.clear();
  g.key.clear();
  g.hist.clear();
  g.live_at.clear();
  g.prefix = 0;
  g.prefix_at.clear();
  g.live_pending = 0;
  g.loop.since = 0;
  g_nonempty = false;
}

std::string node_name(const Node& n) {
  std::string s = "aten::" + n.info->name;
  if (n.where) s += " (recorded at " + *n.where + ")";
  return s;
}

// Lowers the calls `order` (graph node indices, in recording order) into one
// program returning the slots `outs`. Program inputs name calls by their
// position in `order`, so the entry serves any graph with the same key.
std::shared_ptr<FusedEntry> build(Graph& g, const std::vector<int>& order,
                                  const std::vector<int>& outs, size_t& failed_node) {
  auto e = std::make_shared<FusedEntry>();
  Program p;
  for (const GraphSlot& s : g.slots) p.add_slot(s.state);
  for (size_t i = 0; i < order.size(); ++i) {
    failed_node = order[i];
    const Node& node = g.nodes[order[i]];
    std::unordered_map<const c10::TensorImpl*, int> impl_slot;
    torch::jit::Stack args;
    size_t pos = 0;
    for (const c10::IValue& v : node.args) args.push_back(rebuild(node, v, pos, impl_slot));
    SlotOf slot_of = [&](const at::Tensor& t) {
      auto it = impl_slot.find(t.unsafeGetTensorImpl());
      return it == impl_slot.end() ? -1 : it->second;
    };
    int64_t rng = -1;
    std::vector<Value> vals =
        lower_call(p, static_cast<int>(i), *node.info, args, 0, slot_of, node.tmpl->outs, &rng);
    for (size_t k = 0; k < vals.size(); ++k)
      if (node.out_slots[k] >= 0)
        p.current[node.out_slots[k]] = p.b.reshape(vals[k], {node.tmpl->outs.types[k].numel()});
  }
  failed_node = g.nodes.size();
  std::vector<Value> results;
  for (int o : outs) {
    const GraphSlot& s = g.slots[o];
    DType d = s.st ? s.st->dtype : s.state.dtype;
    results.push_back(p.current[o].valid() ? p.current[o] : p.storage(o, d));
  }
  p.b.ret(results);
  e->inputs = std::move(p.inputs);
  e->scalars = std::move(p.scalars);
  e->packs = p.b.packs();
  std::string text = p.b.module();
  if (const char* dir = std::getenv("TORCHTPU_DUMP_FUSED")) {
    static int count = 0;
    std::string path = std::string(dir) + "/fused_" + std::to_string(count++) + ".mlir";
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
  }
  e->exe = compile_cached(text);
  return e;
}

// TORCHTPU_FUSED_SPLIT=0: a read runs the whole graph as one program.
bool split_reads() {
  static bool on = env_default_on("TORCHTPU_FUSED_SPLIT");
  return on;
}

// TORCHTPU_FUSED_READ_AHEAD=0: no read-ahead cuts.
bool read_ahead() {
  static bool on = env_default_on("TORCHTPU_FUSED_READ_AHEAD");
  return on;
}

// A cut point: the number of calls recorded and the hash of those calls.
uint64_t cut_point(uint64_t prefix, size_t nodes) {
  return prefix ^ (0x9e3779b97f4a7c15ULL * (nodes + 1));
}

// Slots a call reads (its device tensor arguments) and writes (in place or fresh).
template <typename F>
void for_reads(const Node& n, F f) {
  for (const TensorDesc& d : n.descs)
    if (d.kind == TensorDesc::Device) f(d.slot);
}
template <typename F>
void for_writes(const Node& n, F f) {
  for (int s : n.writes) f(s);
  for (int s : n.out_slots)
    if (s >= 0) f(s);
}

// Splits the graph for a read of `target`: `first` holds the calls the value
// needs, closed so that running them before the others changes no value (a
// call that reads or writes a slot a later `first` call writes is taken too);
// `rest` holds the others. Both keep recording order.
void partition(const Graph& g, int target, std::vector<int>& first, std::vector<int>& rest) {
  std::vector<char> need(g.slots.size(), 0), written_later(g.slots.size(), 0),
      take(g.nodes.size(), 0);
  need[target] = 1;
  for (size_t i = g.nodes.size(); i-- > 0;) {
    const Node& n = g.nodes[i];
    bool t = false;
    for_writes(n, [&](int s) { t = t || need[s] || written_later[s]; });
    for_reads(n, [&](int s) { t = t || written_later[s]; });
    if (!t) continue;
    take[i] = 1;
    for_reads(n, [&](int s) { need[s] = 1; });
    for (int s : n.writes) written_later[s] = 1;
  }
  for (size_t i = 0; i < g.nodes.size(); ++i)
    (take[i] ? first : rest).push_back(static_cast<int>(i));
}

// Runs the calls `order` as one program (cached under `key`, which the output
// list and donations extend) and returns its result buffers, one per `outs`.
std::vector<pjrt::BufferPtr> run_part(Graph& g, const std::vector<int>& order,
                                      const std::vector<int>& outs, std::string key, bool& hit,
                                      size_t& failed) {
  key.push_back('|');
  for (int o : outs) {
    GraphSlot& s = g.slots[o];
    s.state.donate = donation() && s.st && s.captured && s.captured.use_count() == 2 &&
                     s.st->buffer == s.captured;
    put(key, static_cast<int32_t>(o));
    put(key, s.state.donate);
  }
  std::shared_ptr<FusedEntry> entry;
  if (auto it = g.programs.find(key); it != g.programs.end()) {
    entry = it->second;
    hit = true;
    metrics().fused_cache_hits++;
  } else {
    entry = build(g, order, outs, failed);
    if (g.programs.size() >= std::min<size_t>(512, program_table_limit())) g.programs.clear();
    g.programs.emplace(std::move(key), entry);
  }
  std::vector<pjrt::BufferPtr> owned;
  owned.reserve(entry->inputs.size());
  for (const InputSource& in : entry->inputs) {
    const Node& node = g.nodes[order[in.node]];
    switch (in.kind) {
      case InputSource::Storage:
        owned.push_back(g.slots[in.index].captured);
        if (g.slots[in.index].state.donate)
          metrics().donated_bytes += static_cast<int64_t>(owned.back()->nbytes());
        break;
      case InputSource::Host:
        for (const auto& [a, sub, buf] : node.host)
          if (a == in.index && sub == in.sub) owned.push_back(buf);
        break;
      case InputSource::Rng: {
        int64_t dims[1] = {2};
        owned.push_back(client().buffer_from_host(node.rng, DType::U64, dims, g.device));
        break;
      }
    }
  }
  auto of = [&](const ScalarSource& s) -> c10::Scalar {
    const Node& node = g.nodes[order[s.node]];
    for (const auto& [a, sub, v] : node.host_scalars)
      if (a == s.index && sub == s.sub) return v;
    return scalar_of(node.args[s.index], s.sub);
  };
  for (pjrt::BufferPtr& b : scalar_packs(entry->scalars, entry->packs, of, g.device))
    owned.push_back(std::move(b));
  std::vector<pjrt::Buffer*> raw(owned.size());
  for (size_t i = 0; i < owned.size(); ++i) raw[i] = owned[i].get();
  std::vector<pjrt::BufferPtr> results = entry->exe->execute(raw, g.device);
  metrics().executions++;
  metrics().fused_graphs++;
  metrics().fused_outputs += static_cast<int64_t>(results.size());
  if (!results.empty()) track_inflight(results.back());
  return results;
}

// Slots the calls `order` write whose values are needed after them: those a
// tensor can still reach, and (`also`) those other calls go on to use.
std::vector<int> outputs_of(const Graph& g, const std::vector<int>& order,
                            const std::vector<char>* also = nullptr) {
  std::vector<char> w(g.slots.size(), 0);
  for (int i : order) for_writes(g.nodes[i], [&](int s) { w[s] = 1; });
  std::vector<int> outs;
  for (size_t s = 0; s < w.size(); ++s)
    if (w[s] && (g.slots[s].st || (also && (*also)[s]))) outs.push_back(static_cast<int>(s));
  return outs;
}

// Runs the graph. With `target` (a slot the host reads), the calls that value
// needs run first as their own program, and the others after it as a second
// program: the host waits only for the first while the second runs, so a
// training loop's `loss.item()` does not wait for backward and optimizer.
void flush_locked(Graph& g, const char* reason, int target = -1) {
  if (g.nodes.empty()) {
    clear(g);
    return;
  }
  auto t0 = std::chrono::steady_clock::now();
  g.cuts[reason]++;
  g.ahead = false;
  const size_t n_nodes = g.nodes.size();
  std::vector<int> first, rest;
  if (target >= 0 && split_reads()) partition(g, target, first, rest);
  // A second program costs a launch and extra outputs. It pays when the host
  // has many calls to record while the rest runs (an MLP step, 29 of 36 calls
  // in the rest, was slower split; a GPT step, 82 of 151, faster), or when the
  // first part is the graph's first calls, which read-ahead then runs while
  // the host records the others (the MLP step is faster split that way).
  constexpr size_t kMinRest = 64, kMinRestAhead = 16;
  const bool prefix = !first.empty() && static_cast<size_t>(first.back()) == first.size() - 1;
  if (rest.size() < (read_ahead() && prefix ? kMinRestAhead : kMinRest)) {
    first.resize(n_nodes);
    std::iota(first.begin(), first.end(), 0);
    rest.clear();
  }
  bool hit_first = false, hit_rest = false;
  size_t failed = n_nodes, n_outs = 0;
  // Assigns a part's results: values a later part writes (`rewritten`) stay pending.
  auto assign = [&](const std::vector<int>& outs, std::vector<pjrt::BufferPtr>& results,
                    const std::vector<char>* rewritten) {
    for (size_t k = 0; k < results.size(); ++k) {
      GraphSlot& s = g.slots[outs[k]];
      s.captured = results[k];
      s.state = SlotState{true, results[k]->dtype(), s.state.nbytes};
      if (!s.st) continue;
      s.st->dtype = results[k]->dtype();
      s.st->buffer = std::move(results[k]);
      if (!rewritten || !(*rewritten)[outs[k]]) s.st->pending = false;
    }
  };
  try {
    // What the rest uses of the first part's values (nothing without a rest).
    std::vector<char> used_by_rest(g.slots.size(), 0), written_by_rest(g.slots.size(), 0);
    for (int i : rest) {
      for_reads(g.nodes[i], [&](int s) { used_by_rest[s] = 1; });
      for_writes(g.nodes[i], [&](int s) { used_by_rest[s] = written_by_rest[s] = 1; });
    }
    std::string key = std::move(g.key);
    std::string key_first = rest.empty() ? std::move(key) : key + "|needed:";
    if (!rest.empty()) put(key_first, static_cast<int32_t>(target));
    std::vector<int> outs = outputs_of(g, first, &used_by_rest);
    auto results = run_part(g, first, outs, std::move(key_first), hit_first, failed);
    assign(outs, results, &written_by_rest);
    n_outs = outs.size();
    if (!rest.empty()) {
      g.cuts[std::string(reason) + "+rest"]++;
      outs = outputs_of(g, rest);
      n_outs += outs.size();
      put(key, static_cast<int32_t>(target));
      results = run_part(g, rest, outs, key + "|rest", hit_rest, failed);
      assign(outs, results, nullptr);
      // A read that needed exactly the graph's first calls: when those calls
      // are recorded again, they run at once while the host records the others
      // (a training step's forward runs while its backward is recorded).
      if (read_ahead() && prefix) {
        if (g.read_ahead.size() >= 4096) g.read_ahead.clear();
        g.read_ahead.insert(cut_point(g.prefix_at[first.size()], first.size()));
      }
    }
  } catch (const std::exception& ex) {
    std::string msg = std::string("[tpu] a fused graph of ") + std::to_string(n_nodes) +
                      " ops (cut by " + reason + ") failed";
    if (failed < n_nodes) msg += " while lowering " + node_name(g.nodes[failed]);
    msg += ": ";
    msg += ex.what();
    if (!debug_fusion()) msg += " (TORCHTPU_DEBUG_FUSION=1 records the Python line of each op)";
    auto err = std::make_shared<const std::string>(msg);
    for (GraphSlot& s : g.slots)
      if (s.st && s.st->pending) s.st->error = err;
    clear(g);
    TORCH_CHECK(false, msg);
  }
  if (debug_fusion()) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const Node &a = g.nodes.front(), &z = g.nodes.back();
    auto hit = [](bool h) { return h ? "cache-hit" : "compiled"; };
    std::string how = hit(hit_first);
    if (!rest.empty())
      how = std::to_string(first.size()) + " needed ops " + hit(hit_first) + ", then " +
            std::to_string(rest.size()) + " ops " + hit(hit_rest);
    std::fprintf(stderr, "[tpu fused] cut=%s ops=%zu outputs=%zu %s %.3f s; %s .. %s\n", reason,
                 n_nodes, n_outs, how.c_str(), secs, node_name(a).c_str(), node_name(z).c_str());
  }
  clear(g);
}

}  // namespace

// The outermost reason wins: nonzero's count is read through item().
SyncReason::SyncReason(const char* why) : prev_(t_reason) {
  if (!t_reason) t_reason = why;
}
SyncReason::~SyncReason() { t_reason = prev_; }
const char* SyncReason::current(const char* fallback) { return t_reason ? t_reason : fallback; }

void set_location_hook(const std::string* (*hook)()) { g_location = hook; }

void fused_record(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack) {
  CallKey call = key_call(op, info, *stack);
  const size_t n = call.n, first = call.first;
  const std::vector<DeviceStorage*>& storages = call.storages;
  const std::string& key = call.key;

  Graph& g = graph();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  const int device = storages.empty() ? current_device() : storages[0]->device;
  if (!g.nodes.empty() && device != g.device) flush_locked(g, "device_switch");

  std::shared_ptr<const Template> tmpl;
  if (auto it = g.templates.find(key); it != g.templates.end()) {
    tmpl = it->second;
  } else {
    // out= tensors of the wrong size are resized first (then the key changes).
    if (info.is_out && resize_outs(op, info, *stack, first, n, key))
      return fused_record(op, info, stack);
    tmpl = make_template(op, info, *stack, first, n, storages);
    g.templates.emplace(key, tmpl);
  }

  const uint64_t h = std::hash<std::string>{}(key);
  if (!g.nodes.empty()) {
    if (g.loop.active && h == g.loop.first && g.hist.back() == g.loop.prev)
      flush_locked(g, "loop_boundary");
    else if (!g.read_ahead.empty() && g.read_ahead.count(cut_point(g.prefix, g.nodes.size()))) {
      flush_locked(g, "read_ahead");
      g.ahead = true;
    } else if (g.nodes.size() >= max_ops())
      flush_locked(g, "size_cap");
  }
  g.device = device;

  Node node{op, &info};
  node.tmpl = tmpl;
  g.key += key;
  uint64_t prefix = g.prefix * 0x100000001b3ULL ^ h;
  for (DeviceStorage* st : storages) {
    const int slot = slot_for(g, st);
    put(g.key, static_cast<int32_t>(slot));
    prefix = prefix * 31 + slot;
  }
  node.args.reserve(n);
  for (size_t i = 0; i < n; ++i)
    node.args.push_back(strip(g, node, static_cast<int>(i), (*stack)[first + i]));
  if (tmpl->rng_numel >= 0)
    philox_take(find_generator(*stack, first, n), device, tmpl->rng_numel, node.rng);
  if (debug_fusion() && g_location) node.where = g_location();
  g.hist.push_back(h);
  g.live_at.push_back(g.live_pending);
  g.prefix_at.push_back(std::exchange(g.prefix, prefix));

  for (auto [slot, dtype] : tmpl->writes)
    node.writes.push_back(mark_written(g, storages[slot], dtype));
  // Fresh outputs: real tensors whose storages wait for the graph.
  const CallOutputs& co = tmpl->outs;
  std::vector<at::Tensor> fresh;
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
      at::Tensor out =
          at::empty(t.shape, c10::TensorOptions()
                                 .dtype(lower::to_scalar_type(t.dtype))
                                 .device(c10::Device(c10::DeviceType::PrivateUse1,
                                                     static_cast<c10::DeviceIndex>(device))));
      DeviceStorage* st = &device_storage(out.storage());
      st->dtype = t.dtype;
      st->pending = true;
      g.live_pending++;
      g.slots.push_back({st, nullptr, SlotState{false, t.dtype, st->nbytes, true}});
      node.out_slots[k] = static_cast<int>(g.slots.size()) - 1;
      g.slot_of.emplace(st, node.out_slots[k]);
      fresh.push_back(std::move(out));
    }
  }
  g.nodes.push_back(std::move(node));
  g_nonempty = true;
  metrics().fused_ops++;

  // A loop whose boundary stopped coming has ended (or was never one).
  if (g.loop.active && g.nodes.size() > g.loop.since + 2 * g.loop.period) g.loop.active = false;
  if (!g.loop.active && g.nodes.size() % 64 == 0) detect_loop(g);
  push_returns(info, co.ret_lists, fresh, *stack, first);
}

void fused_flush(const char* reason) {
  if (!g_nonempty) return;
  Graph& g = graph();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  flush_locked(g, reason);
}

void fused_sync(const DeviceStorage& st, const char* reason, bool write) {
  if (st.error) TORCH_CHECK(false, *st.error);
  if (!g_nonempty) return;
  Graph& g = graph();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  if (!write && !st.pending) {
    // The value was computed ahead of its read; the read still ends the graph,
    // as it would have without the read-ahead cut, so the graphs keep their shape.
    if (g.ahead) flush_locked(g, SyncReason::current(reason));
    return;
  }
  auto it = g.slot_of.find(&st);
  if (it != g.slot_of.end())
    flush_locked(g, SyncReason::current(reason), write || !st.pending ? -1 : it->second);
  if (st.error) TORCH_CHECK(false, *st.error);
}

bool fused_holds(const DeviceStorage& st) {
  if (!g_nonempty) return false;
  Graph& g = graph();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  return g.slot_of.count(&st) > 0;
}

void fused_storage_freed(DeviceStorage* st) {
  if (!g_nonempty) return;
  Graph& g = graph();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  auto it = g.slot_of.find(st);
  if (it == g.slot_of.end()) return;
  g.slots[it->second].st = nullptr;
  if (st->pending) g.live_pending--;
  g.slot_of.erase(it);
}

std::vector<std::pair<std::string, int64_t>> fused_cut_report() {
  Graph& g = graph();
  std::lock_guard<std::recursive_mutex> lock(g.mu);
  return {g.cuts.begin(), g.cuts.end()};
}

}  // namespace torchtpu::aten
