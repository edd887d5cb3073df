"""MPMD: rank 0 evaluates and logs every step while every rank trains (DDP). Losses
must match a single-process run, and after warm-up no rank compiles anything: the
rank-specific work never changes a program that holds a collective.
argv[1]: fused | compile."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchtpu
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from models import MLP

mode = sys.argv[1]
STEPS, WARMUP = 8, 3
torchtpu.eager_mode("fused").__enter__()
dist.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
torch.tpu.set_device(dev)

g = torch.Generator().manual_seed(1)
data = [(torch.randn(8 * n, 32, generator=g), torch.randint(0, 10, (8 * n,), generator=g))
        for _ in range(STEPS)]
eval_x = torch.randn(16, 32, generator=g)


def run(model, shard: bool):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    fwd = torch.compile(model, backend="tpu") if mode == "compile" else model
    losses, evals, compiles = [], [], []
    for step, (x, y) in enumerate(data):
        if shard:
            x, y = x.chunk(n)[rank], y.chunk(n)[rank]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(fwd(x.to(dev)), y.to(dev))
        loss.backward()
        opt.step()
        if shard:
            loss = loss.detach().clone()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        if not shard or rank == 0:
            # Rank 0 alone: an evaluation and a log line every step.
            with torch.no_grad():
                inner = model.module if shard else model
                evals.append(inner(eval_x.to(dev)).softmax(-1).max().item())
        losses.append(loss.item())
        if step == WARMUP - 1:
            before = torchtpu.metrics()["compiles"]
    compiles = torchtpu.metrics()["compiles"] - before
    return losses, evals, compiles


torch.manual_seed(0)
par = DDP(MLP().to(dev))
got, got_evals, compiles = run(par, True)
assert compiles == 0, f"rank {rank}: {compiles} compiles after warm-up"
torch.manual_seed(0)
ref, ref_evals, _ = run(MLP().to(dev), False)
for step in range(STEPS):
    assert abs(got[step] - ref[step]) <= 1e-5 * abs(ref[step]), (step, got, ref)
if rank == 0:
    for step in range(STEPS):
        assert abs(got_evals[step] - ref_evals[step]) <= 1e-5, (step, got_evals, ref_evals)
cuts = torchtpu.metrics()["fused_cuts"]
assert cuts.get("collective", 0) > 0, cuts
print(f"rank {rank}: mpmd {mode} ok, 0 compiles after warm-up, cuts {cuts}", flush=True)
dist.destroy_process_group()
