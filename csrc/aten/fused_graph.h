// Fused Eager's recorded graph, shared by the recorder (fused_record.cpp)
// and the runner (fused_run.cpp). Internal to those two files.
#pragma once
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <map>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "aten/program.h"
#include "graph/policy.h"

namespace torchtpu::aten::fused {

bool debug_fusion();  // TORCHTPU_DEBUG_FUSION=1

// Whether an argument is a Tensor?[] / Tensor[] held as a generic list.
inline bool is_tensor_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  auto t = v.toList().elementType();
  if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
  return t->kind() == c10::TypeKind::TensorType;
}

// How a recorded call's tensor argument is kept without keeping its storage alive.
// Inline vectors: a step records hundreds of calls, and heap vectors per call
// made malloc a tenth of the recording thread's time.
struct TensorDesc {
  enum Kind : uint8_t { Undefined, Host, Device } kind;
  int slot = -1;
  c10::ScalarType dtype = c10::kFloat;
  c10::SmallVector<int64_t, 5> sizes, strides;
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

// torchtpu::spmd_collective (a collective recorded by SPMD mode).
inline bool is_spmd_op(const c10::OperatorHandle& op) {
  static const c10::OperatorName name("torchtpu::spmd_collective", "");
  return op.operator_name() == name;
}

struct Node {
  c10::OperatorHandle op;
  const OpInfo* info;
  torch::jit::Stack args;                 // device tensors replaced by undefined placeholders
  c10::SmallVector<TensorDesc, 3> descs;  // every tensor position, in traversal order
  std::shared_ptr<const Template> tmpl;
  c10::SmallVector<int, 2> out_slots;  // per output: graph slot of a fresh tensor, or -1
  c10::SmallVector<int, 2> writes;     // graph slots written in place
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

// What the next flush ran, filled while Graph::capture is set (replay.cpp
// captures a compiled graph's program and where its buffers come from).
struct FlushCapture {
  int parts = 0;  // programs the flush ran (a replay needs exactly one)
  std::shared_ptr<const ProgramEntry> entry;
  std::vector<pjrt::BufferPtr> inputs;      // the program's arguments as gathered
  std::vector<DeviceStorage*> in_storage;   // per argument: its storage (Storage inputs)
  std::vector<char> donated;                // per argument
  std::vector<int64_t> rng_numel;           // per argument: random numbers drawn (Rng inputs)
  std::vector<char> rng_generator;          // per argument: drawn from an explicit generator
  std::vector<DeviceStorage*> out_storage;  // per result: the storage it became (null: none)
  std::vector<char> out_fresh;              // per result: a storage made during the graph
  bool replicated = false;                  // a program held SPMD collectives
};

// Per storage a capture region saw: a weak reference, so the region can keep
// the storages its program reads and reach those it writes (replay.cpp).
using RegionStorages =
    std::unordered_map<const DeviceStorage*, c10::weak_intrusive_ptr<c10::StorageImpl>>;

struct Graph {
  std::recursive_mutex mu;
  FlushCapture* capture = nullptr;
  RegionStorages* region = nullptr;  // set while a capture region records
  std::vector<Node> nodes;
  std::vector<GraphSlot> slots;
  // slot_of's entries come from a pool that keeps them after a cut: one
  // allocation per storage of each graph was a cost of every recorded call.
  std::pmr::unsynchronized_pool_resource slot_pool;
  std::pmr::unordered_map<const DeviceStorage*, int> slot_of{&slot_pool};
  std::string key;       // "F" + per call: its key and the graph slots of its storages
  int device = 0;        // every call of this graph runs here (one graph per device)
  bool counted = false;  // counted in g_nonempty
  // Storages freed while another thread held `mu` (the free hook never
  // waits for it): forgotten and freed by this graph's next locker.
  std::mutex freed_mu;
  std::vector<DeviceStorage*> freed_later;
  // The group of the SPMD collectives recorded (a replica group tag), or -1:
  // such a graph runs as one replicated program with the group's other ranks.
  int64_t spmd_group = -1;
  int64_t live_pending = 0;  // live storages whose value the graph holds
  graph::LoopDetector loop;
  uint64_t prefix = 0;              // hash of the calls recorded so far
  std::vector<uint64_t> prefix_at;  // per node: `prefix` before it
  graph::ReadAhead read_ahead;
  bool ahead = false;  // the last cut was a read-ahead cut; the read is still to come
};

// Device `device`'s graph. Leaked: storages may die after static
// destructors run.
Graph& graph(int device);
// The graphs made so far, by device.
std::vector<Graph*> graphs();

// While a thread rank waits for `g`'s lock, its rendezvous can name the wait
// when the rank misses a collective (rank_wait).
class RankWait {
 public:
  explicit RankWait(const Graph& g);
  ~RankWait();
  RankWait(const RankWait&) = delete;
  RankWait& operator=(const RankWait&) = delete;

 private:
  int device_;
};

// Holds `g.mu`. A thread that must wait for it waits through the bindings'
// wait hook (set_wait_hook), without Python's GIL.
class GraphLock {
 public:
  explicit GraphLock(Graph& g);
  ~GraphLock();

 private:
  std::unique_lock<std::recursive_mutex> lock_;
  bool outermost_ = false;  // this thread held no graph's lock before
};
// How many graphs hold calls (0: nothing to flush, checked without locks).
extern std::atomic<int> g_nonempty;

// Counts a cut by `reason` (metrics()["fused_cuts"]); its own lock, so the
// report never waits for a graph (a rank's may wait for the other ranks).
void count_cut(const std::string& reason);

// Runs the graph (see fused_run.cpp); with `target`, the calls the host's
// read of that slot needs run first.
void flush_locked(Graph& g, const char* reason, int target = -1);
// Empties the graph after a cut.
void clear(Graph& g);
std::string node_name(const Node& n);

}  // namespace torchtpu::aten::fused
