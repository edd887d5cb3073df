"""Distributed benchmark: DDP and FSDP2 GPT steps at 1, 2 and 4 ranks on this machine
(torchrun on loopback). Usage: python bench/dist.py [--steps 10] [--ranks 1 2 4]."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python" / "dist"))
from launch import torchrun

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--mode", default="strict")
    args = ap.parse_args()
    print("| wrapper | ranks | step ms | in collectives | bytes/step (measured) | analytic | "
          "host-copy bytes/step | ns per host byte |")
    print("|---|---|---|---|---|---|---|---|")
    for wrapper in ("ddp", "fsdp"):
        for n in args.ranks:
            r = torchrun(str(HERE / "dist_step.py"), n, env={"TORCHTPU_EAGER": args.mode},
                         args=(wrapper, args.steps), timeout=900)
            line = next((ln for ln in r.output.splitlines() if ln.startswith("RESULT ")), None)
            if r.returncode or line is None:
                print(f"| {wrapper} | {n} | failed: {r.output[-300:]!r} |")
                continue
            d = json.loads(line[7:])
            print(f"| {wrapper} | {n} | {d['step_ms']} | {d['collective_share']:.0%} | "
                  f"{d['bytes_per_step']} | {d['analytic_bytes']} | "
                  f"{d['host_copy_bytes_per_step']} | {d['ns_per_host_byte']} |", flush=True)


if __name__ == "__main__":
    main()
