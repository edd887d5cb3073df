#include "dist/device.h"

#include <c10/util/Exception.h>
#include <torch/library.h>

#include <chrono>
#include <mutex>

#include "aten/fused.h"
#include "aten/launch.h"
#include "aten/runtime.h"
#include "dist/backend.h"
#include "hlo/builder.h"
#include "lower/types.h"

namespace torchtpu::dist {
namespace {

hlo::Reducer reducer(const std::string& r) {
  try {
    return hlo::reducer_named(r);
  } catch (const hlo::BuildError& e) {
    TORCH_CHECK_VALUE(false, "[tpu] device collective: ", e.what());
  }
}

// The storage buffer of a contiguous tensor that covers its whole storage,
// with the tensor's element type (else a fresh contiguous copy).
pjrt::BufferPtr buffer_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  auto& st = aten::device_storage(c.storage());
  if (c.storage_offset() != 0 || st.dtype != lower::to_dtype(t.scalar_type()) ||
      int64_t(st.nbytes) != c.numel() * c.element_size() || !st.buffer)
    return buffer_of(c.clone());
  return st.buffer;
}

}  // namespace

std::vector<std::vector<pjrt::BufferPtr>> run_replicated(
    pjrt::Executable& exe, const std::vector<std::vector<pjrt::Buffer*>>& args) {
  // XLA:CPU runs each replica on a shared thread pool and blocks it until all
  // replicas meet; two replicated programs in flight at once can hold every
  // pool thread with half-met collectives and abort the process. One at a
  // time, finished before the next starts.
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto outs = exe.execute_replicated(args);
  for (auto& replica : outs)
    for (auto& b : replica) b->await_ready();
  return outs;
}

ReplicatedProgram replicated_program(const std::string& kind, DType dt,
                                     const std::vector<int64_t>& sizes, const std::string& reduce,
                                     int64_t dim, int64_t dim2,
                                     const std::vector<std::vector<int64_t>>& pairs, int64_t n) {
  return replicated_program(kind, {Part{dt, sizes}}, reduce, dim, dim2, pairs, n);
}

ReplicatedProgram replicated_program(const std::string& kind, const std::vector<Part>& parts,
                                     const std::string& reduce, int64_t dim, int64_t dim2,
                                     const std::vector<std::vector<int64_t>>& pairs, int64_t n) {
  std::vector<int> devices(n);
  for (int64_t i = 0; i < n; ++i) devices[i] = int(i);
  return replicated_program(kind, parts, reduce, dim, dim2, pairs, devices);
}

ReplicatedProgram replicated_program(const std::string& kind, const std::vector<Part>& parts,
                                     const std::string& reduce, int64_t dim, int64_t dim2,
                                     const std::vector<std::vector<int64_t>>& pairs,
                                     const std::vector<int>& devices) {
  const int64_t n = int64_t(devices.size());
  // One program: each part's flat storage in, the collective on its shape, flat out.
  const hlo::Builder::Groups all = {[&] {
    std::vector<int64_t> g;
    for (int64_t i = 0; i < n; ++i) g.push_back(i);
    return g;
  }()};
  hlo::Builder b;
  ReplicatedProgram p;
  std::vector<hlo::Value> outs;
  for (const Part& part : parts) {
    const hlo::Shape shape(part.sizes.begin(), part.sizes.end());
    int64_t numel = 1;
    for (int64_t s : part.sizes) numel *= s;
    hlo::Value x = b.reshape(b.param(hlo::Type{part.dt, {numel}}), shape);
    auto d = [&](int64_t v) { return v < 0 ? v + x.rank() : v; };
    hlo::Value y;
    try {
      if (kind == "all_reduce")
        y = b.all_reduce(x, reducer(reduce), all);
      else if (kind == "all_gather")
        y = b.all_gather(x, d(dim), all);
      else if (kind == "reduce_scatter")
        y = b.reduce_scatter(x, d(dim), reducer(reduce), all);
      else if (kind == "all_to_all")
        y = b.all_to_all(x, d(dim), d(dim2), all);
      else if (kind == "permute")
        y = b.collective_permute(x, pairs);
      else
        TORCH_CHECK_VALUE(false, "[tpu] device collective: unknown kind '", kind, "'");
    } catch (const hlo::BuildError& e) {
      TORCH_CHECK_VALUE(false, "[tpu] device ", kind, " of ", n, " x ",
                        c10::IntArrayRef(part.sizes), ": ", e.what());
    }
    p.out_shapes.push_back(y.shape());
    outs.push_back(b.reshape(y, {y.type.numel()}));
  }
  p.out_shape = p.out_shapes.at(0);
  b.ret(outs);
  p.exe = aten::compile_cached(b.module(), aten::replica_options({devices.begin(), devices.end()}));
  return p;
}

std::vector<at::Tensor> device_collective(const std::string& kind,
                                          const std::vector<at::Tensor>& tensors,
                                          const std::string& reduce, int64_t dim, int64_t dim2,
                                          const std::vector<std::vector<int64_t>>& pairs) {
  const int64_t n = int64_t(tensors.size());
  TORCH_CHECK_VALUE(n > 0, "[tpu] device ", kind, ": no tensors");
  const at::Tensor& t0 = tensors[0];
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1 && t.device().index() == i,
                      "[tpu] device ", kind, ": tensor ", i, " must be on tpu:", i, ", got ",
                      t.device(), " (one tensor per device, in device order)");
    TORCH_CHECK_VALUE(t.scalar_type() == t0.scalar_type() && t.sizes() == t0.sizes(),
                      "[tpu] device ", kind, ": every tensor must match tensor 0 (",
                      t0.scalar_type(), t0.sizes(), "), tensor ", i, " is ", t.scalar_type(),
                      t.sizes());
  }
  TORCH_CHECK_VALUE(n <= aten::device_count(), "[tpu] device ", kind, ": ", n, " tensors but ",
                    aten::device_count(), " devices");
  auto start = std::chrono::steady_clock::now();
  aten::fused_flush("collective");
  ReplicatedProgram prog = replicated_program(kind, lower::to_dtype(t0.scalar_type()),
                                              t0.sizes().vec(), reduce, dim, dim2, pairs, n);
  const std::vector<int64_t>& out_sizes = prog.out_shape;
  auto& exe = prog.exe;

  std::vector<pjrt::BufferPtr> keep;
  std::vector<std::vector<pjrt::Buffer*>> args(n);
  for (int64_t i = 0; i < n; ++i) {
    keep.push_back(buffer_of(tensors[i]));
    args[i].push_back(keep.back().get());
  }
  auto outs = run_replicated(*exe, args);
  std::vector<at::Tensor> result;
  for (int64_t i = 0; i < n; ++i)
    result.push_back(aten::wrap_buffer(outs[i][0], out_sizes, t0.scalar_type(), int(i)));
  std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  count_collective("device_" + kind, n * t0.numel() * t0.element_size(), 0, took.count());
  return result;
}

namespace {

std::vector<at::Tensor> device_collective_op(c10::string_view kind, at::TensorList tensors,
                                             c10::string_view reduce, int64_t dim, int64_t dim2,
                                             at::IntArrayRef flat_pairs) {
  std::vector<std::vector<int64_t>> pairs;
  for (size_t i = 0; i + 1 < flat_pairs.size(); i += 2)
    pairs.push_back({flat_pairs[i], flat_pairs[i + 1]});
  return device_collective(std::string(kind), tensors.vec(), std::string(reduce), dim, dim2, pairs);
}

}  // namespace

// torch.ops.torchtpu.device_collective: Python reaches it through the
// dispatcher (tensors cross without Python headers here).
TORCH_LIBRARY(torchtpu, m) {
  m.def(
      "device_collective(str kind, Tensor[] tensors, str reduce, int dim, int dim2, "
      "int[] pairs) -> Tensor[]");
}
TORCH_LIBRARY_IMPL(torchtpu, PrivateUse1, m) { m.impl("device_collective", &device_collective_op); }

}  // namespace torchtpu::dist
