// Cross-replica collectives: one program runs on every replica and the ops
// exchange data between them (XLA:CPU in-process, NCCL on GPUs, ICI on TPUs).
#include <string>

#include "hlo/builder.h"

namespace torchtpu::hlo {
namespace {

// dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>
std::string dense_groups(const char* op, const Builder::Groups& groups) {
  if (groups.empty() || groups[0].empty())
    throw BuildError(std::string("[hlo] ") + op + ": no replica groups");
  std::string s = "dense<[";
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].size() != groups[0].size())
      throw BuildError(std::string("[hlo] ") + op + ": replica groups of different sizes");
    s += g ? ", [" : "[";
    for (size_t i = 0; i < groups[g].size(); ++i)
      s += (i ? ", " : "") + std::to_string(groups[g][i]);
    s += "]";
  }
  return s + "]> : tensor<" + std::to_string(groups.size()) + "x" +
         std::to_string(groups[0].size()) + "xi64>";
}

int64_t group_size(const Builder::Groups& groups) { return int64_t(groups[0].size()); }

}  // namespace

Reducer reducer_named(const std::string& r) {
  if (r == "sum") return Reducer::Add;
  if (r == "prod") return Reducer::Mul;
  if (r == "max") return Reducer::Max;
  if (r == "min") return Reducer::Min;
  if (r == "band") return Reducer::And;
  if (r == "bor") return Reducer::Or;
  if (r == "bxor") return Reducer::Xor;
  throw BuildError("[hlo] reduce op '" + r +
                   "' is not one of sum, prod, max, min, band, bor, bxor");
}

void Builder::replicate(int64_t tag, std::vector<int64_t> devices) {
  if (replication_.tag >= 0 && (replication_.tag != tag || replication_.devices != devices))
    throw BuildError("[hlo] one program holds collectives of two replica groups");
  replication_ = {tag, std::move(devices)};
}

Value Builder::all_reduce(Value x, Reducer r, const Groups& groups) {
  std::string body = reducer_region(r, x.dtype());
  return op("all_reduce", {x}, "replica_groups = " + dense_groups("all_reduce", groups), x.type,
            body);
}

Value Builder::all_gather(Value x, int64_t dim, const Groups& groups) {
  if (dim < 0 || dim >= x.rank()) fail("all_gather", "dim out of range for " + x.type.str());
  Shape out = x.shape();
  out[dim] *= group_size(groups);
  return op("all_gather", {x},
            "all_gather_dim = " + std::to_string(dim) +
                " : i64, replica_groups = " + dense_groups("all_gather", groups),
            Type{x.dtype(), out});
}

Value Builder::reduce_scatter(Value x, int64_t dim, Reducer r, const Groups& groups) {
  if (dim < 0 || dim >= x.rank() || x.shape()[dim] % group_size(groups) != 0)
    fail("reduce_scatter", "dim " + std::to_string(dim) + " of " + x.type.str() +
                               " does not split into " + std::to_string(group_size(groups)));
  Shape out = x.shape();
  out[dim] /= group_size(groups);
  std::string body = reducer_region(r, x.dtype());
  return op("reduce_scatter", {x},
            "scatter_dimension = " + std::to_string(dim) +
                " : i64, replica_groups = " + dense_groups("reduce_scatter", groups),
            Type{x.dtype(), out}, body);
}

Value Builder::all_to_all(Value x, int64_t split_dim, int64_t concat_dim, const Groups& groups) {
  int64_t n = group_size(groups);
  if (split_dim < 0 || split_dim >= x.rank() || concat_dim < 0 || concat_dim >= x.rank() ||
      x.shape()[split_dim] % n != 0)
    fail("all_to_all", "split " + std::to_string(split_dim) + " / concat " +
                           std::to_string(concat_dim) + " of " + x.type.str());
  Shape out = x.shape();
  out[split_dim] /= n;
  out[concat_dim] *= n;
  return op("all_to_all", {x},
            "split_dimension = " + std::to_string(split_dim) + " : i64, concat_dimension = " +
                std::to_string(concat_dim) + " : i64, split_count = " + std::to_string(n) +
                " : i64, replica_groups = " + dense_groups("all_to_all", groups),
            Type{x.dtype(), out});
}

Value Builder::collective_permute(Value x, const Groups& pairs) {
  for (auto& p : pairs)
    if (p.size() != 2) fail("collective_permute", "pairs must be [source, target]");
  return op("collective_permute", {x},
            "source_target_pairs = " + dense_groups("collective_permute", pairs), x.type);
}

}  // namespace torchtpu::hlo
