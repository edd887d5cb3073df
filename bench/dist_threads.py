"""Thread ranks (tpu_local) in Fused Eager: a DDP GPT step with SPMD mode off and on, at
2 and 4 devices of one process. Each row runs in a fresh process. Prints a markdown
table: median step ms, fused graphs and collective cuts per step per rank.
Usage: python bench/dist_threads.py [--steps 8] [--ranks 2 4]."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(n: int, steps: int, spmd_on: bool) -> None:
    import statistics
    import time

    import torch
    import torch.distributed as dist
    import torchtpu
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchtpu.distributed import run_on_devices, spmd

    sys.path.insert(0, str(ROOT / "examples"))
    from models import GPT, copy_task_batch

    warmup = 3
    torch.manual_seed(0)
    init = GPT(d=128, layers=2, seq=64)
    state = init.state_dict()
    marks = {}

    def rank_main(rank):
        dev = torch.device("tpu", rank)
        model = GPT(d=128, layers=2, seq=64)
        model.load_state_dict(state)
        model = DDP(model.to(dev))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        g = torch.Generator().manual_seed(rank)
        times = []
        for step in range(warmup + steps):
            if step == warmup:
                dist.barrier()
                if rank == 0:
                    marks["start"] = torchtpu.metrics()
            x, y = copy_task_batch(g, 8, 64, 64)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model(x.to(dev), y.to(dev))
            loss.backward()
            opt.step()
            loss.item()  # every rank reads: the step's graphs agree
            times.append(time.perf_counter() - t0)
        dist.barrier()
        if rank == 0:
            marks["end"] = torchtpu.metrics()
        return statistics.median(times[warmup:])

    with torchtpu.eager_mode("fused"), spmd(bool(spmd_on)):
        medians = run_on_devices(rank_main, n, join_timeout=600)
    a, b = marks["start"], marks["end"]
    cuts = {k: (v - a["fused_cuts"].get(k, 0)) / steps / n for k, v in b["fused_cuts"].items()}
    row = {
        "ranks": n,
        "spmd": spmd_on,
        "step_ms": round(max(medians) * 1e3, 1),
        "graphs": round((b["fused_graphs"] - a["fused_graphs"]) / steps / n, 2),
        "collective_cuts": round(cuts.get("collective", 0), 2),
        "compiles": b["compiles"] - a["compiles"],
    }
    print("RESULT " + json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child[:2], bool(args.child[2]))
    print(
        "| thread ranks | SPMD mode | step ms (slowest rank's median) | fused graphs per step "
        "per rank | collective cuts per step per rank | compiles after warm-up |"
    )
    print("|---|---|---|---|---|---|")
    for n in args.ranks:
        for spmd in (0, 1):
            env = dict(os.environ, TORCHTPU_NUM_DEVICES=str(n), PYTHONPATH=str(ROOT / "python"))
            cmd = [sys.executable, __file__, "--child", str(n), str(args.steps), str(spmd)]
            r = subprocess.run(
                cmd, check=False, env=env, capture_output=True, text=True, timeout=900
            )
            line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
            if r.returncode or line is None:
                print(f"| {n} | {'on' if spmd else 'off'} | failed: {r.stderr[-300:]!r} |")
                continue
            d = json.loads(line[7:])
            print(
                f"| {n} | {'on' if spmd else 'off'} | {d['step_ms']} | {d['graphs']} | "
                f"{d['collective_cuts']} | {d['compiles']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
