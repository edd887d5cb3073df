"""Demo: train a small GPT on the `tpu` device and compare with CPU.

make demo            # or: python examples/train_gpt.py --steps 40 --mode fused
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torchtpu
from models import GPT, copy_task_batch, train_losses


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--mode", default="strict", choices=["strict", "debug", "fused"])
    args = ap.parse_args()

    gen = torch.Generator().manual_seed(0)
    batches = [copy_task_batch(gen, 8, 32, 64) for _ in range(4)]
    torchtpu.eager_mode(args.mode)
    print(f"device: {torch.tpu.get_device_name()}  eager mode: {torchtpu.get_eager_mode()}")

    t0 = time.perf_counter()
    tpu = train_losses(GPT, batches, "tpu", args.steps)
    t_tpu = time.perf_counter() - t0
    cpu = train_losses(GPT, batches, "cpu", args.steps)
    for i in range(0, args.steps, max(1, args.steps // 10)):
        print(f"step {i:3d}  loss tpu {tpu[i]:.5f}  cpu {cpu[i]:.5f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(tpu, cpu))
    print(
        f"final loss {tpu[-1]:.4f} (from {tpu[0]:.4f}); max relative diff vs CPU {worst:.2e}; "
        f"{t_tpu:.1f}s on tpu"
    )
    torchtpu.metrics_report()
    if worst > 1e-3 or not tpu[-1] < tpu[0]:
        sys.exit("demo failed: tpu training diverged from CPU")


if __name__ == "__main__":
    main()
