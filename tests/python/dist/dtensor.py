"""DTensor on a tpu DeviceMesh: placements, redistribution, a matmul and a
tensor-parallel module, exact against the same computation on one process."""

import os

import torch
import torch.distributed as dist
import torchtpu  # noqa: F401
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

n = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("tpu", (n,))
rank = dist.get_rank()
dev = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
assert torch.tpu.current_device() == dev.index
checks = []


def exact(dt, ref, what):
    full = dt.full_tensor() if isinstance(dt, DTensor) else dt
    assert full.device.type == "tpu", (what, full.device)
    got = full.cpu()
    assert torch.equal(got, ref), f"rank {rank} {what}:\n{got}\nvs\n{ref}"
    checks.append(what)


torch.manual_seed(0)
a = torch.randn(4 * n, 6)
b = torch.randn(6, 3 * n)

for placement in (Shard(0), Shard(1), Replicate()):
    d = distribute_tensor(a.to(dev), mesh, [placement])
    exact(d, a, f"distribute_tensor {placement}")
    assert d.to_local().shape == (
        a.shape if placement == Replicate() else a.chunk(n, dim=placement.dim)[rank].shape
    )

# Partial: each rank holds a summand; redistributing to Replicate all-reduces.
part = DTensor.from_local(torch.full((2, 2), float(rank + 1), device=dev), mesh, [Partial()])
exact(
    part.redistribute(mesh, [Replicate()]),
    torch.full((2, 2), float(n * (n + 1) // 2)),
    "Partial -> Replicate",
)

d = distribute_tensor(a.to(dev), mesh, [Shard(0)])
exact(d.redistribute(mesh, [Shard(1)]), a, "Shard(0) -> Shard(1)")
exact(d.redistribute(mesh, [Replicate()]), a, "Shard(0) -> Replicate")

# A matmul of a row-sharded and a replicated operand, then one sharded on the inner dim.
da = distribute_tensor(a.to(dev), mesh, [Shard(0)])
db = distribute_tensor(b.to(dev), mesh, [Replicate()])
ref = a @ b
got = (da @ db).full_tensor().cpu()
# Exact against each shard's own product on one device: the same matmul at the
# same sizes (the whole product may round differently: GEMM blocking depends on
# the row count).
local = torch.cat([(s.to(dev) @ b.to(dev)).cpu() for s in a.chunk(n, dim=0)])
assert torch.equal(got, local), "sharded matmul"
checks.append("matmul Shard(0) x Replicate")
di = distribute_tensor(a.to(dev), mesh, [Shard(1)]) @ distribute_tensor(b.to(dev), mesh, [Shard(0)])
torch.testing.assert_close(di.full_tensor().cpu(), ref, rtol=1e-5, atol=1e-5)
checks.append("matmul Shard(1) x Shard(0) (partial sums)")

# Tensor parallel MLP: column-wise then row-wise, forward and backward.
torch.manual_seed(1)
mlp = nn.Sequential(nn.Linear(8, 16 * n), nn.ReLU(), nn.Linear(16 * n, 4))
local = nn.Sequential(nn.Linear(8, 16 * n), nn.ReLU(), nn.Linear(16 * n, 4))
local.load_state_dict(mlp.state_dict())
tp = parallelize_module(mlp.to(dev), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
x = torch.randn(5, 8)
out = tp(x.to(dev))
out.sum().backward()
ref_out = local.to(dev)(x.to(dev))
ref_out.sum().backward()
torch.testing.assert_close(out.cpu(), ref_out.cpu(), rtol=1e-5, atol=1e-5)
for (name, p), q in zip(tp.named_parameters(), local.parameters()):
    g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
    torch.testing.assert_close(g.cpu(), q.grad.cpu(), rtol=1e-5, atol=1e-5, msg=name)
checks.append("ColwiseParallel/RowwiseParallel forward+backward")

# distribute_module with the default (replicate every parameter).
lin = distribute_module(nn.Linear(6, 3).to(dev), mesh)
assert all(isinstance(p, DTensor) for p in lin.parameters())
y = lin(distribute_tensor(a.to(dev), mesh, [Replicate()]))
exact(
    y,
    torch.nn.functional.linear(a.to(dev), lin.weight.full_tensor(), lin.bias.full_tensor()).cpu(),
    "distribute_module",
)

print(f"rank {rank}: {len(checks)} DTensor checks passed", flush=True)
dist.destroy_process_group()
