// Fused Eager's runner: at a cut, the live pending storages become the
// program's outputs (temporaries are never materialized), inputs that only
// those storages hold are donated, and the graph runs as one program, or two
// when a host read needs only part of it (graph::partition). Programs are
// found in, or added to, the launcher's table under the graph's key.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string_view>

#include "aten/events.h"
#include "aten/fused.h"
#include "aten/fused_graph.h"
#include "aten/launch.h"

namespace torchtpu::aten {

using hlo::Value;
using namespace fused;

namespace fused {

bool debug_fusion() {
  static bool on = [] {
    const char* v = std::getenv("TORCHTPU_DEBUG_FUSION");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

namespace {
constexpr int kMaxGraphs = 256;
std::array<std::atomic<Graph*>, kMaxGraphs> g_graphs{};
std::mutex g_graphs_mu;
// Per device: thread ranks recording there (set_rank_device).
std::array<std::atomic<int>, kMaxGraphs> g_rank_devices{};
// Per device: 1 + the device whose graph lock its rank thread waits for, or 0.
std::array<std::atomic<int>, kMaxGraphs> g_rank_waits{};
thread_local int t_rank_device = -1;  // this thread is the rank recording there
}  // namespace

Graph& graph(int device) {
  TORCH_CHECK(device >= 0 && device < kMaxGraphs, "[tpu] device index ", device,
              " out of range for Fused Eager (at most ", kMaxGraphs, " devices)");
  if (Graph* g = g_graphs[device].load(std::memory_order_acquire)) return *g;
  std::lock_guard<std::mutex> lock(g_graphs_mu);
  Graph* g = g_graphs[device].load(std::memory_order_acquire);
  if (!g) {
    g = new Graph();
    g->device = device;
    g_graphs[device].store(g, std::memory_order_release);
  }
  return *g;
}

std::vector<Graph*> graphs() {
  std::vector<Graph*> all;
  for (auto& g : g_graphs)
    if (Graph* p = g.load(std::memory_order_acquire)) all.push_back(p);
  return all;
}

std::atomic<int> g_nonempty{0};

void clear(Graph& g) {
  for (GraphSlot& s : g.slots)
    if (s.st) s.st->pending = false;
  g.nodes.clear();
  g.slots.clear();
  g.slot_of.clear();
  g.key.clear();
  g.loop.reset_after_cut();
  g.prefix = 0;
  g.prefix_at.clear();
  g.live_pending = 0;
  g.spmd_group = -1;
  if (g.counted) {
    g.counted = false;
    g_nonempty--;
  }
}

std::string node_name(const Node& n) {
  std::string s = "aten::" + n.info->name;
  if (n.where) s += " (recorded at " + *n.where + ")";
  return s;
}

}  // namespace fused

namespace {

// TORCHTPU_FUSED_DONATE=0 turns donation off (to compare memory and speed).
bool donation() {
  static bool on = env_default_on("TORCHTPU_FUSED_DONATE");
  return on;
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

// Lowers the calls `order` (graph node indices, in recording order) into one
// program returning the slots `outs`. Program inputs name calls by their
// position in `order`, so the entry serves any graph with the same key.
std::shared_ptr<ProgramEntry> build(Graph& g, const std::vector<int>& order,
                                    const std::vector<int>& outs, size_t& failed_node) {
  auto e = std::make_shared<ProgramEntry>();
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
  p.finish(results, *e, CodegenParts::Xla, "TORCHTPU_DUMP_FUSED");
  return e;
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

// A graph's program inputs come from its captured buffers and its nodes.
class GraphFeed final : public InputFeed {
 public:
  GraphFeed(Graph& g, const std::vector<int>& order) : g_(g), order_(order) {}
  pjrt::BufferPtr storage(int slot) override {
    const GraphSlot& s = g_.slots[slot];
    if (s.state.donate) metrics().donated_bytes += static_cast<int64_t>(s.captured->nbytes());
    return s.captured;
  }
  pjrt::BufferPtr host(const InputSource& in) override {
    for (const auto& [a, sub, buf] : node(in.node).host)
      if (a == in.index && sub == in.sub) return buf;
    TORCH_INTERNAL_ASSERT(false, "[tpu] a fused host input was not uploaded");
  }
  void rng(const InputSource& in, uint64_t state[2]) override {
    state[0] = node(in.node).rng[0];
    state[1] = node(in.node).rng[1];
  }
  c10::Scalar scalar(const ScalarSource& s) override {
    const Node& n = node(s.node);
    for (const auto& [a, sub, v] : n.host_scalars)
      if (a == s.index && sub == s.sub) return v;
    return scalar_of(n.args[s.index], s.sub);
  }

 private:
  const Node& node(int i) const { return g_.nodes[order_[i]]; }
  Graph& g_;
  const std::vector<int>& order_;
};

std::vector<pjrt::BufferPtr> run_chunked(Graph& g, const std::vector<int>& order,
                                         const std::vector<int>& outs, const std::string& key,
                                         size_t& failed);

// "3 ops holding all_reduce(sum) Float[24], all_gather BFloat16[8]": what the
// ranks compare of a program with SPMD collectives.
std::string describe_spmd(const Graph& g, const std::vector<int>& order) {
  std::string s = std::to_string(order.size()) + (order.size() == 1 ? " op" : " ops");
  const char* sep = " holding ";
  for (int i : order) {
    const Node& n = g.nodes[i];
    if (!is_spmd_op(n.op)) continue;
    const std::string& reduce = n.args[2].toStringRef();
    const TensorDesc& d = n.descs.at(0);
    s += sep + n.args[1].toStringRef() + (reduce.empty() ? "" : "(" + reduce + ")") + " " +
         c10::toString(d.dtype) + c10::str(c10::IntArrayRef(d.sizes));
    if (n.where) s += " at " + *n.where;
    sep = ", ";
  }
  return s;
}

// Runs the calls `order` as one program (cached under `key` + `suffix`, which
// the output list and donations extend) and returns its result buffers, one
// per `outs`. `chunk`: a piece of a graph the ranks disagreed on (run_chunked).
std::vector<pjrt::BufferPtr> run_part(Graph& g, const std::vector<int>& order,
                                      const std::vector<int>& outs, const std::string& key,
                                      std::string_view suffix, bool& hit, size_t& failed,
                                      bool chunk = false) {
  // A step's key is kilobytes long: the lookup key is built in a string that
  // keeps its capacity, and copied only for a new program.
  thread_local std::string lookup;
  lookup.assign(key).append(suffix).push_back('|');
  for (int o : outs) {
    GraphSlot& s = g.slots[o];
    // Not with SPMD collectives: every rank must build the same program, and
    // a rank's references to a buffer are its own.
    s.state.donate = donation() && g.spmd_group < 0 && s.st && s.captured &&
                     s.captured.use_count() - s.captured->queued_uses() == 2 &&
                     s.st->buffer == s.captured;
    put(lookup, static_cast<int32_t>(o));
    put(lookup, s.state.donate);
  }
  auto entry = std::static_pointer_cast<const ProgramEntry>(find_program(lookup));
  if (entry) {
    hit = true;
    metrics().fused_cache_hits++;
  } else {
    TraceScope trace("torchtpu::compile fused_graph", static_cast<int64_t>(order.size()));
    std::string new_key = lookup;  // `lookup` is the thread's: kept before anything else runs
    auto made = build(g, order, outs, failed);
    made->replica_single = order.size() == 1 && is_spmd_op(g.nodes[order[0]].op);
    made->what = "fused graph of " + std::to_string(order.size()) +
                 " ops: aten::" + g.nodes[order.front()].info->name +
                 " .. aten::" + g.nodes[order.back()].info->name;
    count_program(made->what);
    add_program(std::move(new_key), made);
    entry = std::move(made);
  }
  GraphFeed feed(g, order);
  TraceScope trace("torchtpu::execute fused_graph", static_cast<int64_t>(order.size()));
  std::vector<pjrt::BufferPtr> inputs = gather_inputs(*entry, feed, g.device);
  if (FlushCapture* c = g.capture) {
    c->parts++;
    c->replicated = c->replicated || entry->replica_group >= 0;
    c->entry = entry;
    c->inputs = inputs;
    c->in_storage.assign(inputs.size(), nullptr);
    c->donated.assign(inputs.size(), 0);
    c->rng_numel.assign(inputs.size(), -1);
    c->rng_generator.assign(inputs.size(), 0);
    for (size_t i = 0; i < entry->inputs.size(); ++i) {
      const InputSource& in = entry->inputs[i];
      if (in.kind == InputSource::Storage) {
        c->in_storage[i] = g.slots[in.index].st;
        c->donated[i] = g.slots[in.index].state.donate;
      } else if (in.kind == InputSource::Rng) {
        const Node& n = g.nodes[order[in.node]];
        c->rng_numel[i] = n.tmpl->rng_numel;
        c->rng_generator[i] = find_generator(n.args, 0, n.args.size()).has_value();
      }
    }
    c->out_storage.clear();
    c->out_fresh.clear();
    for (int o : outs) {
      c->out_storage.push_back(g.slots[o].st);
      // Made by the graph: a call's fresh output, or an out= tensor's storage
      // allocated empty on the way.
      c->out_fresh.push_back(g.slots[o].state.produced || !g.slots[o].state.has_value);
    }
  }
  std::vector<pjrt::BufferPtr> results;
  for (;;) {
    try {
      results = launch(*entry, inputs, g.device, [&] { return describe_spmd(g, order); });
      break;
    } catch (const ProgramsDiffer&) {
      if (!chunk) return run_chunked(g, order, outs, key + std::string(suffix), failed);
      // A rank still brought a whole graph: it runs it in pieces too, so this
      // piece meets it again.
      if (!entry->replica_single) throw;
    }
  }
  metrics().fused_graphs++;
  metrics().fused_outputs += static_cast<int64_t>(results.size());
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

// The ranks' programs for `order` differ (a rank recorded calls of its own
// between collectives): the calls run in pieces, each SPMD collective a
// program of its own, so the ranks meet on the collectives alone. A piece's
// results become the slots' values the later pieces read.
std::vector<pjrt::BufferPtr> run_chunked(Graph& g, const std::vector<int>& order,
                                         const std::vector<int>& outs, const std::string& key,
                                         size_t& failed) {
  count_cut("spmd_programs_differ");
  std::vector<std::vector<int>> chunks;
  for (int i : order) {
    const bool coll = is_spmd_op(g.nodes[i].op);
    if (coll || chunks.empty() || is_spmd_op(g.nodes[chunks.back().back()].op))
      chunks.emplace_back();
    chunks.back().push_back(i);
  }
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::vector<char> later(g.slots.size(), 0);
    for (int o : outs) later[o] = 1;
    for (size_t d = c + 1; d < chunks.size(); ++d)
      for (int i : chunks[d]) for_reads(g.nodes[i], [&](int s) { later[s] = 1; });
    const std::vector<int> piece_outs = outputs_of(g, chunks[c], &later);
    std::string piece = "|piece";
    put(piece, static_cast<int32_t>(chunks[c].front()));
    put(piece, static_cast<int32_t>(chunks[c].back()));
    bool hit = false;
    auto results = run_part(g, chunks[c], piece_outs, key, piece, hit, failed, /*chunk=*/true);
    for (size_t k = 0; k < results.size(); ++k) {
      GraphSlot& s = g.slots[piece_outs[k]];
      s.state = SlotState{true, results[k]->dtype(), s.state.nbytes};
      s.captured = std::move(results[k]);
    }
  }
  std::vector<pjrt::BufferPtr> results;
  for (int o : outs) results.push_back(g.slots[o].captured);
  return results;
}

}  // namespace

namespace fused {

// Runs the graph. With `target` (a slot the host reads), the calls that value
// needs run first as their own program, and the others after it as a second
// program: the host waits only for the first while the second runs, so a
// training loop's `loss.item()` does not wait for backward and optimizer.
void flush_locked(Graph& g, const char* reason, int target) {
  if (g.nodes.empty()) {
    clear(g);
    return;
  }
  TraceScope trace([&] { return std::string("torchtpu::fused_flush ") + reason; },
                   static_cast<int64_t>(g.nodes.size()));
  auto t0 = std::chrono::steady_clock::now();
  count_cut(reason);
  g.ahead = false;
  const size_t n_nodes = g.nodes.size();
  std::vector<int> first, rest;
  if (target >= 0 && split_reads()) {
    std::vector<graph::CallSlots> calls(n_nodes);
    for (size_t i = 0; i < n_nodes; ++i) {
      for_reads(g.nodes[i], [&](int s) { calls[i].reads.push_back(s); });
      for_writes(g.nodes[i], [&](int s) { calls[i].writes.push_back(s); });
    }
    graph::partition(calls, g.slots.size(), target, first, rest);
  }
  // Where the next graph with these calls is cut to run ahead (0: nowhere).
  const size_t ahead_at = read_ahead() ? graph::read_ahead_point(first, n_nodes) : 0;
  if (!graph::split_pays(first, rest.size(), read_ahead())) {
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
    // g.key stays the graph's (clear() keeps its capacity for the next graph).
    std::string suffix;
    if (!rest.empty()) {
      suffix = "|needed:";
      put(suffix, static_cast<int32_t>(target));
    }
    std::vector<int> outs = outputs_of(g, first, &used_by_rest);
    auto results = run_part(g, first, outs, g.key, suffix, hit_first, failed);
    assign(outs, results, &written_by_rest);
    n_outs = outs.size();
    if (!rest.empty()) {
      count_cut(std::string(reason) + "+rest");
      outs = outputs_of(g, rest);
      n_outs += outs.size();
      suffix.clear();
      put(suffix, static_cast<int32_t>(target));
      suffix += "|rest";
      results = run_part(g, rest, outs, g.key, suffix, hit_rest, failed);
      assign(outs, results, nullptr);
    }
    // When the calls up to the last one this read needed are recorded again, they
    // run at once while the host records the others (a training step's forward
    // runs while its backward is recorded), whether or not this flush split.
    if (ahead_at) g.read_ahead.learn(g.prefix_at[ahead_at], ahead_at);
  } catch (const std::exception& ex) {
    std::string msg = std::string("[tpu] a fused graph of ") + std::to_string(n_nodes) +
                      " ops (cut by " + reason + ") failed";
    if (failed < n_nodes) msg += " while lowering " + node_name(g.nodes[failed]);
    msg += ": ";
    const auto* c10_error = dynamic_cast<const c10::Error*>(&ex);
    msg += c10_error ? c10_error->what_without_backtrace() : ex.what();
    if (!debug_fusion()) msg += " (TORCHTPU_DEBUG_FUSION=1 records the Python line of each op)";
    auto err = std::make_shared<const std::string>(msg);
    for (GraphSlot& s : g.slots)
      if (s.st && s.st->pending) s.st->error = err;
    clear(g);
    // A collective's failure stays one, as torch's own backends raise it.
    if (dynamic_cast<const c10::DistBackendError*>(&ex)) C10_THROW_ERROR(DistBackendError, msg);
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

}  // namespace fused

void fused_flush(const char* reason) {
  if (!g_nonempty) return;
  const int here = current_device();
  for (Graph* g : graphs()) {
    // Another thread rank's graph: it cuts where its own rank's code does, so
    // every rank of an SPMD program cuts at the same calls.
    if (g->device != here && rank_device(g->device)) continue;
    GraphLock lock(*g);
    flush_locked(*g, reason);
  }
}

void fused_flush_device(int device, const char* reason) {
  if (!g_nonempty) return;
  Graph& g = graph(device);
  GraphLock lock(g);
  flush_locked(g, reason);
}

void set_rank_device(int device, bool on) {
  if (device < 0 || device >= kMaxGraphs) return;
  g_rank_devices[device] += on ? 1 : -1;
  if (on)
    t_rank_device = device;  // the backend is made on its rank's thread
  else if (t_rank_device == device)
    t_rank_device = -1;
}

fused::RankWait::RankWait(const Graph& g) : device_(t_rank_device) {
  if (device_ >= 0) g_rank_waits[device_] = g.device + 1;
}
fused::RankWait::~RankWait() {
  if (device_ >= 0) g_rank_waits[device_] = 0;
}

std::string rank_wait(int device) {
  if (device < 0 || device >= kMaxGraphs || g_rank_waits[device] == 0) return "";
  return "its thread waits for the lock of tpu:" + std::to_string(g_rank_waits[device] - 1) +
         "'s Fused graph (held by a thread that runs or records it)";
}

bool rank_device(int device) {
  return device >= 0 && device < kMaxGraphs && g_rank_devices[device] > 0;
}

void fused_sync(const DeviceStorage& st, const char* reason, bool write) {
  if (st.error) TORCH_CHECK(false, *st.error);
  if (!g_nonempty) return;
  Graph& g = graph(st.device);
  GraphLock lock(g);
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

namespace {
std::mutex g_cuts_mu;
std::map<std::string, int64_t> g_cuts;
}  // namespace

void fused::count_cut(const std::string& reason) {
  std::lock_guard<std::mutex> lock(g_cuts_mu);
  g_cuts[reason]++;
}

std::vector<std::pair<std::string, int64_t>> fused_cut_report() {
  std::lock_guard<std::mutex> lock(g_cuts_mu);
  return {g_cuts.begin(), g_cuts.end()};
}

}  // namespace torchtpu::aten
