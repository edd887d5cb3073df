"""Ranks that diverge must never hang silently: each scenario makes one rank go wrong;
every surviving rank must raise within the timeout, naming both sides.
argv[1]: extra_broadcast | other_shape | exits | stuck."""

import os
import sys
import time

import torch
import torch.distributed as dist
import torchtpu  # noqa: F401

scenario = sys.argv[1]
dist.init_process_group()
rank = dist.get_rank()
dev = torch.device("tpu", int(os.environ["LOCAL_RANK"]))
torch.tpu.set_device(dev)

try:
    x = torch.ones(3, device=dev)
    dist.all_reduce(x)  # collective #1: everyone agrees
    if scenario == "extra_broadcast" and rank == 1:
        dist.broadcast(x, src=0)
    elif scenario == "other_shape" and rank == 1:
        x = torch.ones(4, device=dev)
    elif scenario == "exits" and rank == 1:
        os._exit(3)
    elif scenario == "stuck" and rank == 1:
        time.sleep(600)
    dist.all_reduce(x)
    x.cpu()
    print(f"RANK {rank} FINISHED", flush=True)
except Exception as e:  # noqa: BLE001
    print(f"RANK {rank} ERROR {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
