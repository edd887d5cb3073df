// torchtpu::spmd_collective: a collective recorded into a Fused Eager graph
// (tpu_local thread ranks in SPMD mode). The program becomes a replicated one
// over the group's devices; replica r is group rank r.
#include "lower/registry.h"

namespace torchtpu::lower {

TPU_LOWERING(spmd_collective) {
  // (Tensor x, str kind, str reduce, int dim, int[] devices, int group) -> Tensor
  reg("torchtpu::spmd_collective", [](Ctx& c) -> std::vector<Value> {
    Value x = c.in(0);
    const std::string& kind = c.arg(1).toStringRef();
    const std::string& reduce = c.arg(2).toStringRef();
    const int64_t dim = c.i64(3);
    std::vector<int64_t> devices = c.ints(4);
    const Builder::Groups all = {[&] {
      std::vector<int64_t> g(devices.size());
      for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<int64_t>(i);
      return g;
    }()};
    c.b.replicate(c.i64(5), std::move(devices));
    if (kind == "all_reduce") return {c.b.all_reduce(x, hlo::reducer_named(reduce), all)};
    if (kind == "all_gather") return {c.b.all_gather(x, dim, all)};
    if (kind == "reduce_scatter")
      return {c.b.reduce_scatter(x, dim, hlo::reducer_named(reduce), all)};
    throw hlo::BuildError("[torchtpu::spmd_collective] unknown kind '" + kind + "'");
  });
}

}  // namespace torchtpu::lower
