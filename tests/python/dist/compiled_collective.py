"""A collective inside a torch.compile(backend="tpu") function: the graph's ops are
recorded in Fused Eager, the collective cuts the program there, results are right and
nothing recompiles on later calls; rank-specific work between calls is fine."""

import os

import torch
import torch.distributed as dist

import torchtpu

dist.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
torch.tpu.set_device(dev)


@torch.compile(backend="tpu")
def step(x):
    y = x * 2
    dist.all_reduce(y)
    return y.sin() + 1


for i in range(4):
    if i == 2:
        before = torchtpu.metrics()["compiles"]
    x = torch.arange(6.0).reshape(2, 3) + rank + i
    got = step(x.to(dev)).cpu()
    ref = (sum((torch.arange(6.0).reshape(2, 3) + r + i) * 2 for r in range(n))).sin() + 1
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    if rank == 0:
        (x.to(dev) * 3).sum().item()  # rank-specific work between compiled calls
assert torchtpu.metrics()["compiles"] == before, "recompiled after warm-up"
cuts = torchtpu.metrics()["fused_cuts"]
assert cuts.get("collective", 0) >= 4, cuts
print(f"rank {rank}: compiled collective ok, cuts {cuts}", flush=True)
dist.destroy_process_group()
