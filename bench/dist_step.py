"""One rank of the distributed benchmark (run by bench/dist.py under torchrun): GPT
training steps with DDP or FSDP2 on tpu, per-rank batch fixed (weak scaling). Prints
one JSON line from rank 0: median step seconds, the share of it inside collectives,
collective payload bytes per step next to the analytic value, host-copy bytes."""

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torchtpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from models import GPT, copy_task_batch

wrapper, steps = sys.argv[1], int(sys.argv[2])
WARMUP = 3
dist.init_process_group()
rank, n = dist.get_rank(), dist.get_world_size()
dev = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
torch.tpu.set_device(dev)
torch.manual_seed(0)
model = GPT(d=128, layers=2, seq=64).to(dev)
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
if wrapper == "ddp":
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(model)
    analytic = {"all_reduce": param_bytes}
else:
    from torch.distributed.fsdp import fully_shard

    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    # Each rank contributes its shard to the forward all-gather and the backward
    # re-gather (the root's own parameters stay gathered: once), and receives its
    # shard of the gradients' reduce-scatter.
    analytic = {"all_gather": 2 * param_bytes // n, "reduce_scatter": param_bytes // n}
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
g = torch.Generator().manual_seed(rank)


def totals():
    c = torchtpu.metrics()["collectives"]
    return (sum(v["seconds"] for v in c.values()), sum(v["bytes"] for v in c.values()),
            sum(v["host_copy_bytes"] for v in c.values()), c)


times = []
for step in range(WARMUP + steps):
    if step == WARMUP:
        base = totals()
    x, y = copy_task_batch(g, 8, 64, 64)
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = model(x.to(dev), y.to(dev))
    loss.backward()
    opt.step()
    loss.item()
    times.append(time.perf_counter() - t0)
end = totals()
by_kind = {k: (v["bytes"] - base[3].get(k, {"bytes": 0})["bytes"]) / steps for k, v in end[3].items()}
step_s = statistics.median(times[WARMUP:])
row = {
    "wrapper": wrapper, "ranks": n, "mode": torchtpu.get_eager_mode(),
    "step_ms": round(step_s * 1e3, 2),
    "collective_share": round((end[0] - base[0]) / steps / step_s, 3),
    "bytes_per_step": {k: int(v) for k, v in sorted(by_kind.items()) if v},
    "analytic_bytes": analytic,
    "host_copy_bytes_per_step": int((end[2] - base[2]) / steps),
    "ns_per_host_byte": round((end[0] - base[0]) / max(1, end[2] - base[2]) * 1e9, 3),
}
if rank == 0:
    print("RESULT " + json.dumps(row), flush=True)
dist.destroy_process_group()
