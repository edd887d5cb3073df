"""Data-parallel training on tpu: DDP (plain, find_unused_parameters, a comm hook) and
FSDP2 fully_shard, 5 steps, against a single-process run on the same global batch (on
tpu, same mode: 1e-5 relative per step) and on CPU eager (1e-4). Parameters must be equal
across ranks afterwards. argv: wrapper (ddp|ddp_unused|ddp_hook|fsdp) model (mlp|gpt)
mode (strict|fused|compile)."""

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchtpu
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from models import GPT, MLP, copy_task_batch

wrapper, model_name, mode = sys.argv[1:4]
STEPS = 5
if mode in ("strict", "fused"):
    torchtpu.eager_mode(mode).__enter__()

dist.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
torch.tpu.set_device(dev)


class WithUnused(nn.Module):
    """An MLP plus a branch that never takes part in the loss."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP()
        self.unused = nn.Linear(32, 10)

    def forward(self, x):
        return self.mlp(x)


def make_model():
    torch.manual_seed(0)
    if model_name == "gpt":
        return GPT()
    return WithUnused() if wrapper == "ddp_unused" else MLP()


def batches():
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        if model_name == "gpt":
            out.append(copy_task_batch(g, 4 * n, 32, 64))
        else:
            out.append((torch.randn(8 * n, 32, generator=g), torch.randint(0, 10, (8 * n,), generator=g)))
    return out


def loss_of(model, x, y):
    if model_name == "gpt":
        return model(x, y)
    return F.cross_entropy(model(x), y)


def train(model, device, shard: bool):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, foreach=True)
    step_fn = loss_of
    if mode == "compile" and device != "cpu":
        step_fn = torch.compile(loss_of, backend="tpu")
    losses = []
    for x, y in batches():
        if shard:
            x, y = x.chunk(n)[rank], y.chunk(n)[rank]
        opt.zero_grad(set_to_none=True)
        loss = step_fn(model, x.to(device), y.to(device))
        loss.backward()
        opt.step()
        if shard:
            loss = loss.detach().clone()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
        losses.append(loss.item())
    return losses


def wrap(model):
    if wrapper.startswith("ddp"):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, find_unused_parameters=wrapper == "ddp_unused")
        if wrapper == "ddp_hook":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        return ddp
    from torch.distributed.fsdp import fully_shard

    if model_name == "gpt":
        for blk in model.blocks:
            fully_shard(blk)
    return fully_shard(model)


par = wrap(make_model().to(dev))
got = train(par, dev, shard=True)
single = train(make_model().to(dev), dev, shard=False)
cpu = train(make_model(), "cpu", shard=False)
for step in range(STEPS):
    assert abs(got[step] - single[step]) <= 1e-5 * abs(single[step]), (step, got, single)
    assert abs(got[step] - cpu[step]) <= 1e-4 * abs(cpu[step]), (step, got, cpu)

# Every rank holds the same parameters afterwards.
for name, p in par.named_parameters():
    full = p.full_tensor() if hasattr(p, "full_tensor") else p
    lo, hi = full.detach().clone(), full.detach().clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    assert torch.equal(lo.cpu(), hi.cpu()), f"{name} differs across ranks"

stats = torchtpu.metrics()["collectives"]
print(f"rank {rank}: {wrapper} {model_name} {mode} losses {[round(v, 6) for v in got]} "
      f"single {[round(v, 6) for v in single]} collectives {sorted(stats)}", flush=True)
dist.destroy_process_group()
