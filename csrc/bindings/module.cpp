// The Python module torchtpu._C: the only file with Python headers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <unordered_map>

#include "aten/async_runs.h"
#include "aten/dispatch.h"
#include "aten/fused.h"
#include "aten/generator.h"
#include "aten/host_ops.h"
#include "aten/launch.h"
#include "aten/op_info.h"
#include "aten/ops.h"
#include "aten/replay.h"
#include "aten/runtime.h"
#include "cache/compile_cache.h"
#include "dist/backend.h"
#include "dist/kv_store.h"
#include "dist/local.h"
#include "lower/external.h"
#include "lower/registry.h"

namespace py = pybind11;
// c10d's Store and Backend are held by intrusive_ptr in torch's bindings.
PYBIND11_DECLARE_HOLDER_TYPE(T, c10::intrusive_ptr<T>, true);
using namespace torchtpu::aten;
namespace hlo = torchtpu::hlo;
using torchtpu::DType;

namespace {

py::dict metrics_dict() {
  {
    // Counts of queued runs and compiles in progress land first.
    py::gil_scoped_release release;
    async_runs::wait_idle();
  }
  auto& m = metrics();
  py::dict d;
  d["ops"] = m.ops.load();
  d["executions"] = m.executions.load();
  d["compiles"] = m.compiles.load();
  d["cache_hits"] = m.cache_hits.load();
  d["fallbacks"] = m.fallbacks.load();
  d["host_syncs"] = m.host_syncs.load();
  d["bytes_to_device"] = m.bytes_to_device.load();
  d["bytes_to_host"] = m.bytes_to_host.load();
  d["compile_seconds"] = static_cast<double>(m.compile_ns.load()) * 1e-9;
  d["fused_ops"] = m.fused_ops.load();
  d["fused_graphs"] = m.fused_graphs.load();
  d["fused_cache_hits"] = m.fused_cache_hits.load();
  d["donated_bytes"] = m.donated_bytes.load();
  d["fused_outputs"] = m.fused_outputs.load();
  d["compiled_graphs"] = m.compiled_graphs.load();
  d["graph_replays"] = m.graph_replays.load();
  d["meta_calls"] = m.meta_calls.load();
  d["quick_compiles"] = m.quick_compiles.load();
  d["tier_ups"] = m.tier_ups.load();
  d["tier_up_compiles"] = m.tier_up_compiles.load();
  d["tier_up_seconds"] = static_cast<double>(m.tier_up_ns.load()) * 1e-9;
  d["bucketed_calls"] = m.bucketed_calls.load();
  d["inflight_waits"] = m.inflight_waits.load();
  py::dict cuts;
  for (auto& [reason, count] : fused_cut_report()) cuts[py::str(reason)] = count;
  d["fused_cuts"] = cuts;
  py::dict fb;
  for (auto& [name, count] : fallback_report()) fb[py::str(name)] = count;
  d["fallback_ops"] = fb;
  py::dict programs;
  for (auto& [what, count] : program_report()) programs[py::str(what)] = count;
  d["programs_by_op"] = programs;
  py::dict host_ops;
  for (auto& [name, count] : host_op_report()) host_ops[py::str(name)] = count;
  d["host_ops"] = host_ops;
  py::dict coll;
  for (auto& k : torchtpu::dist::collective_report()) {
    py::dict e;
    e["calls"] = k.calls;
    e["bytes"] = k.bytes;
    e["host_copy_bytes"] = k.host_copy_bytes;
    e["seconds"] = k.seconds;
    coll[py::str(k.kind)] = e;
  }
  d["collectives"] = coll;
  return d;
}

// Process counters of the compile cache plus the local directory's contents.
py::dict cache_stats_dict() {
  namespace tc = torchtpu::cache;
  tc::Stats s = tc::process_stats();
  tc::Config c = tc::process_config();
  tc::Usage u = c.local_dir.empty() ? tc::Usage{} : tc::DiskStore(c.local_dir).usage();
  py::dict d;
  d["requests"] = s.requests;
  d["memory_hits"] = s.memory_hits;
  d["disk_hits"] = s.disk_hits;
  d["shared_hits"] = s.shared_hits;
  d["pack_hits"] = s.pack_hits;
  d["pack_entries"] = s.pack_entries;
  d["pack_refused"] = s.pack_refused;
  d["misses"] = s.misses;
  d["errors"] = s.errors;
  d["evictions"] = s.evictions;
  d["unloaded"] = s.unloaded;
  d["compile_seconds"] = s.compile_seconds;
  d["compile_seconds_saved"] = s.saved_seconds;
  d["load_seconds"] = s.load_seconds;
  d["entries"] = u.entries;
  d["bytes"] = u.bytes;
  d["dir"] = c.local_dir;
  d["shared_dir"] = c.shared_dir;
  d["packs"] = c.packs;
  d["max_bytes"] = c.max_bytes;
  return d;
}

// Where Python called the current op: the innermost frame outside torch's
// own modules, as "file:line"; interned so recorded ops keep a pointer.
const std::string* python_location() {
  if (!Py_IsInitialized()) return nullptr;
  py::gil_scoped_acquire gil;
  static std::unordered_map<std::string, std::unique_ptr<std::string>> interned;
  PyFrameObject* f = PyEval_GetFrame();
  Py_XINCREF(f);
  std::string where;
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);
    std::string file = py::reinterpret_borrow<py::str>(code->co_filename);
    int line = PyFrame_GetLineNumber(f);
    Py_DECREF(code);
    if (where.empty() || file.find("/torch/") == std::string::npos) {
      where = file + ":" + std::to_string(line);
      if (file.find("/torch/") == std::string::npos) {
        Py_DECREF(f);
        break;
      }
    }
    PyFrameObject* back = PyFrame_GetBack(f);
    Py_DECREF(f);
    f = back;
  }
  if (where.empty()) return nullptr;
  auto& slot = interned[where];
  if (!slot) slot = std::make_unique<std::string>(where);
  return slot.get();
}

// (element type as MLIR spells it, shape) pairs from Python, as hlo types.
std::vector<hlo::Type> mlir_types(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& specs) {
  std::vector<hlo::Type> out;
  for (const auto& [name, shape] : specs) {
    std::optional<DType> d;
    for (int k = 0; k <= static_cast<int>(DType::C128); ++k)
      if (torchtpu::mlir_name(static_cast<DType>(k)) == name) d = static_cast<DType>(k);
    if (!d) throw py::type_error("no device dtype for element type " + name);
    out.push_back(hlo::Type{*d, shape});
  }
  return out;
}

// torch.cuda.memory_stats' keys for what this allocator really tracks: the "all"
// pool of each statistic and the event counters.
py::dict memory_stats_dict(int device) {
  c10::CachingDeviceAllocator::DeviceStats st = memory_stats(device);
  py::dict d;
  auto put = [&](const char* name, const c10::CachingAllocator::StatArray& a) {
    const auto& s = a[0];
    const std::string base = std::string(name) + ".all.";
    d[py::str(base + "current")] = s.current;
    d[py::str(base + "peak")] = s.peak;
    d[py::str(base + "allocated")] = s.allocated;
    d[py::str(base + "freed")] = s.freed;
  };
  put("allocation", st.allocation);
  put("segment", st.segment);
  put("active", st.active);
  put("allocated_bytes", st.allocated_bytes);
  put("reserved_bytes", st.reserved_bytes);
  put("active_bytes", st.active_bytes);
  put("requested_bytes", st.requested_bytes);
  d["num_alloc_retries"] = st.num_alloc_retries;
  d["num_ooms"] = st.num_ooms;
  d["num_device_alloc"] = st.num_device_alloc;
  d["num_device_free"] = st.num_device_free;
  return d;
}

at::Generator gen(int device) { return default_generator(device < 0 ? current_device() : device); }

}  // namespace

// Waits for the Fused graph's lock without the GIL, if this thread holds it.
void wait_without_gil(c10::function_ref<void()> wait) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    py::gil_scoped_release no_gil;
    wait();
  } else {
    wait();
  }
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "TorchTPU native core";
  set_location_hook(&python_location);
  set_wait_hook(&wait_without_gil);
  register_foreach_kernels();
  // c10 errors become the matching Python exceptions, without C++ backtraces.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::DistError& e) {
      // torch.distributed's own classes (DistBackendError, ...): this translator
      // runs before torch's, for torch's c10d calls too.
      const char* name = dynamic_cast<const c10::DistBackendError*>(&e) ? "_DistBackendError"
                         : dynamic_cast<const c10::DistQueueEmptyError*>(&e)
                             ? "_DistQueueEmptyError"
                         : dynamic_cast<const c10::DistStoreError*>(&e)   ? "_DistStoreError"
                         : dynamic_cast<const c10::DistNetworkError*>(&e) ? "_DistNetworkError"
                                                                          : "_DistError";
      py::object type = py::module_::import("torch._C").attr(name);
      PyErr_SetString(type.ptr(), e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
  m.def(
      "_init", [] { client(); }, "Starts the PJRT client; raises if no plugin can load.");
  m.def("device_count", [] { return device_count(); });
  m.def("_runtime_started", [] { return runtime_started(); });
  m.def("_drain_autograd", [] {
    py::gil_scoped_release no_gil;  // the engine refuses callers holding the GIL
    try {
      drain_autograd_device_thread();
    } catch (const std::exception&) {
      // Exit-time cleanup only: a runtime that fails here exits as it would have.
    }
  });
  // Test hooks of the PJRT key-value store (the CPU plugin never calls it):
  // the store torchrun_client_kv builds for `platform`, driven through the C
  // callbacks a plugin receives.
  m.def(
      "_kv_callback_exchange",
      [](const std::string& platform, const std::string& put_key, const std::string& value,
         const std::string& get_key, int timeout_ms) {
        auto kv = torchtpu::dist::torchrun_client_kv(platform);
        TORCH_CHECK(kv, "[tpu] no key-value store for platform '", platform,
                    "' (not under torchrun, WORLD_SIZE 1, or TORCHTPU_KV_STORE=0)");
        py::dict d;
        d["node_id"] = kv->node_id;
        d["num_nodes"] = kv->num_nodes;
        d["where"] = kv->where;
        py::gil_scoped_release no_gil;
        try {
          torchtpu::pjrt::kv_callback_put(*kv->store, put_key, value);
          std::optional<std::string> early =
              torchtpu::pjrt::kv_callback_try_get(*kv->store, get_key);
          std::string got = torchtpu::pjrt::kv_callback_get(*kv->store, get_key, timeout_ms);
          py::gil_scoped_acquire gil;
          d["value"] = py::bytes(got);
          d["try_get_before"] = early ? py::object(py::bytes(*early)) : py::object(py::none());
        } catch (const torchtpu::pjrt::Error& e) {
          TORCH_CHECK(false, "[tpu] PJRT error ", e.code(), ": ", e.what());
        }
        return d;
      },
      py::arg("platform"), py::arg("put_key"), py::arg("value"), py::arg("get_key"),
      py::arg("timeout_ms"));
  m.def("_client_kv", []() -> py::object {
    auto kv = client_kv();
    if (!kv) return py::none();
    py::dict d;
    d["node_id"] = kv->node_id;
    d["num_nodes"] = kv->num_nodes;
    d["where"] = kv->where;
    return d;
  });
  m.def("_cuda_library_report", [] { return cuda_library_report(); });
  m.def("current_device", [] { return current_device(); });
  m.def("set_device", [](int i) { set_current_device(i); });
  m.def("synchronize", [] {
    py::gil_scoped_release release;
    note_host_sync();
    synchronize();
  });
  m.def("platform", [] {
    auto& c = client();
    py::dict d;
    d["name"] = c.platform_name();
    d["version"] = c.platform_version();
    d["plugin"] = c.plugin().path();
    for (auto& [k, v] : c.plugin().attributes()) d[py::str(k)] = v;
    return d;
  });
  m.def("set_mode", [](const std::string& s) {
    Mode m = parse_mode(s);
    py::gil_scoped_release release;  // leaving fused mode runs the graph
    set_mode(m);
  });
  m.def("push_thread_mode", [](const std::string& s) {
    Mode m = parse_mode(s);
    py::gil_scoped_release release;
    push_thread_mode(m);
  });
  m.def("pop_thread_mode", [] {
    py::gil_scoped_release release;
    pop_thread_mode();
  });
  m.def("get_global_mode", [] { return mode_name(global_mode()); });
  m.def("get_mode", [] { return mode_name(mode()); });
  m.def(
      "flush",
      [] {
        py::gil_scoped_release release;
        fused_flush("user");
      },
      "Fused Eager: runs the ops recorded so far.");
  m.def("flush_reason", [](const std::string& reason) {
    py::gil_scoped_release release;
    fused_flush(reason.c_str());
  });
  m.def(
      "_register_external",
      [](int64_t key, const std::string& name, const std::string& callee, const std::string& text,
         const std::vector<std::pair<std::string, std::vector<int64_t>>>& args,
         const std::vector<std::pair<std::string, std::vector<int64_t>>>& results) {
        torchtpu::lower::register_external(
            key, {name, callee, text, mlir_types(args), mlir_types(results)});
      },
      "Makes `text` (private functions, `callee` first) callable as torchtpu::jax_call(args, "
      "key).");
  m.def(
      "_set_source_translator",
      [](py::object fn) {
        // Leaked: compiles may run until the process ends.
        auto* held = new py::object(std::move(fn));
        torchtpu::cache::set_source_translator(
            [held](const std::string& text) -> std::optional<std::string> {
              if (!hlo::Builder::marks_external(text)) return std::nullopt;
              py::gil_scoped_acquire gil;
              try {
                return std::string(py::bytes((*held)(py::bytes(text))));
              } catch (py::error_already_set& e) {
                throw std::runtime_error(e.what());
              }
            });
      },
      "fn(text: bytes) -> bytes rewrites programs that inline external functions before they "
      "compile.");
  m.def(
      "lowered_ops", [] { return torchtpu::lower::registered_ops(); },
      "ATen ops (name.overload) with a lowering rule.");
  m.def("cpu_fallback_enabled", &cpu_fallback_enabled);
  m.def("count_fallback", &count_fallback);
  m.def("has_lowering", &has_lowering,
        "Whether 'aten::name.overload' runs through a rule (its own, or its in-place/out= "
        "twin's).");
  m.def(
      "lowering_of",
      [](const std::string& op) -> std::pair<std::string, int> {
        const std::string q = op.find("::") == std::string::npos ? "aten::" + op : op;
        const size_t dot = q.find('.', q.find("::"));
        const std::string overload = dot == std::string::npos ? "" : q.substr(dot + 1);
        auto h = c10::Dispatcher::singleton().findSchema({q.substr(0, dot), overload});
        if (!h) throw py::key_error("[tpu] lowering_of: no operator " + q);
        const OpInfo& info = op_info(*h);
        if (!info.rule)
          throw py::value_error("[tpu] lowering_of: " + q +
                                " has no lowering rule (its own or its in-place/out= twin's)");
        // A foreach op runs its element op's rule on each element.
        auto loc = torchtpu::lower::rule_location(info.foreach ? foreach_element_rule(*info.foreach)
                                                               : info.rule);
        if (!loc) throw py::value_error("[tpu] lowering_of: no location recorded for " + q);
        const size_t csrc = loc->first.rfind("csrc/");
        return {csrc == std::string::npos ? loc->first : loc->first.substr(csrc), loc->second};
      },
      "(path from the repo root, line) where the rule that 'aten::name.overload' runs "
      "through is registered; KeyError for no such op, ValueError for no rule.");
  m.def(
      "_dist_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         const c10::intrusive_ptr<c10d::Backend>& host, double timeout_s) {
        return torchtpu::dist::make_backend(store, rank, size, host,
                                            std::chrono::milliseconds(int64_t(timeout_s * 1000)));
      },
      py::call_guard<py::gil_scoped_release>(),
      "The tpu_dist c10d backend over `host` (a gloo backend of the same ranks).");
  m.def(
      "_dist_local_backend",
      [](const std::string& session, int rank, const std::vector<int>& devices, double timeout_s) {
        return torchtpu::dist::make_local_backend(
            session, rank, devices, std::chrono::milliseconds(int64_t(timeout_s * 1000)));
      },
      py::call_guard<py::gil_scoped_release>(),
      "The tpu_local c10d backend: rank `rank` of the thread ranks of this process on tpu "
      "`devices` (one per rank), meeting in the rendezvous named `session`.");
  m.def("_dist_local_left", &torchtpu::dist::local_rank_left,
        py::call_guard<py::gil_scoped_release>(),
        "Marks a tpu_local rank as gone (its thread raised): the other ranks fail at once.");
  m.def("_dist_spmd", &spmd_mode, "Whether SPMD mode is on (tpu_local).");
  m.def("_dist_set_spmd", &set_spmd_mode,
        "SPMD mode: Fused Eager graphs of thread ranks hold their collectives.");
  m.def("count_compiled_graph", [] { metrics().compiled_graphs++; });
  m.def(
      "set_compiled_graph",
      [](bool on) {
        bool was = in_compiled_graph();
        set_compiled_graph(on);
        return was;
      },
      "Marks this thread as recording a torch.compile graph (no loop or read-ahead cuts); "
      "returns the previous state.");
  m.def("graph_capture_begin", &capture_begin,
        "Starts capturing the compiled graph this thread records next (replay.h).");
  m.def("graph_release", &release_graph, "Frees a captured compiled graph.");
  m.def(
      "graph_capture_refusal", [] { return capture_refusal(); },
      "Why this thread's last capture returned no replay.");
  m.def("graph_capture_refuse", &refuse_capture,
        "Ends this thread's capture with no replay, for the reason given.");
  m.def("region_begin", &region_begin, py::call_guard<py::gil_scoped_release>(),
        "Starts a capture region on this thread (torch.tpu.graph; replay.h); "
        "torch.ops.torchtpu._region_end/_region_replay end and replay it.");
  m.def("region_abort", &region_abort, py::call_guard<py::gil_scoped_release>(),
        "Ends the capture region without capturing; runs what it recorded.");
  m.def("region_release", &region_release, "Frees a captured region.");
  m.def("region_capturing", &region_capturing, "Whether this thread captures a region.");
  m.def("metrics", &metrics_dict);
  m.def("cache_stats", &cache_stats_dict,
        "Compile cache counters of this process (requests, memory/disk/shared/pack hits, misses =\n"
        "compiles, errors ignored, evictions, executables unloaded, compile seconds spent and "
        "saved, load seconds,\n"
        "pack entries usable and refused) and the local cache directory's entries and bytes.");
  m.def("_cache_usage", [](const std::string& dir) {
    auto u = torchtpu::cache::DiskStore(dir).usage();
    return std::make_pair(u.entries, u.bytes);
  });
  m.def("_cache_evict", [](const std::string& dir, int64_t max_bytes) {
    return torchtpu::cache::DiskStore(dir).evict(max_bytes);
  });
  m.def("_cache_pack", [](const std::string& dir, const std::string& out) {
    auto s = torchtpu::cache::pack_directory(torchtpu::cache::DiskStore(dir), out);
    return py::make_tuple(s.entries, s.skipped, s.bytes);
  });
  // A pack's entries as (key hex, identity hex, bytes, compile seconds);
  // RuntimeError naming the file when it is damaged.
  m.def("_cache_pack_entries", [](const std::string& path) {
    namespace tc = torchtpu::cache;
    auto pack = tc::PackFile::open(path);
    py::list out;
    for (const auto& e : pack->entries()) {
      out.append(py::make_tuple(tc::to_hex(e.header.key), tc::to_hex(e.header.identity),
                                e.header.file_size()));
    }
    return out;
  });
  m.def("_cache_identity",
        [] { return torchtpu::cache::to_hex(torchtpu::cache::runtime_identity(client())); });
  m.def(
      "_async_wait",
      [] {
        py::gil_scoped_release release;
        async_runs::wait_idle();
      },
      "Waits until no compile runs and no launch is queued (at exit, before finalizing).");
  m.def(
      "_async_busy", [] { return async_runs::busy(); },
      "Whether launches are queued behind a compile (async compiles).");
  m.def(
      "_async_hold", [](bool on) { async_runs::hold(on); },
      "Tests: holds (or releases) the compile pool's start of new compiles.");
  m.def(
      "wait_tier_ups",
      [] {
        py::gil_scoped_release release;
        wait_tier_ups();
      },
      "Waits until the background compiles of optimized builds are done.");
  m.def("reset_metrics", [] {
    {
      py::gil_scoped_release release;
      async_runs::wait_idle();
    }
    auto& x = metrics();
    for (auto* c : {&x.ops,           &x.compiles,        &x.cache_hits,      &x.fallbacks,
                    &x.host_syncs,    &x.bytes_to_device, &x.bytes_to_host,   &x.executions,
                    &x.compile_ns,    &x.fused_ops,       &x.fused_graphs,    &x.fused_cache_hits,
                    &x.donated_bytes, &x.fused_outputs,   &x.compiled_graphs, &x.graph_replays,
                    &x.meta_calls,    &x.quick_compiles,  &x.tier_ups,        &x.tier_up_compiles,
                    &x.tier_up_ns,    &x.bucketed_calls,  &x.inflight_waits})
      *c = 0;
    reset_program_report();
    reset_host_op_report();
    torchtpu::dist::reset_collective_report();
  });
  m.def("memory_limit", [] { return memory_limit(); });
  // Device indices are checked: a bad one raises IndexError, as for torch.cuda.
  m.def("memory_allocated", [](int d) {
    check_device(d);
    return memory_stats(d).allocated_bytes[0].current;
  });
  m.def("max_memory_allocated", [](int d) {
    check_device(d);
    return memory_stats(d).allocated_bytes[0].peak;
  });
  m.def("reset_peak_memory_stats", [](int d) {
    check_device(d);
    reset_peak_memory(d);
  });
  m.def("reset_accumulated_memory_stats", [](int d) {
    check_device(d);
    reset_accumulated_memory(d);
  });
  m.def("memory_stats", [](int d) {
    check_device(d);
    return memory_stats_dict(d);
  });
  m.def("manual_seed", [](int device, uint64_t seed) {
    at::Generator g = gen(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(seed);
  });
  m.def("seed", [](int device) {
    at::Generator g = gen(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.seed();
  });
  m.def("initial_seed", [](int device) { return gen(device).current_seed(); });
  m.def("get_rng_state", [](int device) {
    at::Generator g = gen(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    uint64_t s[2] = {g.current_seed(), g.get_offset()};
    return py::bytes(reinterpret_cast<const char*>(s), 16);
  });
  m.def("set_rng_state", [](int device, const py::bytes& b) {
    std::string s = b;
    TORCH_CHECK(s.size() == 16, "[tpu] RNG state must be 16 bytes [seed | offset]");
    uint64_t v[2];
    std::memcpy(v, s.data(), 16);
    at::Generator g = gen(device);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(v[0]);
    g.set_offset(v[1]);
  });
}
