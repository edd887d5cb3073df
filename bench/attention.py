"""Fused attention against PyTorch's math path on the tpu device, in one process.

The bench GPT's training step (bench/run.py's Trainer, batch 8x32) in Strict, Fused and
compiled modes, each with scaled_dot_product_attention as the fused op and with
``sdpa_kernel([SDPBackend.MATH])``, interleaved, against torch CPU eager; then one
attention forward and backward alone. Medians of the timed steps.

    PYTHONPATH=python .venv/bin/python bench/attention.py [--rounds 5 --steps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "examples")]
import torchtpu
from models import GPT, copy_task_batch
from run import Trainer

MODES = {"strict": ("strict", None), "fused": ("fused", None), "compiled": ("fused", "tpu")}


def path(kind: str):
    return sdpa_kernel([SDPBackend.MATH]) if kind == "math" else contextlib.nullcontext()


def training(rounds: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(0)
    batches = [copy_task_batch(gen, 8, 32, 64) for _ in range(4)]
    rows = {
        (mode, kind): (Trainer(GPT, batches, "tpu", backend=backend), eager)
        for kind in ("fused", "math")
        for mode, (eager, backend) in MODES.items()
    }
    for (_, kind), (t, eager) in rows.items():  # warm-up: compiles and captures
        with torchtpu.eager_mode(eager), path(kind):
            t.run(5)
    cpu = Trainer(GPT, batches, "cpu")
    cpu.run(5)
    times: dict = {}
    for _ in range(rounds):
        times.setdefault("cpu", []).extend(a for a, _ in cpu.run(steps))
        for key, (t, eager) in rows.items():
            with torchtpu.eager_mode(eager), path(key[1]):
                times.setdefault(key, []).extend(a for a, _ in t.run(steps))
    c = statistics.median(times["cpu"])
    print(f"GPT training step, torch CPU eager {c * 1e3:.2f} ms")
    print("| mode | fused attention ms | math path ms | fused / math |")
    print("|---|---:|---:|---:|")
    for mode in MODES:
        a, b = (statistics.median(times[(mode, k)]) for k in ("fused", "math"))
        print(
            f"| {mode} | {a * 1e3:.2f} ({a / c:.2f}x CPU) | {b * 1e3:.2f} ({b / c:.2f}x) | "
            f"{a / b:.2f} |"
        )


def alone(n: int = 30) -> None:
    q, k, v = (torch.randn(8, 4, 32, 32, device="tpu", requires_grad=True) for _ in range(3))
    g = torch.randn(8, 4, 32, 32, device="tpu")
    print("\nattention [8, 4, 32, 32] causal, forward + backward, ms")
    for kind in ("fused", "math"):
        for eager in ("strict", "fused"):
            ts = []
            with path(kind), torchtpu.eager_mode(eager):
                for i in range(n + 5):
                    t0 = time.perf_counter()
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    torch.autograd.grad(o, (q, k, v), g)[0].cpu()
                    if i >= 5:
                        ts.append(time.perf_counter() - t0)
            print(f"{kind} op, {eager}: {statistics.median(ts) * 1e3:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    training(args.rounds, args.steps)
    alone()


if __name__ == "__main__":
    main()
